"""``airflow-spot``: the command line.

``airflow-spot simulate TRACE_OR_DIR... --work 48h --deadline 60h --policy uniform_progress``
answers "what would this deadline cost on this pool's history?" before a run.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import sys
import time
from pathlib import Path

from airflow_spot import bundled
from airflow_spot.durations import parse_hours
from airflow_spot.exceptions import ConfigError
from airflow_spot.policy.model import REFERENCE_ON_DEMAND_PRICE, REFERENCE_SPOT_PRICE


def _hours_arg(field: str):
    def conv(text: str) -> float:
        try:
            return parse_hours(text, field)
        except ConfigError as e:
            raise argparse.ArgumentTypeError(str(e)) from e

    return conv


# the library's field names, as the command line spells them
FLAGS = {
    "work_s": "--work",
    "deadline_s": "--deadline",
    "changeover_s": "--changeover",
    "spot_price": "--spot-price",
    "on_demand_price": "--on-demand-price",
    "tick_s": "--gap",
    "polarity": "--polarity",
    "nodes": "--nodes",
    "policy": "--policy",
    "probe_hold_s": "--probe-hold",
    "observe": "--observe",
    "acquire": "--acquire",
    "acquire_s": "--acquire",
    "acquire_median": "--acquire-median",
    "reserved": "--reserved",
    "partial_end": "--partial-end",
    "reserved_first": "--reserved-first",
    "kind": "TRACE_OR_DIR",
}


def _in_flags(e: ConfigError) -> str:
    """The error as a command-line user reads it: flags, not the library's field names."""
    field = FLAGS.get(e.field, e.field)
    text = str(e).partition(": ")[2]
    text = re.sub(r"polarity='(\w+)'(.*?) or '(\w+)'", r"--polarity \1\2 or \3", text)
    text = re.sub(r"polarity='(\w+)'", r"--polarity \1", text)
    text = re.sub(r"(\d+(?:\.\d+)?) h = \d+", r"\1h", text)  # seconds are for the library
    return f"{field}: {text}"


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="airflow-spot",
        description="airflow-spot's command line: what would a deadline cost on this spot "
        "market's history, and which policy should run it?",
    )
    sub = ap.add_subparsers(dest="command", required=True)
    sim = sub.add_parser("simulate", help="replay policies on spot traces and compare their cost")
    sim.add_argument(
        "traces",
        nargs="+",
        metavar="TRACE_OR_DIR",
        help="trace files or folders of traces, or bundled:NAME for a sample shipped with the "
        f"package ({', '.join(bundled.names())})",
    )
    sim.add_argument(
        "--polarity", choices=["available", "unavailable"], help="what 1 means in JSON 0/1 traces"
    )
    sim.add_argument(
        "--nodes",
        type=int,
        help="the gang's size, for instance-count traces: up when the count reaches it; every "
        "node billed, a partial gang's wait for capacity billed for the nodes it held",
    )
    sim.add_argument(
        "--acquire",
        type=_hours_arg("--acquire"),
        help="time to get the gang's on-demand nodes (e.g. 20m): fixed, or the p95 of a "
        "log-normal draw with --acquire-median; the safety net keeps it in its margin",
    )
    sim.add_argument(
        "--acquire-median",
        type=_hours_arg("--acquire-median"),
        help="draw the acquisition time per tick (log-normal with this median, --acquire as p95)",
    )
    sim.add_argument(
        "--reserved",
        type=_hours_arg("--reserved"),
        help="a reserved fallback pool (capacity reservation) that brings the gang up in this "
        "time (e.g. 5m): an on-demand launch escalates to it when the open pool is late; the "
        "safety net then keeps only this",
    )
    sim.add_argument(
        "--reserved-first",
        action="store_true",
        help="every on-demand launch takes the reserved pool first (Karpenter's reserved "
        "capacity, preset karpenter-reserved), not only when the open pool is late",
    )
    sim.add_argument(
        "--atomic",
        action="store_true",
        help="gang provisioning is all-or-nothing (no partial gang held while a request waits)",
    )
    sim.add_argument(
        "--partial-end",
        type=_hours_arg("--partial-end"),
        help="a partial gang is ended this long after each launch (e.g. 15s: the Kubernetes "
        "backend on Karpenter, which says when fewer than N nodes can come), not held all tick",
    )
    sim.add_argument(
        "--capacity-check",
        action="store_true",
        help="probe with a free N-node check that sees the market (no placeholder nodes "
        "billed): a bound, as no autoscaler offers it for spot nodes that scale from zero",
    )
    sim.add_argument("--gap", type=_hours_arg("--gap"), help="resample to this tick (e.g. 600s)")
    sim.add_argument(
        "--work",
        type=_hours_arg("--work"),
        default=48.0,
        help="compute the job needs (default 48h)",
    )
    sim.add_argument(
        "--deadline",
        type=_hours_arg("--deadline"),
        action="append",
        help="from the job's start; repeat for several (default 60h)",
    )
    sim.add_argument(
        "--changeover",
        type=_hours_arg("--changeover"),
        action="append",
        help="lost on every launch; repeat for several (default 0.2h)",
    )
    sim.add_argument(
        "--spot-price",
        type=float,
        default=REFERENCE_SPOT_PRICE,
        help=f"per hour (default {REFERENCE_SPOT_PRICE}, p3.2xlarge)",
    )
    sim.add_argument(
        "--on-demand-price",
        type=float,
        help="default: the traces' own on-demand price with --trace-prices, else 3.06",
    )
    sim.add_argument(
        "--trace-prices",
        action="store_true",
        help="bill spot (and on-demand, where the trace has it) at the trace's own prices",
    )
    sim.add_argument(
        "--policy",
        action="append",
        help="repeat; default: greedy, uniform_progress, deadline_aware, omniscient",
    )
    sim.add_argument(
        "--window", type=_hours_arg("--window"), help="cut each trace into random windows this long"
    )
    sim.add_argument(
        "--windows", type=int, default=300, help="how many random windows per trace (with --window)"
    )
    sim.add_argument(
        "--observe",
        choices=["cluster", "oracle"],
        default="cluster",
        help="what a policy sees of spot: 'cluster' (default: only through the job's own spot "
        "attempt, its spot request and its probes, as on a real cluster; returns to spot are "
        "make-before-break) or 'oracle' (the paper's model: spot's true state at every look)",
    )
    sim.add_argument(
        "--probe-hold",
        type=_hours_arg("--probe-hold"),
        help="how long capacity a probe found and the job did not use is billed, at the spot "
        "price (default: one changeover); e.g. 10m",
    )
    sim.add_argument("--seed", type=int, default=0)
    sim.add_argument("--workers", type=int)
    sim.add_argument(
        "--json", type=Path, help="write one row per trace, policy, deadline and changeover"
    )
    sim.add_argument("--plot", type=Path, help="draw mean cost per policy per deadline (PNG)")
    sim.add_argument("--quiet", action="store_true", help="no progress bar")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "simulate":
            return _simulate(args)
    except ConfigError as e:  # TraceFormatError is a ConfigError; other errors keep a traceback
        print(f"airflow-spot: error: {_in_flags(e)}", file=sys.stderr)
        return 2
    return 1


def _simulate(args: argparse.Namespace) -> int:
    from airflow_spot.simulate.counts import check_kinds
    from airflow_spot.simulate.report import format_table, plot_costs
    from airflow_spot.simulate.sweep import Setting, random_windows, summarise, sweep
    from airflow_spot.simulate.traces import load_traces

    if args.windows < 1:
        raise ConfigError("--windows", f"must be at least 1, got {args.windows}")
    gap_s = args.gap * 3600 if args.gap else None
    # timestamped CSVs are binned at --gap directly; tick files are resampled by a whole factor
    traces = load_traces(args.traces, polarity=args.polarity, nodes=args.nodes, gap_s=gap_s)
    check_kinds(traces)
    if gap_s:
        try:
            traces = [t.resample(gap_s) if abs(t.gap_s - gap_s) > 1e-9 else t for t in traces]
        except ValueError as e:
            raise ConfigError("--gap", str(e)) from e
    if len({t.gap_s for t in traces}) > 1:
        raise ConfigError(
            "traces",
            f"they have different ticks ({sorted({t.gap_s for t in traces})} s); "
            "pass --gap to put them on one",
        )
    if args.window:
        length = int(round(args.window * 3600 / traces[0].gap_s))
        short = [t for t in traces if len(t) < length]
        if short:
            raise ConfigError(
                "--window",
                f"{args.window:g} h is longer than {len(short)} trace(s), e.g. {short[0].name} "
                f"({len(short[0]) * short[0].gap_s / 3600:g} h)",
            )
        traces = [
            w
            for i, t in enumerate(traces)
            for w in random_windows(t, args.windows, length, args.seed + i)
        ]
    span_h = min(len(t) for t in traces) * traces[0].gap_s / 3600
    longest = max(args.deadline or [60.0])
    if longest > span_h + 1e-9:
        raise ConfigError(
            "--deadline",
            f"{longest:g} h is longer than the shortest trace or window ({span_h:g} h): the "
            "simulator would count the time after its end as spot down; give a longer "
            "--window or a shorter deadline",
        )
    if args.trace_prices:
        unpriced = [t.name for t in traces if t.prices is None]
        if unpriced:
            print(
                f"airflow-spot: {len(unpriced)} of {len(traces)} traces carry no spot prices "
                f"(e.g. {unpriced[0]}); they are billed at --spot-price ${args.spot_price}/h",
                file=sys.stderr,
            )
    if args.plot is not None and importlib.util.find_spec("matplotlib") is None:
        raise ConfigError(
            "--plot",
            "needs matplotlib: pip install matplotlib (or drop --plot; --json keeps the rows)",
        )
    for name in ("json", "plot"):  # before minutes of sweeping, not after
        out = getattr(args, name)
        if out is not None and not (out.parent.is_dir() and os.access(out.parent, os.W_OK)):
            raise ConfigError(
                f"--{name}", f"cannot write {out}: {out.parent} is not a writable folder"
            )
    on_demand = _on_demand_price(args, traces)
    policies = args.policy or ["greedy", "uniform_progress", "deadline_aware", "omniscient"]
    gang, nodes, margin = _gang(args, traces[0].gap_s)
    settings = [
        Setting(args.work, dl, co, args.spot_price, on_demand, nodes, margin)
        for dl in (args.deadline or [60.0])
        for co in (args.changeover or [0.2])
    ]
    for s in settings:
        job = s.job(traces[0].gap_s)  # validate every job before the sweep starts
        if "omniscient" in policies:
            for name, v in (("--changeover", job.changeover_s), ("--work", job.work_s)):
                if abs(v - round(v)) > 1e-6:
                    raise ConfigError(name, f"omniscient needs whole seconds, got {v:g} s")
    t0 = time.perf_counter()
    progress = None if args.quiet or not sys.stderr.isatty() else _progress_bar
    rows = sweep(
        traces,
        policies,
        settings,
        use_trace_prices=args.trace_prices,
        observe=args.observe,
        probe_hold_s=None if args.probe_hold is None else args.probe_hold * 3600.0,
        workers=args.workers,
        progress=progress,
        gang=gang,
    )
    elapsed = time.perf_counter() - t0
    print(format_table(summarise(rows)))
    print(
        f"{len(traces)} traces x {len(policies)} policies x {len(settings)} settings, "
        f"observe={args.observe}, in {elapsed:.1f} s"
    )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=None))
        print(f"wrote {len(rows)} rows to {args.json}")
    if args.plot:
        plot_costs(summarise(rows), args.plot)
        print(f"wrote {args.plot}")
    return 0


def _gang(args: argparse.Namespace, gap_s: float) -> tuple:
    """The gang's market side, its size and the acquisition margin the safety net keeps
    (``(None, 1, 0.0)``: no gang, today's replay)."""
    from airflow_spot.simulate.gang import Acquire, Gang

    nodes = args.nodes or 1
    if args.acquire_median is not None and args.acquire is None:
        raise ConfigError("--acquire-median", "needs --acquire (the p95 of the draw)")
    acquire = None
    if args.acquire:
        median = None if args.acquire_median is None else args.acquire_median * 3600.0
        acquire = Acquire(args.acquire * 3600.0, median, seed=args.seed)
    reserved = None if args.reserved is None else args.reserved * 3600.0
    if args.reserved_first and reserved is None:
        raise ConfigError("--reserved-first", "needs --reserved (the reserved pool's time)")
    if reserved is not None and acquire is None:
        raise ConfigError(
            "--reserved", "needs --acquire (the open pool's time the reserved pool stands behind)"
        )
    end = None if args.partial_end is None else args.partial_end * 3600.0
    if end is not None and args.atomic:
        raise ConfigError("--partial-end", "an --atomic gang holds no partial gang: drop one")
    if nodes == 1 and acquire is None and not (args.atomic or args.capacity_check):
        return None, 1, 0.0
    gang = Gang(partial=not args.atomic, probe="check" if args.capacity_check else "placeholders",
                acquire=acquire, reserved_s=reserved, partial_end_s=end,
                reserved_first=args.reserved_first)  # fmt: skip
    return gang, nodes, gang.margin_s(gap_s)


def _on_demand_price(args: argparse.Namespace, traces: list) -> float:
    """--on-demand-price, else (with --trace-prices) the traces' own, else $3.06/h."""
    if args.on_demand_price is not None:
        return float(args.on_demand_price)
    if not args.trace_prices:
        return REFERENCE_ON_DEMAND_PRICE
    own = {t.on_demand_price for t in traces if t.on_demand_price is not None}
    if len(own) > 1:
        raise ConfigError(
            "--on-demand-price",
            f"the traces give different on-demand prices {sorted(own)}; "
            "pass --on-demand-price or simulate them separately",
        )
    if not own:
        print(
            "airflow-spot: the traces carry no on-demand price; billing on-demand at $3.06/h "
            "(pass --on-demand-price)",
            file=sys.stderr,
        )
        return REFERENCE_ON_DEMAND_PRICE
    return own.pop()


def _progress_bar(done: int, total: int) -> None:
    width = 30
    fill = int(width * done / total)
    sys.stderr.write(f"\r[{'#' * fill}{'.' * (width - fill)}] {done}/{total}")
    if done == total:
        sys.stderr.write("\n")
    sys.stderr.flush()


if __name__ == "__main__":
    raise SystemExit(main())
