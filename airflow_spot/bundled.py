"""Trace samples shipped with the package, named ``bundled:<name>`` in a LocalBackend's
``trace`` and on the command line (``airflow-spot simulate bundled:cant-be-late/us-west-2a_v100_1``).
Standard library only: the operator's import stays light."""

from __future__ import annotations

from pathlib import Path

PREFIX = "bundled:"
ROOT = Path(__file__).resolve().parent / "data" / "traces"


def resolve(name: str) -> str:
    """The file or folder a ``bundled:<name>`` stands for; any other name unchanged."""
    if not name.startswith(PREFIX):
        return name
    return str(ROOT / name.removeprefix(PREFIX))


def names() -> list[str]:
    """The bundled traces, as ``bundled:<name>``: folders of windows, and single trace files
    (not the price and reference-result samples beside them)."""
    out = []
    for path in sorted(ROOT.rglob("*")):
        if path.is_dir() and any(f.suffix == ".json" for f in path.iterdir()):
            if all(f.stem.isdigit() for f in path.iterdir() if f.suffix == ".json"):
                out.append(PREFIX + path.relative_to(ROOT).as_posix())
        elif (
            path.suffix in (".json", ".csv")
            and not path.stem.isdigit()
            and not any(w in path.stem for w in ("price", "result"))
        ):
            out.append(PREFIX + path.relative_to(ROOT).as_posix())
    return out
