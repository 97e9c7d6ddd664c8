"""Files an attempt's folder holds, written atomically (the supervisor and the backend both)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def write_json(path: Path, doc: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, path)


def write_lease(path: Path, until: float) -> None:
    """The attempt's lease: it stops by itself after wall time ``until``."""
    write_json(path, {"until": until})
