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

    def is_trace(path: Path) -> bool:
        if path.is_dir():  # a folder of windows
            windows = list(path.glob("*.json"))
            return bool(windows) and all(f.stem.isdigit() for f in windows)
        return (
            path.suffix in (".json", ".csv")
            and not path.stem.isdigit()
            and not any(w in path.stem for w in ("price", "result"))
        )

    return [PREFIX + p.relative_to(ROOT).as_posix() for p in sorted(ROOT.rglob("*")) if is_trace(p)]
