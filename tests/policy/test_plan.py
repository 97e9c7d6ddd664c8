"""The semi-Markov availability model and the dynamic-programming plan behind deadline_aware."""

from __future__ import annotations

import math
import random
import time

import numpy as np
import pytest

from airflow_spot.exceptions import InvalidJobSpec
from airflow_spot.policy import HOUR, Capacity, Decision, JobSpec, Observation, get_policy
from airflow_spot.policy.base import Policy
from airflow_spot.policy.deadline_aware import DeadlineAware
from airflow_spot.policy.hazard import EDGES, HazardModel, fit, prior, runs
from airflow_spot.policy.plan import _solve, load, save, solve
from airflow_spot.simulate import Trace, replay

# a market whose young runs end far more often than old ones (as in the real traces)
MODEL = HazardModel(
    up=(0.35, 0.25, 0.2, 0.15, 0.1, 0.08, 0.05, 0.04, 0.03, 0.02, 0.02, 0.015, 0.01, 0.01),
    down=(0.4, 0.3, 0.2, 0.15, 0.1, 0.08, 0.06, 0.05, 0.04, 0.03, 0.02, 0.02, 0.015, 0.01),
    source="test",
)


# a market where a spot run after a short one is short too (the contexts of hazard.py)
FLICKER = HazardModel(
    up=MODEL.up,
    down=MODEL.down,
    source="test-context",
    context=(
        MODEL.down,  # down after a long outage, last spot run long
        MODEL.down,  # ... last spot run short
        (0.8, 0.6, *MODEL.down[2:]),  # down after a short outage (flicker), last spot run long
        (0.8, 0.6, *MODEL.down[2:]),  # ... short
        (0.1, 0.08, 0.05, *MODEL.up[3:]),  # up after a long spot run, last outage long
        (0.1, 0.08, 0.05, *MODEL.up[3:]),  # ... last outage short
        (0.3, 0.95, *MODEL.up[2:]),  # up after a short spot run: most last two intervals
        (0.3, 0.95, *MODEL.up[2:]),
    ),
)


def generate(model: HazardModel, n: int, rng: random.Random, up: bool = True) -> list[bool]:
    """A sequence drawn from the model itself (the first run counts as seen whole)."""
    out, b, length = [], 0, 0
    last: dict[bool, float | None] = {True: None, False: None}
    for _ in range(n):
        out.append(up)
        length += 1
        k = model.context_of(last[True], last[False])
        if rng.random() < model.hazard(up, b, k):
            last[up] = length * model.tick_s
            up, b, length = not up, 0, 0
        elif rng.random() < model.advance(b):
            b += 1
    return out


class PlanOnly(Policy):
    """Follows the plan and nothing else (no floor, no settle)."""

    name = "test_plan_only"

    def __init__(self, model: HazardModel) -> None:
        self.model = model

    def choose(self, job: JobSpec, obs: Observation) -> Decision:
        plan = solve(
            self.model,
            job.tick_s,
            job.changeover_s,
            job.spot_price,
            job.on_demand_price,
            job.slack_s,
            int(job.deadline_s // job.tick_s),
        )
        left = job.deadline_s - obs.now
        slack = left - (job.work_s - obs.done_s)
        up = bool(obs.spot_available)
        cheap = plan.cheap(
            int(left // job.tick_s),
            plan.state(obs.capacity.value, obs.changeover_left_s),
            up,
            self.model.context_of(obs.last_up_s, obs.last_down_s) * len(self.model.edges)
            + self.model.bucket(obs.spot_age_s),
            int(slack // plan.unit_s),
        )
        if cheap:
            return Decision(Capacity.SPOT if up else Capacity.NONE, "spot_up")
        return Decision(Capacity.ON_DEMAND, "od_only")


def test_runs_and_fit_recover_the_hazards() -> None:
    """Runs are split and censored correctly; fitting a long sample of the model recovers its
    hazards for young runs (where the data is)."""
    assert runs([1, 1, 0, 1]) == [(True, 2, True), (False, 1, True), (True, 1, False)]
    rng = random.Random(3)
    seqs = [generate(MODEL, 20_000, rng) for _ in range(4)]
    fitted = fit(seqs)
    for b in range(5):
        assert fitted.up[b] == pytest.approx(MODEL.up[b], abs=0.03)
        assert fitted.down[b] == pytest.approx(MODEL.down[b], abs=0.03)
    assert fitted.counts["up_runs"] > 1000


def test_fit_recovers_the_context_hazards() -> None:
    """On a market where short spot runs follow short ones, the fitted context hazards find
    it: a spot run two intervals old ends far more often after a short run than after a
    long one, and the contexts are read from the last runs seen whole."""
    rng = random.Random(4)
    fitted = fit([generate(FLICKER, 20_000, rng) for _ in range(4)])
    assert fitted.contexts == 4
    after_short = fitted.context_of(1200.0, None)  # last spot run 2 intervals: short
    after_long = fitted.context_of(3 * 600.0, 600.0)  # last spot run long, last outage short
    assert (after_short, after_long) == (2, 1) and fitted.context_of(None, None) == 0
    assert fitted.hazard(True, 1, after_short) == pytest.approx(0.95, abs=0.05)
    assert fitted.hazard(True, 1, after_long) == pytest.approx(0.08, abs=0.03)
    assert fitted.hazard(False, 0, 1) == pytest.approx(0.8, abs=0.05)  # outage after a blip
    plain = fit([generate(FLICKER, 5_000, rng)], context=False)
    assert plain.contexts == 1 and plain.context_of(1200.0, 600.0) == 0


def test_context_plan_beats_the_plain_plan_on_a_flickering_market() -> None:
    """Where short spot runs come in streaks, the plan that knows the context stops paying a
    changeover for every two-interval run, and is cheaper than the plan that does not (6 %
    on this market)."""
    job = JobSpec(work_s=24 * HOUR, deadline_s=28 * HOUR, changeover_s=0.4 * HOUR)
    rng = random.Random(6)
    traces = [Trace("m", 600.0, np.array(generate(FLICKER, 200, rng))) for _ in range(200)]
    plain = HazardModel(FLICKER.up, FLICKER.down, source="plain")
    fitted_plain = fit([generate(FLICKER, 20_000, rng) for _ in range(2)], context=False)
    with_ctx = [replay(PlanOnly(FLICKER), t, job, observe="oracle") for t in traces]
    without = [replay(PlanOnly(fitted_plain), t, job, observe="oracle") for t in traces]
    assert plain.contexts == 1 and all(r.met for r in with_ctx + without)
    assert np.mean([r.cost for r in with_ctx]) < 0.97 * np.mean([r.cost for r in without])


def test_shipped_priors_load_and_reject_unknown_names() -> None:
    """Every shipped prior loads; an unknown prior names the choices."""
    for name in ("default", "aws-p3", "gcp-h100", "us-west-2a"):
        m = prior(name)
        assert len(m.up) == len(EDGES) and m.up[0] > m.up[-1]  # young runs end more often
        # in every family a spot run after a short one ends young more often
        assert m.hazard(True, 0, m.context_of(600.0, None)) > m.hazard(True, 0, 0)
    with pytest.raises(ValueError, match="unknown availability prior 'nope'; choose one of"):
        prior("nope")


def test_model_for_a_coarser_tick_compounds_hazards() -> None:
    """Per-interval hazards compound when the decision interval doubles."""
    m2 = MODEL.for_tick(1200.0)
    assert m2.up[0] == pytest.approx(1 - (1 - MODEL.up[0]) ** 2)
    f2 = FLICKER.for_tick(1200.0)
    assert f2.hazard(True, 0, 2) == pytest.approx(1 - (1 - 0.3) ** 2) and f2.short_s == 1200.0
    assert m2.bucket(2400.0) == m2.edges.index(2) if 2 in m2.edges else True
    assert MODEL.for_tick(600.0) is MODEL


def test_plan_expected_cost_matches_simulation() -> None:
    """The plan's expected cost equals the mean cost of following it in the simulator on
    markets drawn from its own model (the DP and the replay's tick rules agree)."""
    job = JobSpec(work_s=8 * HOUR, deadline_s=12 * HOUR, changeover_s=0.2 * HOUR)
    ticks = int(job.deadline_s // job.tick_s)
    ratio = round(job.spot_price / 3.06, 2)
    plan = _solve(MODEL, 600.0, 12, ratio, int(job.slack_s // 60), ticks, 10.0)
    expected = plan.values[ticks] * 3.06 * job.tick_s / HOUR  # idle, spot up, fresh run
    rng = random.Random(11)
    policy = PlanOnly(MODEL)
    costs = [
        replay(
            policy,
            Trace("m", 600.0, np.array(generate(MODEL, ticks + 2, rng))),
            job,
            observe="oracle",
        ).cost
        for _ in range(1500)
    ]
    sem = np.std(costs) / np.sqrt(len(costs))
    assert abs(np.mean(costs) - expected) < 3.5 * sem + 0.005 * expected


def test_plan_beats_uniform_progress_on_its_own_model() -> None:
    """On markets drawn from the model the plan is cheaper than Uniform Progress, never late."""
    job = JobSpec(work_s=24 * HOUR, deadline_s=32 * HOUR, changeover_s=0.2 * HOUR)
    rng = random.Random(5)
    traces = [Trace("m", 600.0, np.array(generate(MODEL, 200, rng))) for _ in range(150)]
    plan = [replay(PlanOnly(MODEL), t, job, observe="oracle") for t in traces]
    up = [replay(get_policy("uniform_progress"), t, job, observe="oracle") for t in traces]
    assert all(r.met for r in plan)
    assert np.mean([r.cost for r in plan]) < 0.97 * np.mean([r.cost for r in up])


def test_decision_is_a_lookup_well_under_a_millisecond() -> None:
    """After the plan is solved (once per job shape), a decision takes microseconds."""
    policy = DeadlineAware()
    job = JobSpec(work_s=48 * HOUR, deadline_s=60 * HOUR, changeover_s=0.2 * HOUR)
    t0 = time.perf_counter()
    policy.decide(job, Observation(0.0, 0.0, Capacity.NONE, True))
    solve_s = time.perf_counter() - t0
    obs = [
        Observation(i * 60.0, i * 50.0, Capacity.NONE, i % 3 != 0, 0.0, 0, 600.0 * (i % 7))
        for i in range(2000)
    ]
    t0 = time.perf_counter()
    for o in obs * 5:
        policy.decide(job, o)
    per = (time.perf_counter() - t0) / 10_000
    assert per < 1e-3 and solve_s < 30


def test_plan_for_a_long_job_with_short_looks_stays_small() -> None:
    """A job that looks every minute for a week is planned on coarser intervals."""
    job = JobSpec(work_s=100 * HOUR, deadline_s=168 * HOUR, changeover_s=0.1 * HOUR, tick_s=60.0)
    plan, _ = DeadlineAware().plan(job)
    assert plan.max_tau <= 610 and len(plan.bits) < 64_000_000  # 600 intervals, on the grid
    d = DeadlineAware().decide(job, Observation(3600.0, 3000.0, Capacity.NONE, False, 0, 0, 60))
    assert d.capacity is Capacity.NONE and "expected outage" in d.reason


def test_policy_option_picks_the_prior() -> None:
    """``deadline_aware@gcp-h100`` runs on that prior; bad options are named."""
    from airflow_spot.exceptions import UnknownPolicy

    assert get_policy("deadline_aware@gcp-h100").model.source == "gcp-h100"
    with pytest.raises(UnknownPolicy, match="unknown availability prior 'mars'"):
        get_policy("deadline_aware@mars")
    with pytest.raises(UnknownPolicy, match="takes no option"):
        get_policy("greedy@fast")


def test_plans_cache_on_disk_and_reject_damaged_files(tmp_path, monkeypatch) -> None:
    """With a cache directory a plan solved once is read back identical by later processes;
    a damaged file is solved again and rewritten."""
    import airflow_spot.policy.plan as plan_mod

    args = (MODEL, 600.0, 720.0, 0.9731, 3.06, 4 * HOUR, 72)
    first = solve(*args, cache_dir=str(tmp_path))
    (path,) = tmp_path.glob("plan-*.bin")
    again = load(path)
    assert again == first
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(ValueError):
        load(path)
    assert solve(*args, cache_dir=str(tmp_path)) == first  # this process keeps it in memory
    plan_mod._stored.cache_clear()  # a later process
    assert solve(*args, cache_dir=str(tmp_path)) == first and load(path) == first
    save(first, tmp_path / "copy.bin")
    assert load(tmp_path / "copy.bin").cheap(10, 0, True, 0, 30) == first.cheap(10, 0, True, 0, 30)


def test_a_live_job_whose_shape_drifts_solves_few_plans(tmp_path, monkeypatch) -> None:
    """The operator's job shape changes at every look (measured throughput and changeover, a
    shrinking guard on the deadline); the policy must not solve and store a plan for each.
    Before, every look of a job longer than 600 looks solved a new plan (4 s and 51 MB on
    disk for the README's 60 h job)."""
    import airflow_spot.policy.plan as plan_mod

    solved = []
    real = plan_mod._solve.__wrapped__
    monkeypatch.setattr(plan_mod, "_solve", lambda *key: solved.append(key) or real(*key))
    policy = get_policy("deadline_aware", plan_cache=str(tmp_path))
    rng = random.Random(3)
    decisions = []
    for i in range(60):
        guard = 0.6 * HOUR * (1 - i / 60) + 120  # the guard shrinks as the work gets done
        job = JobSpec(
            work_s=10 * HOUR * (1 + rng.uniform(-0.01, 0.01)),  # measured rate
            deadline_s=14 * HOUR - guard,
            changeover_s=2 ** (round(16 * math.log2(600 + rng.uniform(-20, 20))) / 16),
            tick_s=60.0,  # 840 looks to the deadline: planned on coarser intervals
        )
        obs = Observation(i * 300.0, i * 250.0, Capacity.NONE, i % 4 != 0, 0.0, 0, 300.0)
        decisions.append(policy.decide(job, obs).capacity)
    assert 1 <= len(solved) <= 4, [k[1:] for k in solved]
    assert len(list(tmp_path.glob("plan-*.bin"))) <= len(solved)
    assert Capacity.NONE in decisions  # it did plan
    # a new process (nothing in memory) finds the stored plan instead of solving again
    solved.clear()
    plan_mod._stored.cache_clear()
    get_policy("deadline_aware", plan_cache=str(tmp_path)).decide(job, obs)
    assert solved == []


def test_plan_cache_keeps_the_newest_files(tmp_path) -> None:
    """The cache directory does not grow without bound: least recently used plans go."""
    import os

    import airflow_spot.policy.plan as plan_mod

    for i in range(6):
        f = tmp_path / f"plan-{i}.bin"
        f.write_bytes(b"x" * 1000)
        os.utime(f, (1000 + i, 1000 + i))
    plan_mod.prune(tmp_path, keep=tmp_path / "plan-0.bin", max_bytes=2500, max_files=64)
    assert sorted(f.name for f in tmp_path.iterdir()) == ["plan-0.bin", "plan-4.bin", "plan-5.bin"]
    plan_mod.prune(tmp_path, keep=tmp_path / "plan-5.bin", max_bytes=10**9, max_files=1)
    assert sorted(f.name for f in tmp_path.iterdir()) == ["plan-5.bin"]


@pytest.mark.parametrize("left_h", [0.1, 0.5, 0.9, 3.0])
def test_on_demand_with_little_work_left_is_not_left_for_spot(left_h: float) -> None:
    """A plan coarser than the look (a 6.1 h changeover plans on ~1.5 h intervals) counts
    whole intervals left. Rounding the time left and the slack down apart made a job with
    less work left than the dropped part of an interval look done, so it left a running
    on-demand instance with 0.1 h of work for spot and paid a 6.1 h changeover (found by a
    PyTorch run: ~15 h of switching). Work left is now rounded up against whole intervals."""
    job = JobSpec(48 * HOUR, 80 * HOUR, changeover_s=6.1 * HOUR, tick_s=HOUR)
    policy = DeadlineAware()
    plan, _ = policy.plan(job)
    assert plan.tick_s > job.tick_s  # the condition the bug needed
    obs = Observation(
        now=62.26 * HOUR,
        done_s=(48 - left_h) * HOUR,
        capacity=Capacity.ON_DEMAND,
        spot_available=True,
        spot_age_s=1.03 * HOUR,
        last_up_s=3 * HOUR,
        last_down_s=2 * HOUR,
    )
    d = policy.decide(job, obs)
    assert (d.capacity, d.rule) == (Capacity.ON_DEMAND, "dp_keep_od"), d.reason


def test_a_make_before_break_plan_returns_where_a_lost_changeover_would_miss() -> None:
    """A plan of make-before-break returns (on-demand trains on while spot launches, both
    billed) takes spot back while the slack covers one changeover (kept for a fallback), where
    a break-before-make return loses one on the way and needs two; once launching, it goes on;
    spot at nearly on-demand's price is not worth the overlap's double bill."""
    args = (MODEL, 600.0, 12, 0.32, 60, 40, 10.0)
    bbm, mbb = _solve(*args), _solve(*args, overlap=True)
    assert (bbm.states, mbb.states) == (1 + 2 * len(bbm.rro), 2 * len(mbb.rro) + len(mbb.rro))
    old = len(MODEL.edges) - 1  # spot up in a long run: it rarely ends
    od = bbm.state("on_demand", 0.0)
    for slack in (12, 18, 23):  # one changeover (12 units) kept, not two
        assert not bbm.cheap(30, od, True, old, slack)  # a return would leave < 12
        assert mbb.cheap(30, od, True, old, slack)  # no progress lost: return
    assert bbm.cheap(30, od, True, old, 24) and not mbb.cheap(30, od, True, old, 11)
    slack = 18
    launching = mbb.state("spot", 600.0, overlap=True)
    assert launching == 2 * len(mbb.rro) + 1 and mbb.state("spot", 600.0) == 2
    assert mbb.cheap(30, launching, True, old, slack)
    pricey = _solve(MODEL, 600.0, 12, 0.99, 60, 40, 10.0, overlap=True)
    assert not pricey.cheap(30, pricey.state("on_demand", 0.0), True, 0, slack)
    # a plan's values: make-before-break only adds a way to return, so it never costs more
    assert all(m <= b + 1e-9 for m, b in zip(mbb.values, bbm.values, strict=True))


def test_the_replay_tells_the_policy_how_it_returns() -> None:
    """The job a policy sees says whether a return is make-before-break: under the cluster's
    observation it is (as the operator's), under the paper's oracle and cluster-bbm not."""
    seen: dict[str, set[bool]] = {}

    class Record(Policy):
        name = "test_record_returns"

        def choose(self, job: JobSpec, obs: Observation) -> Decision:
            seen.setdefault(mode, set()).add(job.make_before_break)
            return Decision(Capacity.ON_DEMAND, "od")

    job = JobSpec(work_s=2 * HOUR, deadline_s=4 * HOUR, changeover_s=0.2 * HOUR)
    trace = Trace("m", 600.0, np.ones(30, dtype=bool))
    for mode in ("cluster", "oracle", "cluster-bbm"):
        replay(Record(), trace, job, observe=mode)
    assert seen == {"cluster": {True}, "oracle": {False}, "cluster-bbm": {False}}
    with pytest.raises(InvalidJobSpec, match="make_before_break"):
        JobSpec(work_s=HOUR, deadline_s=2 * HOUR, make_before_break="yes")  # type: ignore[arg-type]
