"""Fit the availability priors of ``deadline_aware`` from whole traces (not windows).

    python benchmarks/fit_priors.py [--traces ../shared/traces] [--out airflow_spot/policy/priors]

Writes one hazard model per family (``aws-p3``, ``gcp-h100``, ``us-west-2a``) and
``default`` (aws-p3 + gcp-h100 + the 14.8 days of the us-west-2a trace after the last tick
of any of the paper's windows: never a tick the benchmark scores). Each file holds only the
fitted hazards per age bucket and the number of runs they came from.

For gangs (a job of more than one node): ``gang``, fitted on the polarized AWS p3 4-node
count traces (up when all 4 nodes are there: shorter runs than one node's), and for each
zone ``gang-without-<zone>``, fitted on the other zones only, which ``benchmarks/gang_grid.py``
replays on that zone's windows (so no window is scored by a prior fitted on it).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import family_sequences  # noqa: E402

from airflow_spot.policy.hazard import fit  # noqa: E402
from airflow_spot.simulate.counts import load_count_folder  # noqa: E402

GANG_NODES = 4  # the count traces' cluster size

FITS = {
    "aws-p3": ["aws-p3"],
    "gcp-h100": ["gcp-h100"],
    "us-west-2a": ["us-west-2a"],
    "default": ["aws-p3", "gcp-h100", "us-west-2a-later"],
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--out", default=str(Path(__file__).resolve().parents[1] / "airflow_spot/policy/priors")
    )
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    seqs = {
        f: family_sequences(f) for f in ("aws-p3", "gcp-h100", "us-west-2a", "us-west-2a-later")
    }
    for name, fams in FITS.items():
        model = fit([s for f in fams for s in seqs[f]], source="+".join(fams))
        (out / f"{name}.json").write_text(json.dumps(model.to_json(), indent=1) + "\n")
        print(
            f"{name:>10}: {model.counts['up_runs']} up runs, {model.counts['down_runs']} outages; "
            f"expected spot run from start {model.expected_left_s(True, 0) / 3600:.1f} h, "
            f"outage {model.expected_left_s(False, 0) / 3600:.1f} h, "
            f"outage already 6 h old {model.expected_left_s(False, 6 * 3600) / 3600:.1f} h more"
        )
    gang_priors(out)


def gang_priors(out: Path) -> None:
    """``gang`` (every zone of the 4-node traces) and ``gang-without-<zone>`` (the others)."""
    from common import ROOT

    counts = load_count_folder(ROOT / "aws-p3-4node")
    fits = {"gang": counts} | {
        f"gang-without-{c.name}": [o for o in counts if o is not c] for c in counts
    }
    for name, used in fits.items():
        model = fit(
            [(c.counts >= GANG_NODES).tolist() for c in used],
            tick_s=used[0].gap_s,
            source="aws-p3-4node polarized: " + "+".join(c.name for c in used),
        )
        (out / f"{name}.json").write_text(json.dumps(model.to_json(), indent=1) + "\n")
        print(
            f"{name:>10}: {model.counts['up_runs']} runs of all {GANG_NODES} nodes; expected "
            f"from start {model.expected_left_s(True, 0) / 3600:.1f} h, outage "
            f"{model.expected_left_s(False, 0) / 3600:.1f} h"
        )


if __name__ == "__main__":
    main()
