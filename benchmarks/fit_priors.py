"""Fit the availability priors of ``deadline_aware`` from whole traces (not windows).

    python benchmarks/fit_priors.py [--traces ../shared/traces] [--out airflow_spot/policy/priors]

Writes one hazard model per family (``aws-p3``, ``gcp-h100``, ``us-west-2a``) and
``default`` (aws-p3 + gcp-h100 + the 14.8 days of the us-west-2a trace after the last tick
of any of the paper's windows: never a tick the benchmark scores). Each file holds only the
fitted hazards per age bucket and the number of runs they came from.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import family_sequences  # noqa: E402

from airflow_spot.policy.hazard import fit  # noqa: E402

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


if __name__ == "__main__":
    main()
