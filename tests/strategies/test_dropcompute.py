"""The DropCompute rule: weights, calibration (Algorithm 2), drop-rate thresholds, parsing."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tailtrain.errors import UsageError
from tailtrain.sim.allreduce.timing import stop_rule
from tailtrain.strategies.base import ArrivalColumns, Context, StepStats
from tailtrain.strategies.dropcompute import (
    DropCompute,
    counted,
    elapsed_before,
    expected_drop_rate,
    finishes,
    larger_batch,
    may_start,
    threshold_for_drop_rate,
)
from tailtrain.strategies.registry import parse_strategy
from tailtrain.theory.dropcompute import empirical_threshold


def columns(units) -> ArrivalColumns:
    n = len(units)
    zeros = np.zeros(n)
    return ArrivalColumns.of(np.arange(n), np.zeros(n, int), zeros, zeros, units=np.asarray(units))


def stats(step: int, times: np.ndarray, comm: float = 0.1) -> StepStats:
    done = np.count_nonzero(~np.isnan(times), axis=1)
    arrivals = columns(done / times.shape[1])
    return StepStats(
        step=step,
        version=step + 1,
        time=0.0,
        k=times.shape[0],
        arrivals=arrivals,
        micro_batch_times=times,
        comm_time=comm,
    )


# ---- select: who counts with which weight -------------------------------------------------
unit_lists = st.lists(st.sampled_from([0.0, 0.25, 0.5, 0.75, 1.0]), min_size=1, max_size=12)


@settings(max_examples=80, deadline=None)
@given(unit_lists, st.sampled_from(["m", "computed"]), st.randoms(use_true_random=False))
def test_weights_follow_completed_micro_batches_and_ignore_arrival_order(units, divide_by, rnd):
    rule = parse_strategy(f"dropcompute:threshold=1,divide-by={divide_by}")
    state = rule.init(Context(n_workers=len(units)))
    cols = columns(units)
    weights = rule.select(state, cols).now.over(cols.keys)
    u = np.array(units)
    expected = u / len(u) if divide_by == "m" else (u / u.sum() if u.sum() else 0 * u)
    np.testing.assert_allclose(weights, expected, rtol=1e-12)
    assert (weights[u == 0] == 0).all()
    order = list(range(len(units)))
    rnd.shuffle(order)
    cols = columns(u[order])
    shuffled = rule.select(state, cols).now.over(cols.keys)
    np.testing.assert_allclose(shuffled, weights[order])


def test_weights_are_unnormalised_with_the_divisor_apart():
    """A runtime reduces [sum_n w_n g_n, sum_n w_n]: divide-by=m fixes the divisor at N,
    divide-by=computed leaves it to the reduced sum of the weights."""
    cols = columns([1.0, 0.5, 0.0])
    for divide_by, total in (("m", 3), ("computed", None)):
        rule = parse_strategy(f"dropcompute:threshold=1,divide-by={divide_by}")
        now = rule.select(rule.init(Context(n_workers=3)), cols).now
        assert now.weight.tolist() == [1.0, 0.5, 0.0] and now.total == total


# ---- calibration ----------------------------------------------------------------------------
def run_rule(rule: DropCompute, rounds: int, rng: np.random.Generator, n=5, m=4):
    state = rule.init(Context(n_workers=n))
    plans, samples = [], []
    for step in range(rounds):
        plan = rule.plan(state)
        times = rng.exponential(1.0, (n, m))
        stops = stop_rule(times, plan.threshold, plan.preempt)
        observed = np.where(np.arange(m) < stops.done[:, None], times, np.nan)
        samples.append(observed)
        plans.append(plan)
        state = rule.adapt(state, stats(step, observed))
    return state, plans, samples


def test_auto_threshold_is_algorithm_2_on_the_calibration_rounds():
    rule = parse_strategy("dropcompute:calibrate=6")
    state, plans, samples = run_rule(rule, 9, np.random.default_rng(0))
    assert all(math.isinf(p.threshold) for p in plans[:6])
    tau = empirical_threshold(np.stack(samples[:6]), np.full(6, 0.1)).threshold
    assert state.tau == tau and [p.threshold for p in plans[6:]] == [tau] * 3
    assert state.window_times == ()


def test_a_round_without_a_known_comm_time_counts_the_windows_mean():
    """A runtime learns a round's T^c one round late: its first round has none (NaN)."""
    rule = parse_strategy("dropcompute:calibrate=3")
    state = rule.init(Context(n_workers=5))
    samples = [np.random.default_rng(s).exponential(1.0, (5, 4)) for s in range(3)]
    for step, (t, comm) in enumerate(zip(samples, [math.nan, 0.2, 0.4], strict=True)):
        state = rule.adapt(state, stats(step, t, comm))
    expected = empirical_threshold(np.stack(samples), np.array([0.3, 0.2, 0.4])).threshold
    assert state.tau == expected


def test_recalibration_replaces_the_threshold_from_new_samples():
    rule = parse_strategy("dropcompute:calibrate=3,recalibrate=5")
    state, plans, samples = run_rule(rule, 9, np.random.default_rng(1))
    assert [math.isinf(p.threshold) for p in plans] == [i % 5 < 3 for i in range(9)]
    second = empirical_threshold(np.stack(samples[5:8]), np.full(3, 0.1)).threshold
    assert state.tau == second != plans[3].threshold


# ---- a changing world (train --on-rank-loss shrink) ---------------------------------------
def test_a_calibrated_tau_is_algorithm_2_again_on_the_live_ranks_samples():
    # rank 3 is a persistent straggler: without it T_i, and so tau*, changes (App. C.1)
    rule = parse_strategy("dropcompute:calibrate=6")
    rng = np.random.default_rng(3)
    state = rule.init(Context(n_workers=4))
    slow = np.array([[1.0], [1.0], [1.0], [3.0]])
    samples = [rng.exponential(1.0, (4, 4)) * slow for _ in range(6)]
    for step, t in enumerate(samples):
        state = rule.adapt(state, stats(step, t))
    t = np.stack(samples)
    assert state.tau == empirical_threshold(t, np.full(6, 0.1)).threshold
    live = (0, 1, 2)
    after = rule.follow_world(state, Context(n_workers=3, live=live))
    want = empirical_threshold(t[:, [0, 1, 2]], np.full(6, 0.1)).threshold
    assert after.tau == want != state.tau and after.n_workers == 3
    # the rank comes back: tau* is the whole world's again, from the same samples
    back = rule.follow_world(after, Context(n_workers=4))
    assert back.tau == state.tau and back.n_workers == 4
    # a drop rate picks its tau on the live ranks' samples likewise
    rate = parse_strategy("dropcompute:drop-rate=0.2,calibrate=6")
    s = rate.init(Context(n_workers=4))
    for step, x in enumerate(samples):
        s = rate.adapt(s, stats(step, x))
    moved = rate.follow_world(s, Context(n_workers=2, live=(1, 3)))
    assert moved.tau == threshold_for_drop_rate(t[:, [1, 3]], 0.2, True)


def test_a_calibration_under_way_goes_on_with_the_live_ranks_columns():
    rule = parse_strategy("dropcompute:calibrate=4")
    rng = np.random.default_rng(4)
    state = rule.init(Context(n_workers=3))
    whole = [rng.exponential(1.0, (3, 2)) for _ in range(2)]
    for step, t in enumerate(whole):
        state = rule.adapt(state, stats(step, t))
    state = rule.follow_world(state, Context(n_workers=2, live=(0, 2)))
    assert rule.plan(state).threshold == math.inf  # still calibrating
    smaller = [rng.exponential(1.0, (2, 2)) for _ in range(2)]
    for step, t in enumerate(smaller, start=2):
        state = rule.adapt(state, stats(step, t))
    t = np.stack([w[[0, 2]] for w in whole] + smaller)
    assert state.tau == empirical_threshold(t, np.full(4, 0.1)).threshold
    # rank 1, back before the next calibration, is measured by it; not by this one
    assert rule.follow_world(state, Context(n_workers=3)).tau == state.tau


def test_a_rank_back_during_calibration_is_left_out_of_its_window():
    rule = parse_strategy("dropcompute:calibrate=3")
    state = rule.init(Context(n_workers=2, live=(0, 2)))
    first = np.ones((2, 2))
    state = rule.adapt(state, stats(0, first))
    state = rule.follow_world(state, Context(n_workers=3, live=(0, 1, 2)))
    later = [np.full((3, 2), 2.0), np.full((3, 2), 3.0)]
    for step, t in enumerate(later, start=1):
        state = rule.adapt(state, stats(step, t))
    t = np.stack([first] + [x[[0, 2]] for x in later])
    assert state.tau == empirical_threshold(t, np.full(3, 0.1)).threshold
    assert state.sample_ranks == (0, 2)


def test_larger_batch_compensation_refuses_a_changing_world_with_its_reason():
    rule = parse_strategy("dropcompute:threshold=auto,compensate=larger-batch")
    assert rule.follow_world(rule.init(Context(n_workers=3)), Context(n_workers=2)) is None
    assert "larger-batch" in rule.follow_refusal()


def test_plan_and_adapt_are_pure():
    rule = parse_strategy("dropcompute:calibrate=2")
    state = rule.init(Context(n_workers=2))
    times = np.ones((2, 3))
    after = rule.adapt(state, stats(0, times))
    assert state.step == 0 and state.window_times == () and after.step == 1
    assert rule.plan(after) == rule.plan(after)
    again = rule.adapt(state, stats(0, times))
    assert again.step == after.step and np.array_equal(again.window_times[0], times)


def test_extra_steps_scale_is_one_over_the_measured_kept_share():
    rule = parse_strategy("dropcompute:threshold=1.5,compensate=extra-steps")
    state = rule.init(Context(n_workers=2))
    assert rule.plan(state).iteration_scale == 1.0
    times = np.array([[1.0, np.nan, np.nan], [1.0, 1.0, 1.0]])
    state = rule.adapt(state, stats(0, times))
    assert rule.plan(state).iteration_scale == pytest.approx(6 / 4)


# ---- thresholds from a drop rate, larger batches --------------------------------------------
@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 4),
    st.integers(1, 5),
    st.integers(1, 6),
    st.floats(0.0, 0.95),
    st.booleans(),
    st.integers(0, 2**31),
)
def test_drop_rate_threshold_is_the_least_tau_meeting_the_rate(i, n, m, rate, preempt, seed):
    t = np.random.default_rng(seed).exponential(1.0, (i, n, m))
    tau = threshold_for_drop_rate(t, rate, preempt)
    assert expected_drop_rate(t, tau, preempt) <= rate + 1e-12
    assert expected_drop_rate(t, np.nextafter(tau, -math.inf), preempt) > rate


def test_drop_rate_matches_the_stop_rule():
    t = np.random.default_rng(3).exponential(1.0, (4, 6, 5))
    for preempt in (True, False):
        done = stop_rule(t, 3.0, preempt).done
        assert expected_drop_rate(t, 3.0, preempt) == pytest.approx(1 - done.mean() / 5)


@pytest.mark.parametrize(
    ("m", "rate", "grown"),
    [(12, 0.0, 12), (12, 0.1, 14), (10, 0.5, 20), (10, 0.9, 20), (4, 0.2, 5)],
)
def test_larger_batch_is_m_over_kept_share_capped_at_twice(m, rate, grown):
    assert larger_batch(m, rate) == grown


def test_larger_batch_needs_micro_batches():
    rule = parse_strategy("dropcompute:compensate=larger-batch")
    assert rule.micro_batch_capacity(6) == 12
    with pytest.raises(UsageError, match="--micro-batches"):
        rule.micro_batch_capacity(None)
    assert parse_strategy("dropcompute").micro_batch_capacity(6) == 6


# ---- parsing ----------------------------------------------------------------------------------
def test_defaults_and_options():
    rule = parse_strategy("dropcompute")
    assert rule.threshold is None and rule.drop_rate is None and rule.calibrate == 20
    assert rule.topology == "allreduce" and rule.preempt and rule.divide_by == "m"
    fixed = parse_strategy("dropcompute:threshold=2.5,stop=between,compensate=resample")
    assert fixed.threshold == 2.5 and not fixed.preempt and rule.plan(rule.init(Context(2))).k == 2
    assert fixed.plan(fixed.init(Context(2))).requeue_dropped
    assert math.isinf(parse_strategy("dropcompute:threshold=inf").threshold)
    assert replace(fixed, text="").describe() == "dropcompute"


@pytest.mark.parametrize(
    "text",
    [
        "dropcompute:threshold=1,drop-rate=0.1",
        "dropcompute:drop-rate=1",
        "dropcompute:drop-rate=-0.1",
        "dropcompute:threshold=0",
        "dropcompute:threshold=soon",
        "dropcompute:calibrate=5,recalibrate=5",
        "dropcompute:threshold=2,recalibrate=50",
        "dropcompute:divide-by=n",
        "dropcompute:compensate=more",
        "dropcompute:stop=never",
        "dropcompute:period=2",
    ],
)
def test_bad_specs_are_usage_errors(text):
    with pytest.raises(UsageError):
        parse_strategy(text)


@settings(max_examples=200, deadline=None)
@given(
    times=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=8),
    tau=st.floats(0.0, 4.0),
    preempt=st.booleans(),
)
def test_the_vector_convention_is_the_scalar_one_unit_by_unit(times, tau, preempt):
    """counted (the simulator's, over all draws) is may_start at T^(u-1) and finishes at T^(u),
    the runtime's and the loop's scalar checks between units: one convention, two forms."""
    cumulative = np.cumsum(times)
    before = elapsed_before(cumulative)
    scalar = [
        bool(may_start(float(b), tau, preempt)) and bool(finishes(float(a), tau, preempt))
        for b, a in zip(before, cumulative, strict=True)
    ]
    assert counted(cumulative, tau, preempt).tolist() == scalar
