"""Files an attempt's folder holds, written atomically (the supervisor and the backend both),
readable by this user only: folders 0700, files 0600 (an attempt's folder is nobody else's
business, and its log may show what the training process prints)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

PRIVATE_FILE = 0o600
PRIVATE_DIR = 0o700


def private_dirs(path: Path) -> None:
    """Create ``path`` and its missing parents as 0700 folders (``mkdir(parents=True)`` would
    give the parents the umask's mode); ``path`` itself is made 0700 if it existed."""
    missing = []
    folder = path
    while not folder.exists():
        missing.append(folder)
        folder = folder.parent
    for folder in reversed(missing):
        try:
            folder.mkdir(mode=PRIVATE_DIR)
        except FileExistsError:  # another worker made it meanwhile: theirs
            continue
        os.chmod(folder, PRIVATE_DIR)  # mkdir's mode is masked by the umask
    os.chmod(path, PRIVATE_DIR)


def write_private(path: Path, text: str) -> None:
    """Write ``path`` as a 0600 file, through a temporary file renamed into place."""
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, PRIVATE_FILE)
    with os.fdopen(fd, "w") as fh:
        os.fchmod(fh.fileno(), PRIVATE_FILE)  # a temporary file left by an older writer
        fh.write(text)
    os.replace(tmp, path)


def write_json(path: Path, doc: dict[str, Any]) -> None:
    write_private(path, json.dumps(doc))


def write_lease(path: Path, until: float) -> None:
    """The attempt's lease: it stops by itself after wall time ``until``."""
    write_json(path, {"until": until})
