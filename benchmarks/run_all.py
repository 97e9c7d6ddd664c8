"""`make bench`: every benchmark script, one after another, printing their figures."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SCRIPTS = [
    "observe_grid.py",
    "sim_speed.py",
    "policy_grid.py",
    "generalise.py",
    "paper_gap.py",
    "crosscheck.py",
    "multi_zone.py",
    "gang_grid.py",
    "import_cost.py",
    "checkpoint_io.py",
    "bad_inputs.py",
    "triggerer_load.py",
    "chaos.py",
]

if __name__ == "__main__":
    rc = 0
    for name in SCRIPTS:
        path = HERE / name
        if not path.exists():
            continue
        print(f"\n=== {name} ===", flush=True)
        rc |= subprocess.call([sys.executable, str(path), *sys.argv[1:]])
    sys.exit(rc)
