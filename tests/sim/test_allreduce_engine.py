"""The allreduce simulator: sync equivalence, DropCompute timing against the theory, Algorithm 2."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tailtrain.core.scenario import Scenario
from tailtrain.delays import DelayProcess
from tailtrain.sim.allreduce.learner import RoundLearner
from tailtrain.sim.allreduce.timing import stop_rule
from tailtrain.sim.run import simulate
from tailtrain.strategies.base import ArrivalColumns, Context
from tailtrain.strategies.dropcompute import DropCompute, expected_drop_rate, larger_batch
from tailtrain.strategies.registry import parse_strategy
from tailtrain.tasks import parse_partition, parse_task
from tailtrain.theory.dropcompute import (
    analytic_speedup,
    empirical_speedup,
    exact_speedup,
    expected_completed,
)
from tailtrain.theory.families import ClosedForm

NOISE = "const:value=0.5+dropcompute-noise:scale=0.5"  # DropCompute App. B.1 with mu = 0.5 s


@dataclass(frozen=True)
class Recording(DropCompute):
    """DropCompute that keeps every StepStats it is given (to see what the rule measured)."""

    seen: list = field(default_factory=list, compare=False, repr=False)

    def adapt(self, state, stats):
        self.seen.append(stats)
        return super().adapt(state, stats)


def recording(text: str) -> Recording:
    base = parse_strategy(text)
    return Recording(**{f.name: getattr(base, f.name) for f in fields(base)})


def same_run(a, b) -> None:
    assert a.column("loss").tolist() == b.column("loss").tolist()
    assert a.column("time").tolist() == b.column("time").tolist()
    assert a.evals == b.evals


# ---- synchronous SGD ---------------------------------------------------------------------
@pytest.mark.parametrize("task", ["logreg", "hyperplane:dim=8"])
def test_infinite_threshold_is_parameter_server_sync(task):
    """tau = inf through the allreduce engine gives the PS engine's sync model, bit for bit."""
    scenario = Scenario(task=task, workers=4, delay="const:value=1", iterations=6, eval_every=3)
    ps = simulate(scenario, parse_strategy("sync:mode=psi"), 3)  # sync on a server
    ar = simulate(scenario, parse_strategy("dropcompute:threshold=inf"), 3)
    same_run(ps, ar)
    same_run(simulate(scenario, parse_strategy("sync"), 3), ar)  # sync is the allreduce


def test_infinite_threshold_is_sync_with_random_delays_up_to_summation_order():
    """The PS engine sums gradients in arrival order, so only rounding may differ."""
    scenario = Scenario(task="logreg", workers=4, delay="exp:rate=1", iterations=6, eval_every=3)
    ps = simulate(scenario, parse_strategy("sync:mode=psi"), 3)
    ar = simulate(scenario, parse_strategy("dropcompute:threshold=inf"), 3)
    assert ps.column("time").tolist() == ar.column("time").tolist()
    np.testing.assert_allclose(ps.column("loss"), ar.column("loss"), rtol=1e-6)
    for a, b in zip(ps.evals, ar.evals, strict=True):
        assert a == pytest.approx(b, rel=1e-5)


SYNC_ALIKE = [
    "dropcompute:calibrate=2",
    "dropcompute:drop-rate=0,calibrate=2,stop=between",
    "dropcompute:calibrate=2,recalibrate=4,divide-by=computed",
    "dropcompute:threshold=100,compensate=extra-steps",
    "dropcompute:threshold=100,compensate=resample",
    "dropcompute:calibrate=2,compensate=larger-batch",
    "local-sgd:period=1",
    "local-sgd:period=1,calibrate=2,threshold=auto",
]


@pytest.mark.parametrize("text", SYNC_ALIKE)
def test_without_delay_variance_every_strategy_is_sync(text):
    scenario = Scenario(
        task="logreg",
        workers=3,
        delay="const:value=0.25",
        micro_batches=3,
        comm_time="0.1",
        iterations=6,
        eval_every=3,
    )
    sync = simulate(scenario, parse_strategy("dropcompute:threshold=inf"), 1)
    record = simulate(scenario, parse_strategy(text), 1)
    same_run(sync, record)
    assert record.summary["drop_rate"] == 0.0


def test_local_sgd_period_one_is_sync_with_random_delays():
    scenario = Scenario(
        task="hyperplane:dim=8", workers=4, delay="exp:rate=1", micro_batches=2, iterations=5
    )
    sync = simulate(scenario, parse_strategy("dropcompute:threshold=inf"), 2)
    same_run(sync, simulate(scenario, parse_strategy("local-sgd:period=1"), 2))


# ---- gradients of completed micro-batches only ---------------------------------------------
class CountingTask:
    """Wraps a task and records the shape of every batched gradient call."""

    def __init__(self, task) -> None:
        self.task, self.calls = task, []

    def __getattr__(self, name):
        return getattr(self.task, name)

    def grads(self, theta, indices):
        self.calls.append(("shared", indices.shape))
        return self.task.grads(theta, indices)

    def grads_multi(self, thetas, indices):
        self.calls.append(("multi", indices.shape))
        return self.task.grads_multi(thetas, indices)


def learner_for(task, n: int) -> RoundLearner:
    partition = parse_partition("iid").assign(task, n, np.random.default_rng(0))
    return RoundLearner(task, partition, 0.1, 0, n)


@pytest.mark.parametrize("divide_by", ["m", "computed"])
def test_update_is_the_weighted_mean_of_completed_micro_batches(divide_by):
    """DropCompute Eq. (1) with g_n = (1/M) sum of computed g_n^(m), from one batched call."""
    task = CountingTask(parse_task("hyperplane:dim=8,batch=4", seed=0))
    n, m = 3, 4
    learner = learner_for(task, n)
    theta0 = learner.theta.clone()
    done = np.array([4, 0, 2])
    batches = learner.batches(0, m)
    work = learner.work(batches, done, m, 1, 1.0)
    rule = parse_strategy(f"dropcompute:threshold=1,divide-by={divide_by}")
    state = rule.init(Context(n_workers=n))
    zeros = np.zeros(n)
    arrivals = ArrivalColumns.of(np.arange(n), np.zeros(n, int), zeros, zeros, units=done / m)
    learner.apply(rule.select(state, arrivals), arrivals.keys, work, 1.0)
    assert task.calls == [("shared", (int(done.sum()), 4))]
    per = [task.task.grads(theta0, batches[w, : done[w]])[1] for w in range(n) if done[w]]
    sums = [g.sum(0) for g in per]
    per_worker = (sums[0] / m + sums[1] / m) / n
    per_count = (sums[0] + sums[1]) / done.sum()
    step = per_worker if divide_by == "m" else per_count
    torch.testing.assert_close(learner.theta, theta0 - 0.1 * step, rtol=1e-6, atol=1e-7)


def test_resample_puts_dropped_micro_batches_first_in_the_next_round():
    task = parse_task("logreg", seed=0)
    learner = learner_for(task, 2)
    first = learner.batches(0, 3)
    learner.requeue(first, np.array([3, 1]))
    second = learner.batches(1, 3)
    np.testing.assert_array_equal(second[1, :2], first[1, 1:])
    fresh = learner_for(task, 2).batches(1, 3)
    np.testing.assert_array_equal(second[0], fresh[0])
    np.testing.assert_array_equal(second[1, 2], fresh[1, 0])


# ---- the stop rule ---------------------------------------------------------------------------
def reference_stops(times: np.ndarray, tau: float, preempt: bool, cuttable: bool = True):
    """One worker and one micro-batch at a time: Algorithm 1 as a plain loop. A unit that
    cannot be cut, found running at tau, runs to its end and does not count."""
    done, compute = [], []
    for row in times:
        elapsed, count = 0.0, 0
        for t in row:
            if preempt and elapsed + t >= tau:
                if not cuttable and elapsed < tau:  # it started, so it ends
                    elapsed += t
                    break
                elapsed = tau
                break
            if not preempt and elapsed > tau:
                break
            elapsed += t
            count += 1
        done.append(count)
        compute.append(min(elapsed, tau) if preempt and (cuttable or tau <= 0) else elapsed)
    return np.array(done), np.array(compute)


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 6),
    st.integers(1, 7),
    st.floats(0.0, 6.0),
    st.booleans(),
    st.integers(0, 2**31),
    st.booleans(),
)
def test_stop_rule_matches_the_loop(n, m, tau, preempt, seed, cuttable):
    rng = np.random.default_rng(seed)
    times = rng.choice([0.0, 0.5, 1.0, rng.exponential()], size=(n, m))
    stops = stop_rule(times, tau, preempt, cuttable)
    done, compute = reference_stops(times, tau, preempt, cuttable)
    np.testing.assert_array_equal(stops.done, done)
    np.testing.assert_allclose(stops.compute, compute, rtol=1e-12, atol=1e-12)


# ---- timing only against tailtrain.theory (DropCompute Eqs. 5, 6, 11) --------------------------
MU, SIGMA, M, N, ROUNDS, COMM = 1.0, 0.2, 12, 32, 400, 0.3


def timing_run(tau: float, stop: str):
    scenario = Scenario(
        task="none",
        workers=N,
        micro_batches=M,
        delay=f"normal:mean={MU},std={SIGMA}",
        comm_time=str(COMM),
        iterations=ROUNDS,
    )
    record = simulate(scenario, parse_strategy(f"dropcompute:threshold={tau},stop={stop}"), 1)
    completed = np.array([np.mean(r["completed"]) for r in record.steps])
    durations = np.diff(np.concatenate([[0.0], record.column("time")]))
    return record, completed, durations


def within(samples: np.ndarray, expected: float) -> None:
    """Mean of i.i.d. per-round values within 4 standard errors of ``expected``."""
    error = samples.std(ddof=1) / math.sqrt(samples.size)
    tolerance = 4 * error + 1e-9 * abs(expected)  # the floor covers quadrature round-off
    assert abs(samples.mean() - expected) <= tolerance, (samples.mean(), expected, error)


@pytest.mark.parametrize("tau", [11.5, 13.0])
def test_preempting_dropcompute_matches_eq5_and_exact_iteration_time(tau):
    """Normal micro-batches make Eq. (5) exact; E[min(tau, T)] + T^c is exact_speedup's."""
    _, completed, durations = timing_run(tau, "preempt")
    within(completed, float(expected_completed(tau, MU, SIGMA, M)))
    laws = [ClosedForm("normal", 0.0, MU, SIGMA).sum_of(j) for j in range(1, M + 1)]
    within(durations, exact_speedup(laws, N, tau, COMM).iteration_time)


def test_effective_speedup_matches_eq11_given_the_empirical_iteration_time():
    """tau = 11.5 lies below T = max of 32 N(12, 12 * 0.04) almost surely: min(tau, T) = tau."""
    record, completed, _ = timing_run(11.5, "preempt")
    compute = record.column("sync_time") - COMM
    predicted = analytic_speedup(11.5, MU, SIGMA, N, M, COMM, iteration_time=compute.mean())
    per_round = completed / M * (compute.mean() + COMM) / (11.5 + COMM)
    within(per_round, float(predicted))
    assert record.summary["effective_speedup"] == pytest.approx(per_round.mean(), rel=1e-12)


def test_a_unit_that_cannot_be_cut_runs_to_its_end_uncounted():
    """A worker with units 0.4, 0.4, 0.4 and tau = 1: preempting a sleep it leaves at 1.0, a
    computation's third unit runs on to 1.2; neither counts it, and checking between units
    counts it at the same 1.2."""
    times = np.array([[0.4, 0.4, 0.4], [0.3, 0.3, 0.3]])
    sleeps, computes = stop_rule(times, 1.0, True), stop_rule(times, 1.0, True, cuttable=False)
    between = stop_rule(times, 1.0, False)
    assert sleeps.done.tolist() == computes.done.tolist() == [2, 3]
    assert sleeps.compute.tolist() == pytest.approx([1.0, 0.9])
    assert computes.compute.tolist() == between.compute.tolist() == pytest.approx([1.2, 0.9])
    assert between.done.tolist() == [3, 3]


def test_checking_between_micro_batches_shifts_eq5_by_one_and_costs_time():
    """E[C] = 1 + sum_{j<M} P(T^(j) <= tau), and the micro-batch in flight delays the round."""
    _, completed, durations = timing_run(11.5, "between")
    within(completed, 1.0 + float(expected_completed(11.5, MU, SIGMA, M - 1)))
    _, _, preempted = timing_run(11.5, "preempt")
    assert np.all(durations >= preempted - 1e-12)
    assert durations.mean() > preempted.mean() + 4 * durations.std(ddof=1) / math.sqrt(ROUNDS)


# ---- Algorithm 2 and calibration --------------------------------------------------------------
def test_automatic_threshold_is_within_two_percent_of_the_best_on_a_fine_grid():
    rule = recording("dropcompute:threshold=auto,calibrate=30")
    scenario = Scenario(
        task="none", workers=64, micro_batches=12, delay=NOISE, comm_time="0.2", iterations=32
    )
    record = simulate(scenario, rule, 0)
    thresholds = record.column("threshold")
    assert np.isinf(thresholds[:30]).all() and np.isfinite(thresholds[30:]).all()
    tau = thresholds[-1]
    t = np.stack([s.micro_batch_times for s in rule.seen[:30]])
    comm = np.array([s.comm_time for s in rule.seen[:30]])
    assert t.shape == (30, 64, 12) and np.isfinite(t).all()
    totals = np.cumsum(t, axis=2)
    grid = np.linspace(totals.min(), totals[:, :, -1].max() * 1.001, 20_001)
    curve, _ = empirical_speedup(t, comm, grid)
    at_tau, _ = empirical_speedup(t, comm, [tau])
    assert curve.max() > 1.05  # the noise leaves something to gain
    assert at_tau[0] >= 0.98 * curve.max()


def test_recalibration_measures_undropped_rounds_every_r_rounds():
    scenario = Scenario(task="none", workers=8, micro_batches=4, delay=NOISE, iterations=14)
    text = "dropcompute:calibrate=2,recalibrate=5"
    record = simulate(scenario, parse_strategy(text), 0)
    measuring = np.isinf(record.column("threshold"))
    assert measuring.tolist() == [i % 5 < 2 for i in range(14)]
    assert (record.column("drop_rate")[measuring] == 0).all()


def test_drop_rate_threshold_gives_that_rate_on_the_calibration_samples():
    rule = recording("dropcompute:drop-rate=0.1,calibrate=10")
    scenario = Scenario(task="none", workers=16, micro_batches=12, delay=NOISE, iterations=11)
    record = simulate(scenario, rule, 0)
    t = np.stack([s.micro_batch_times for s in rule.seen[:10]])
    tau = record.steps[-1]["threshold"]
    assert expected_drop_rate(t, tau, True) <= 0.1
    assert expected_drop_rate(t, np.nextafter(tau, 0) - 1e-9, True) > 0.1 - 1 / t.size


# ---- compensation (Sec. 4.5) --------------------------------------------------------------
def test_extra_steps_stretch_the_run_by_the_measured_drop_rate():
    scenario = Scenario(task="none", workers=16, micro_batches=12, delay=NOISE, iterations=40)
    record = simulate(scenario, parse_strategy("dropcompute:threshold=7,compensate=extra-steps"), 0)
    done = sum(sum(r["completed"]) for r in record.steps)
    possible = len(record.steps) * 16 * 12
    assert record.summary["drop_rate"] > 0.02
    assert len(record.steps) >= math.ceil(40 * possible / done - 1e-9)
    assert len(record.steps) > 40


def test_larger_batch_grows_m_by_the_calibrated_drop_rate():
    rule = recording("dropcompute:calibrate=5,compensate=larger-batch")
    scenario = Scenario(task="none", workers=16, micro_batches=6, delay=NOISE, iterations=8)
    record = simulate(scenario, rule, 0)
    t = np.stack([s.micro_batch_times for s in rule.seen[:5]])
    tau = record.steps[-1]["threshold"]
    grown = larger_batch(6, expected_drop_rate(t, tau, True))
    assert record.column("micro_batches").tolist() == [6] * 5 + [grown] * 3
    assert grown > 6
    assert all(len(r["completed"]) == 16 for r in record.steps)


# ---- determinism, budgets and the summary -----------------------------------------------------
def test_same_seed_same_record_and_summary_keys():
    scenario = Scenario(task="logreg", workers=4, delay=NOISE, micro_batches=3, time_budget=12.0)
    text = "dropcompute:calibrate=2,compensate=resample"
    a = simulate(scenario, parse_strategy(text), 5)
    b = simulate(scenario, parse_strategy(text), 5)
    assert a.steps == b.steps and a.evals == b.evals
    assert a.steps[-2]["time"] < 12.0 <= a.steps[-1]["time"]
    for key in ("threshold", "drop_rate", "effective_speedup", "mean_completed"):
        assert key in a.summary
    assert {"step", "time", "k", "lr", "loss", "workers", "staleness"} <= set(a.steps[0])


def test_custom_delays_are_used_as_given():
    """A delay process passed in replaces the scenario's (as in the parameter-server engine)."""
    scenario = Scenario(task="none", workers=3, micro_batches=2, iterations=3)
    process = DelayProcess("const:value=2", None, 0, 3, 2)
    record = simulate(scenario, parse_strategy("dropcompute:threshold=3"), 0, delays=process)
    assert record.column("time").tolist() == [3.0, 6.0, 9.0]
    assert [r["completed"] for r in record.steps] == [[1, 1, 1]] * 3


def test_a_worker_with_nothing_done_joins_with_weight_zero():
    scenario = Scenario(
        task="logreg", workers=2, micro_batches=2, delay="const:value=1", iterations=1
    )
    process = DelayProcess("const:value=1", "linear:step=5", 0, 2, 2)
    record = simulate(scenario, parse_strategy("dropcompute:threshold=2.5"), 0, delays=process)
    row = record.steps[0]
    assert row["completed"] == [2, 0] and row["workers"] == [0] and row["k"] == 1
    assert math.isfinite(row["loss"])


@pytest.mark.parametrize("divide_by", ["m", "computed"])
def test_a_round_that_ran_nothing_makes_no_update_and_says_so(divide_by):
    """Round 1's units are 3 s (a slowdown), above tau = 1.5 s on every worker: Algorithm 1
    stops both before their first micro-batch. No update (the parameters score as before it),
    no measured loss, the row and the summary say so; the rounds around it train."""
    scenario = Scenario(
        task="logreg",
        workers=2,
        iterations=3,
        eval_every=1,
        delay="const:value=1",
        pattern="slowdown:at=1,fraction=1,factor=3,until=2",
    )
    text = f"dropcompute:threshold=1.5,divide-by={divide_by}"
    record = simulate(scenario, parse_strategy(text), 0)
    ran, empty, after = record.steps
    assert empty["completed"] == [0, 0] and empty["k"] == 0 and empty["workers"] == []
    assert empty["empty"] is True and math.isnan(empty["loss"])
    assert "empty" not in ran and "empty" not in after
    assert math.isfinite(ran["loss"]) and math.isfinite(after["loss"])
    losses = [row["train_loss"] for row in record.evals]  # before each round, and at the end
    assert losses[2] == losses[1] != losses[3] and losses[1] != losses[0]
    assert record.summary["empty_steps"] == 1
    # a run in which every round ran something has no such key
    assert (
        "empty_steps"
        not in simulate(scenario, parse_strategy("dropcompute:threshold=4"), 0).summary
    )
