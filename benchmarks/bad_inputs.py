"""Bad inputs: the table of issue 21, each a clear error naming the field, with nothing lost.

    python benchmarks/bad_inputs.py

Runs ``tests/test_bad_inputs.py`` (the table lives there: each row builds its bad input for
real and checks the error's type, its field, its fix, and that the checkpoints and the task's
state that existed before are unchanged), and prints one line per row,
``| input | field named | error (first line) |``, then ``bad inputs: N rows, M clear``.
Exits non-zero unless every row is clear.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEST = "tests/test_bad_inputs.py"

if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.parse_known_args()  # make bench passes its own arguments to every script
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", TEST],
        cwd=ROOT,
        env={**os.environ, "SPOT_BAD_INPUTS_TABLE": "1"},
        capture_output=True,
        text=True,
        check=False,
    )
    table = [
        line for line in proc.stdout.splitlines() if line.startswith(("| ", "|---", "bad inputs:"))
    ]
    print("\n".join(table), flush=True)
    if proc.returncode != 0 or not table:
        print(proc.stdout[-4000:] + proc.stderr[-2000:], file=sys.stderr)
        sys.exit(proc.returncode or 1)
