"""Triggers and their typed events. Import :mod:`airflow_spot.triggers.attempt` only where a
trigger is built (it imports Airflow's trigger base)."""
