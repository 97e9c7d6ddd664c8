"""The operator's arguments: what each must be, checked when the DAG is parsed (literal values)
and again when the task starts (templates and XComArgs, once rendered). Every error names its
field and the fix. The policy registry, the checkpoint stores and the backend protocol are
imported by the checks that need them, when an operator is built: importing the operator's
module (the scheduler and the api-server do, for its extra link) stays cheap."""

from __future__ import annotations

import numbers
import re
from datetime import datetime, timedelta
from typing import Any

from airflow_spot.durations import parse_hours
from airflow_spot.exceptions import ConfigError, finite_number

TEMPLATE_FIELDS = ("command", "checkpoint_uri", "deadline")
PREEMPTION_ACTIONS = ("on_demand", "fail")

# the arguments checked at parse time (and, for partial(), those given to it)
ARGUMENTS = (
    "command",
    "checkpoint_uri",
    "expected_compute",
    "total_steps",
    "deadline",
    "changeover",
    "policy",
    "spot_price",
    "on_demand_price",
    "max_preemptions",
    "on_preemption_budget",
    "max_failures",
    "backend",
    "decision_interval",
    "poll_interval",
    "min_deferral",
    "lease",
    "aws_conn_id",
    "nodes",
    "on_demand_acquire",
)
REQUIRED = {
    "command": "give the training command, e.g. ['python', 'train.py'] or 'python train.py'",
    "checkpoint_uri": "give where checkpoints live: a path, file:///path or s3://bucket/prefix",
    "deadline": "give a deadline: a datetime, a timedelta from the task's start, or '6h'",
}
MIN_DECISION_INTERVAL = timedelta(seconds=0.1)
MIN_POLL_INTERVAL = 0.01
MAX_HOLD_S = 10.0  # a deferred task resumes no sooner (see min_deferral)
MIN_LEASE = timedelta(minutes=5)  # the default lease's floor: a real kubelet refreshes the
# downward-API annotations file about once a minute, so a pod sees a renewal that late


def default_lease(decision_interval: timedelta) -> timedelta:
    """Three decision intervals, and at least :data:`MIN_LEASE`."""
    return max(3 * decision_interval, MIN_LEASE)


def check_arguments(values: dict[str, Any], *, partial: bool = False) -> None:
    """Check the operator's arguments that are present in ``values``, each naming its field.

    Values resolved later (a Jinja template, an ``XComArg``) are checked when the task starts.
    With ``partial`` (``SpotTrainingOperator.partial(...)``), a missing argument may still come
    from ``expand()`` and is not an error.
    """
    v = {k: x for k, x in values.items() if not _later(k, x)}
    for name, fix in REQUIRED.items():
        if name in values and not values[name] and not _later(name, values[name]):
            raise ConfigError(name, fix)
        if not partial and name not in values:
            raise ConfigError(name, fix)
    _check_work(v)
    _check_budgets(v)
    _check_timing(v)
    _check_gang(v)
    if "backend" in v:
        _check_backend(v["backend"])
        _check_location_reach(v["backend"], values.get("checkpoint_uri"))
    if "deadline" in v:
        _check_deadline(v["deadline"], v.get("expected_compute"), v.get("changeover"), v)


def _check_work(v: dict[str, Any]) -> None:
    """What to run and where its checkpoints go: command, location, work, policy."""
    if "command" in v:
        _check_command(v["command"])
    uri = v.get("checkpoint_uri")
    if uri is not None:
        if not isinstance(uri, str):
            raise ConfigError(
                "checkpoint_uri", f"must be a string (path or URI), got {type(uri).__name__}"
            )
        from airflow_spot.checkpoint.stores import validate_uri

        validate_uri(uri)
    if "expected_compute" in v and not _positive_td(v["expected_compute"]):
        raise ConfigError(
            "expected_compute",
            f"must be a positive timedelta (compute the whole job needs), got {v['expected_compute']!r}",
        )
    steps = v.get("total_steps")
    if steps is not None and (not _integer(steps) or steps < 1):
        raise ConfigError("total_steps", f"must be a positive integer or None, got {steps!r}")
    if "changeover" in v and not (
        isinstance(v["changeover"], timedelta) and v["changeover"] >= timedelta(0)
    ):
        raise ConfigError("changeover", f"must be a timedelta >= 0, got {v['changeover']!r}")
    if "policy" in v:
        if not isinstance(v["policy"], str):
            raise ConfigError(
                "policy",
                f"must be a policy name such as 'deadline_aware', got {v['policy']!r}",
            )
        from airflow_spot.policy import get_policy

        get_policy(v["policy"])


def _check_budgets(v: dict[str, Any]) -> None:
    """Budgets and prices."""
    for name in ("max_preemptions", "max_failures"):
        n = v.get(name)
        if n is not None and (not _integer(n) or n < 0):
            raise ConfigError(
                name,
                f"must be an integer >= 0{' or None' if name == 'max_preemptions' else ''}, got {n!r}",
            )
        if name == "max_failures" and name in v and n is None:
            raise ConfigError(name, "must be an integer >= 0, got None")
    if "on_preemption_budget" in v and v["on_preemption_budget"] not in PREEMPTION_ACTIONS:
        raise ConfigError(
            "on_preemption_budget",
            f"must be one of {PREEMPTION_ACTIONS}, got {v['on_preemption_budget']!r}",
        )
    for name in ("spot_price", "on_demand_price"):
        if name not in v:
            continue
        price = v[name]
        if not finite_number(price) or price < 0 or (name == "on_demand_price" and price == 0):
            raise ConfigError(
                name,
                f"must be a price per hour {'> 0' if name == 'on_demand_price' else '>= 0'}, got {price!r}",
            )


def _check_gang(v: dict[str, Any]) -> None:
    """A gang's size (agreeing with the backend's) and its on-demand acquisition time."""
    from airflow_spot.backends.base import RunsGangs

    n, backend = v.get("nodes"), v.get("backend")
    if n is not None and (not _integer(n) or n < 1):
        raise ConfigError("nodes", f"must be an integer >= 1 (the gang's ranks), got {n!r}")
    has = backend.nodes if isinstance(backend, RunsGangs) else 1 if backend == "local" else None
    if n is not None and n > 1 and backend is not None and has is None:
        raise ConfigError(
            "nodes",
            f"{n}: the {type(backend).__name__} runs one process per attempt; run gangs on "
            f"LocalBackend(nodes={n}) or KubernetesBackend(nodes={n}), or leave nodes out",
        )
    if n is not None and has is not None and has != n:
        raise ConfigError(
            "nodes",
            f"{n}, but the backend runs {has} ranks per attempt; make them agree (give the "
            f"backend nodes={n}: LocalBackend(nodes={n}) or KubernetesBackend(nodes={n}), or "
            "leave the operator's nodes out)",
        )
    acquire = v.get("on_demand_acquire")
    if "on_demand_acquire" in v and (not isinstance(acquire, timedelta) or acquire < timedelta(0)):
        raise ConfigError(
            "on_demand_acquire",
            f"must be a timedelta >= 0 (how long the gang's on-demand nodes may take), got {acquire!r}",
        )


def _check_timing(v: dict[str, Any]) -> None:
    """How often to look and decide, and the AWS connection."""
    if "decision_interval" in v:
        di = v["decision_interval"]
        if not isinstance(di, timedelta) or di < MIN_DECISION_INTERVAL:
            raise ConfigError(
                "decision_interval",
                f"must be a timedelta of at least {MIN_DECISION_INTERVAL.total_seconds():g} s "
                f"(how often to decide again), got {di!r}",
            )
    if "poll_interval" in v:
        pi = v["poll_interval"]
        if not finite_number(pi) or pi < MIN_POLL_INTERVAL:
            raise ConfigError(
                "poll_interval",
                f"must be a number of seconds >= {MIN_POLL_INTERVAL:g}, got {pi!r}",
            )
    if "min_deferral" in v:
        md = v["min_deferral"]
        if not isinstance(md, timedelta) or md < timedelta(0):
            raise ConfigError(
                "min_deferral",
                f"must be a timedelta >= 0 (shorter waits stay in the worker), got {md!r}",
            )
    if v.get("lease") is not None:
        lease, poll = v["lease"], v.get("poll_interval", 5.0)
        poll = poll if finite_number(poll) else 5.0
        if not isinstance(lease, timedelta) or lease.total_seconds() < max(1.0, 3 * poll):
            raise ConfigError(
                "lease",
                f"must be a timedelta of at least {max(1.0, 3 * poll):g} s (3 poll_intervals: "
                "how long an attempt trains on with nobody renewing its lease before it "
                f"checkpoints and stops by itself), or None for the default; got {lease!r}",
            )
    conn = v.get("aws_conn_id")
    if conn is not None and (not isinstance(conn, str) or not conn.strip()):
        raise ConfigError(
            "aws_conn_id", f"must be an Airflow connection id (a string) or None, got {conn!r}"
        )


def _check_location_reach(backend: Any, raw_uri: Any) -> None:
    """Attempts that run elsewhere (pods) need a location the worker reaches too."""
    if _runs_on_worker(backend) or not isinstance(raw_uri, str):
        return
    literal = re.split(r"\{[{%#]", raw_uri, maxsplit=1)[0]  # before any template
    if literal and "://" not in raw_uri and not literal.startswith("/"):
        raise ConfigError(
            "checkpoint_uri",
            f"{raw_uri!r} is a relative path: the worker and the pod would read "
            "different places; use s3://bucket/prefix, or an absolute path on a volume "
            "both mount",
        )


def _check_command(cmd: Any) -> None:
    if isinstance(cmd, str):
        import shlex

        try:
            parts = shlex.split(cmd)
        except ValueError as e:
            raise ConfigError(
                "command", f"cannot be split like a shell would ({e}): {cmd!r}"
            ) from None
        if not parts:
            raise ConfigError("command", f"is blank; {REQUIRED['command']}")
        return
    if not isinstance(cmd, (list, tuple)):
        raise ConfigError(
            "command", f"must be a list of strings or a string, got {type(cmd).__name__}"
        )
    for i, part in enumerate(cmd):
        if not isinstance(part, str) or not part:
            raise ConfigError(
                "command",
                f"item {i} is {part!r} ({type(part).__name__}); every item must be a non-empty "
                "string or a number",
            )


def argv_of(command: Any) -> Any:
    """A command list with its numbers as strings (``--steps 100`` rendered natively, or
    built in Python, gives an int); anything else is left for the checks."""
    if isinstance(command, (list, tuple)):
        return [
            str(c) if isinstance(c, numbers.Real) and not isinstance(c, bool) else c
            for c in command
        ]
    return command


def _check_backend(backend: Any) -> None:
    if isinstance(backend, str):
        if backend != "local":
            raise ConfigError(
                "backend",
                f"unknown backend {backend!r}; use 'local', LocalBackend(...) or KubernetesBackend(image=...)",
            )
        return
    if isinstance(backend, type):
        raise ConfigError(
            "backend",
            f"{backend.__name__} is a class: give an instance, e.g. {backend.__name__}(...)",
        )
    from airflow_spot.backends.base import missing_members  # (not at import: DAG parsing)

    missing = missing_members(backend)
    if missing:
        raise ConfigError(
            "backend",
            f"{type(backend).__name__} is not a backend: it lacks {', '.join(missing)} (see "
            "airflow_spot.backends.base.Backend); use 'local', LocalBackend(...), "
            "KubernetesBackend(image=...) or implement the Backend interface",
        )


def _check_deadline(dl: Any, work: Any, changeover: Any, given: dict[str, Any]) -> None:
    """A deadline's type, and its span where it does not depend on the start (parse time)."""
    if isinstance(dl, str):
        dl = parse_deadline(dl)
    if isinstance(dl, datetime):
        if dl.tzinfo is None:
            raise ConfigError(
                "deadline",
                "a datetime deadline must be timezone-aware (e.g. pendulum or tzinfo=timezone.utc)",
            )
        return
    if not isinstance(dl, timedelta):
        raise ConfigError(
            "deadline",
            f"must be a datetime, a timedelta or a string, got {type(dl).__name__}",
        )
    if _positive_td(work) and isinstance(changeover, timedelta):
        check_span(dl, work, changeover)
        if "decision_interval" in given:
            check_decision_interval(given["decision_interval"], dl - work - changeover)


def check_span(span: timedelta, work: timedelta, changeover: timedelta) -> None:
    """The deadline leaves room for the work and one changeover."""
    if span <= timedelta(0) or span < work + changeover:
        raise ConfigError(
            "deadline",
            f"{_h(span)} from the start is shorter than the work ({_h(work)}) plus one "
            f"changeover ({_h(changeover)}); move the deadline later or cut the work",
        )


def check_decision_interval(interval: timedelta, slack: timedelta) -> None:
    """Decide often enough to use the slack: the policy keeps a look's worth of margin, so an
    interval near the slack sends the whole job to on-demand (no error when the slack is 0:
    on-demand is then the only way anyway)."""
    if slack > timedelta(0) and interval > slack / 4:
        raise ConfigError(
            "decision_interval",
            f"{_h(interval)} is more than a quarter of the slack ({_h(slack)} between the work "
            f"plus one changeover and the deadline): the policy could not wait for spot and "
            f"would run on-demand; use at most {(slack / 4).total_seconds():.0f} s (intervals are wall-clock, "
            "also on a LocalBackend with a time_scale)",
        )


def _later(name: str, value: Any) -> bool:
    """Resolved when the task starts: a Jinja template or an XComArg in a templated field
    (Airflow resolves nothing else; an XComArg anywhere else is checked, and refused, now)."""
    from airflow.sdk.definitions._internal.mixins import ResolveMixin

    if name not in TEMPLATE_FIELDS:
        return False
    return _templated(value) or isinstance(value, ResolveMixin)


def _integer(n: Any) -> bool:
    return isinstance(n, numbers.Integral) and not isinstance(n, bool)


def _positive_td(td: Any) -> bool:
    return isinstance(td, timedelta) and td > timedelta(0)


def _templated(value: Any) -> bool:
    return isinstance(value, str) and any(m in value for m in ("{{", "{%", "{#"))


def _h(td: timedelta) -> str:
    secs = td.total_seconds()
    return f"{secs / 3600:.2f} h" if secs >= 360 else f"{secs:g} s"


def parse_deadline(text: str) -> datetime | timedelta:
    try:
        dt = datetime.fromisoformat(text.strip())
    except ValueError:
        pass
    else:
        if dt.tzinfo is None:  # as for a datetime given directly: never guess the zone
            raise ConfigError(
                "deadline",
                f"{text.strip()!r} has no timezone; add one, e.g. '{dt.isoformat()}+00:00'",
            )
        return dt
    if re.fullmatch(r"\s*[0-9.]+\s*", text):  # the CLI reads a bare number as hours; a DAG
        raise ConfigError(  # author may mean seconds: make them say
            "deadline",
            f"{text.strip()!r} has no unit; write e.g. '{text.strip()}h' or '{text.strip()}s'",
        )
    try:
        return timedelta(hours=parse_hours(text, "deadline"))
    except ConfigError:
        raise ConfigError(
            "deadline", f"{text!r} is neither an ISO datetime nor a duration like '6h'"
        ) from None


def _runs_on_worker(backend: Any) -> bool:
    """Whether attempts run on the worker itself (the default ``'local'`` does)."""
    return isinstance(backend, str) or bool(backend.runs_on_worker)


def resolve_deadline(
    deadline: Any,
    started_at: float,
    work: timedelta,
    changeover: timedelta,
    decision_interval: timedelta,
    log: Any,
) -> float:
    """The deadline as wall-clock seconds, once templates are rendered (task start). It must
    leave room for the work; a decision interval too coarse for the slack left only costs
    money, so it is a warning here (a deadline known at parse time was checked then)."""
    dl = parse_deadline(deadline) if isinstance(deadline, str) else deadline
    if isinstance(dl, timedelta):
        span, at = dl, started_at + dl.total_seconds()
    else:
        assert isinstance(dl, datetime)
        at = dl.timestamp()
        if at <= started_at:
            raise ConfigError(
                "deadline", f"{dl.isoformat()} is already in the past; give a later deadline"
            )
        span = timedelta(seconds=at - started_at)
    check_span(span, work, changeover)
    try:
        check_decision_interval(decision_interval, span - work - changeover)
    except ConfigError as e:
        log.warning("%s", e)
    return at


def warn_of_reference_prices(
    node_pools: Any, given: tuple[str, ...], prices: dict[str, float], log: Any
) -> None:
    """On real capacity, say when costs are made up from the reference prices (not given)."""
    priced = bool(node_pools) and all(p.spot_price is not None or p.price_from for p in node_pools)
    missing = [
        f"{name} (${prices[name]}/h)"
        for name in ("spot_price", "on_demand_price")
        if name not in given and not (name == "spot_price" and priced)
    ]
    if missing:
        log.warning(
            "%s not given: costs, savings and the policy's price ratio use the "
            "reference p3.2xlarge prices, not your nodes'. Give the prices of your "
            "instance type (or pools with spot_price / price_from).",
            " and ".join(missing),
        )
