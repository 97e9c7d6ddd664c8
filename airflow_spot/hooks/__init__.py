"""Hooks: clients built lazily over Airflow connections."""
