"""The availability priors shipped with the package: ``<name>.json``, written by
``benchmarks/fit_priors.py`` and read by :func:`airflow_spot.policy.hazard.prior`.

Only file names here (no model is loaded), so a DAG file that names a prior is checked
without paying for it.
"""

from __future__ import annotations

from pathlib import Path

DIR = Path(__file__).resolve().parent
HELD_OUT = "gang-without-"  # fitted without one zone, to score it: the benchmark's, not a choice


def path(name: str) -> Path:
    """The file of prior ``name``; ``ValueError`` naming the choices when there is none."""
    p = DIR / f"{name}.json"
    if not p.is_file():
        names = sorted(q.stem for q in DIR.glob("*.json") if not q.stem.startswith(HELD_OUT))
        held = ""
        if any(DIR.glob(f"{HELD_OUT}*.json")):
            held = f" (and {HELD_OUT}<zone>, the gang benchmark's held-out fits)"
        raise ValueError(
            f"unknown availability prior {name!r}; choose one of {', '.join(names)}{held}"
        )
    return p
