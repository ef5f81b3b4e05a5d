"""The rebalance rule: optimal shares, convergence to the speed ratio, hysteresis under noise,
sum N M and the floor in every step, weights, composition and its state dict."""

from __future__ import annotations

import io
import itertools

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tailtrain.errors import UsageError
from tailtrain.strategies.base import ArrivalColumns, Context, StepStats, Topology, check_contract
from tailtrain.strategies.rebalance import (
    SCALAR_RANKS,
    counted_total,
    counts,
    deals,
    demand_end,
    makespan,
    on_demand,
    on_nominal_units,
    optimal_shares,
    pool_end,
    robust_estimate,
    spread,
)
from tailtrain.strategies.registry import parse_strategy
from tailtrain.topology.allreduce import round_arrivals


def feed(rule, state, times: np.ndarray, step: int):
    """One step: every rank measured the first ``shares`` of ``times`` (N, U) columns."""
    shares = state.shares
    width = int(shares.max())
    t = times[:, :width] if times.shape[1] >= width else np.tile(times, (1, width))[:, :width]
    t = np.where(np.arange(width) < shares[:, None], t, np.nan)
    stats = StepStats(step=step, version=step + 1, time=0.0, k=len(shares), micro_batch_times=t)
    return rule.adapt(state, stats)


def check_shares(state) -> None:
    assert state.shares.sum() == state.n_workers * state.micro_batches
    assert state.shares.min() >= 1


# ---- optimal shares -----------------------------------------------------------------------
def brute_force(t: np.ndarray, total: int, floor: int) -> float:
    best = np.inf
    for shares in itertools.product(range(floor, total + 1), repeat=len(t)):
        if sum(shares) == total:
            best = min(best, makespan(np.array(shares), t))
    return best


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.floats(0.1, 5.0), min_size=1, max_size=4),
    st.integers(1, 4),
    st.integers(1, 2),
)
def test_optimal_shares_minimise_the_step_time(times, per_rank, floor):
    t = np.array(times)
    total = len(t) * max(per_rank, floor)
    shares = optimal_shares(t, total, floor)
    assert shares.sum() == total and shares.min() >= floor
    assert makespan(shares, t) == pytest.approx(brute_force(t, total, floor), rel=1e-9)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.floats(0.1, 5.0), st.floats(0.0, 20.0)), min_size=1, max_size=4),
    st.integers(1, 4),
    st.integers(0, 2),
)
def test_optimal_shares_with_fixed_costs_minimise_the_step_time(ranks, per_rank, floor):
    """With a_n seconds per step that no share changes: max_n a_n + m_n t_n is the least
    any shares reach (brute force), and a_n = 0 everywhere gives the fixed-free shares."""
    t, fixed = (np.array(column) for column in zip(*ranks, strict=True))
    total = len(t) * max(per_rank, floor, 1)
    shares = optimal_shares(t, total, floor, fixed=fixed)
    assert shares.sum() == total and shares.min() >= floor
    best = np.inf
    for choice in itertools.product(range(floor, total + 1), repeat=len(t)):
        if sum(choice) == total:
            best = min(best, float((fixed + np.array(choice) * t).max()))
    assert float((fixed + shares * t).max()) == pytest.approx(best, rel=1e-9)
    no_fixed = optimal_shares(t, total, floor, fixed=np.zeros_like(t))
    np.testing.assert_array_equal(no_fixed, optimal_shares(t, total, floor))


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.floats(1e-4, 10.0), min_size=1, max_size=2 * SCALAR_RANKS),
    st.floats(0.0, 50.0),
    st.integers(0, 3),
)
def test_the_counted_total_is_the_sum_of_the_counts_in_python_or_numpy(times, deadline, floor):
    # the bisection's sum in Python for a few ranks: the very counts numpy gives
    t = np.array(times)
    assert counted_total(t, floor)(deadline) == int(counts(deadline, t, floor).sum())


def test_the_robust_estimate_is_the_same_with_or_without_nan_aware_medians():
    window = np.random.default_rng(0).random((20, 4)) + 0.5
    t, noise = robust_estimate(window)
    gaps = window.copy()
    gaps[3, 1] = np.nan  # a rank not measured in one step: the NaN-aware path
    np.testing.assert_array_equal(t, np.nanmedian(window, axis=0))
    assert noise > 0 and robust_estimate(gaps) is not None
    np.testing.assert_array_equal(robust_estimate(gaps)[0], np.nanmedian(gaps, axis=0))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(0.01, 10.0), min_size=1, max_size=200), st.integers(1, 32))
def test_optimal_shares_follow_the_speed_ratio(times, per_rank):
    """x_n = N M (1/t_n) / sum(1/t): m_n t_n <= x_n t_n + t_max, and m_n >= floor(x_n) - 1
    where the floor of one micro-batch binds no rank (x_n >= 1)."""
    t = np.array(times)
    total = len(t) * per_rank
    shares = optimal_shares(t, total)
    fluid = total / (1 / t).sum()
    assert shares.sum() == total and shares.min() >= 1
    assert (shares * t <= np.maximum(t, fluid + t.max()) * (1 + 1e-9)).all()
    if (fluid / t >= 1).all():
        assert (shares >= np.floor(fluid / t) - 1).all()


# ---- the rule over steps ------------------------------------------------------------------
@settings(max_examples=40, deadline=None)
@given(
    st.integers(2, 16),
    st.integers(2, 16),
    st.floats(1.2, 3.0),
    st.floats(0.05, 0.6),
    st.floats(0.001, 1.0),
)
def test_shares_converge_to_the_speed_ratio_under_a_persistent_slowdown(
    n, m, factor, fraction, scale
):
    rule = parse_strategy("rebalance:warmup=5")
    state = rule.init(Context(n_workers=n, micro_batches=m))
    slow = max(1, round(fraction * n))
    t = np.full(n, scale)
    t[:slow] *= factor
    for step in range(8):
        state = feed(rule, state, np.repeat(t[:, None], 4 * m, axis=1), step)
        check_shares(state)
    best = makespan(optimal_shares(t, n * m), t)
    assert makespan(state.shares, t) <= best * (1 + rule.hysteresis) * (1 + 1e-9)
    if makespan(np.full(n, m), t) > best * (1 + rule.hysteresis) * (1 + 1e-9):
        assert makespan(state.shares, t) == pytest.approx(best, rel=1e-9)
        assert state.shares[:slow].max() < m  # the slow ranks gave work away
        assert rule.plan(state).shares == tuple(state.shares.tolist())


LAWS = {
    "exp": lambda rng, size: rng.exponential(1.0, size),
    "gamma": lambda rng, size: rng.gamma(2.0, 1.0, size),
    "lognormal": lambda rng, size: rng.lognormal(0.0, 0.75, size),
    "uniform": lambda rng, size: rng.uniform(0.5, 1.5, size),
    "dropcompute-noise": lambda rng, size: (
        1.0 + np.minimum(rng.lognormal(4.0, 1.0, size) / (2 * np.exp(4.5)), 5.5)
    ),
}


# derandomized: the rule's guard against noise is statistical (NOISE_Z + sqrt(2 ln N) standard
# errors of a median), so a false move is rare, not impossible: 3 of 3000 runs of 100 steps
# moved once at n = m = 3 under the lognormal law (ci20's random example was one of them);
# the rate is checked below on fixed seeds
@settings(max_examples=25, deadline=None, derandomize=True)
@given(
    st.sampled_from(sorted(LAWS)),
    st.integers(2, 16),
    st.integers(2, 16),
    st.floats(0.001, 10.0),
    st.integers(0, 2**32 - 1),
)
def test_shares_do_not_move_under_iid_noise(law, n, m, scale, seed):
    rule = parse_strategy("rebalance")
    state = rule.init(Context(n_workers=n, micro_batches=m))
    rng = np.random.default_rng(seed)
    for step in range(100):
        state = feed(rule, state, scale * LAWS[law](rng, (n, m)), step)
        assert state.moves == 0 and rule.plan(state).shares == (m,) * n
    check_shares(state)


def test_a_false_move_under_iid_noise_is_rare():
    """The guard's false-move rate, on fixed seeds: at most 1% of 300 runs of 100 steps move
    at all, at a small world where a median of few steps errs most (measured: 0.1%)."""
    rule = parse_strategy("rebalance")
    moved = 0
    for seed in range(300):
        state = rule.init(Context(n_workers=3, micro_batches=3))
        rng = np.random.default_rng(seed)
        for step in range(100):
            state = feed(rule, state, LAWS["lognormal"](rng, (3, 3)), step)
        moved += state.moves > 0
    assert moved <= 3


def test_noisy_persistent_slowdown_still_moves_the_shares():
    """DropCompute's noise on a 1.5x straggler among 8: the shares move by the end of the
    warm-up, give the straggler about two thirds of a share, and the step's expected compute
    time is within the hysteresis of the optimum."""
    rule = parse_strategy("rebalance")
    state = rule.init(Context(n_workers=8, micro_batches=12))
    rng = np.random.default_rng(0)
    factor = np.array([1.0] * 7 + [1.5])
    for step in range(30):
        state = feed(rule, state, factor[:, None] * LAWS["dropcompute-noise"](rng, (8, 24)), step)
        check_shares(state)
    assert state.moves >= 1
    assert 7 <= state.shares[-1] <= 9
    assert makespan(state.shares, factor) <= 1.05 * makespan(optimal_shares(factor, 96), factor)


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 6), st.integers(3, 8))
def test_the_floor_holds_for_a_rank_that_never_keeps_up(floor, m):
    rule = parse_strategy(f"rebalance:warmup=2,floor={floor}")
    state = rule.init(Context(n_workers=4, micro_batches=max(m, floor)))
    t = np.array([1.0, 1.0, 1.0, 1000.0])
    for step in range(4):
        state = feed(rule, state, np.repeat(t[:, None], 40, axis=1), step)
        check_shares(state)
        assert state.shares.min() >= floor
    assert state.shares[-1] == floor


def test_weights_count_the_samples_each_rank_contributed():
    """w_n = (C_n / M) / N: sum_n w_n G_n is the mean over every micro-batch."""
    rule = parse_strategy("rebalance")
    state = rule.init(Context(n_workers=3, micro_batches=4))
    done = np.array([6, 4, 2])
    cols = ArrivalColumns.of(
        np.arange(3), np.zeros(3, int), np.zeros(3), np.zeros(3), units=done / 4
    )
    now = rule.select(state, cols).now
    np.testing.assert_allclose(now.normalised(), done / 12)
    assert now.total == 3


# ---- composition, state, refusals ---------------------------------------------------------
def run_steps(rule, n=4, m=6, steps=25):
    state = rule.init(Context(n_workers=n, micro_batches=m))
    rng = np.random.default_rng(3)
    factor = np.array([1.0] * (n - 1) + [2.0])
    for step in range(steps):
        state = feed(rule, state, factor[:, None] * rng.uniform(0.9, 1.1, (n, 2 * m)), step)
    return state


@pytest.mark.parametrize("text", ["rebalance:warmup=3", "rebalance:warmup=3,then=dropcompute"])
def test_state_round_trips_through_a_state_dict(text):
    rule = parse_strategy(text)
    state = run_steps(rule)
    assert state.moves >= 1
    buffer = io.BytesIO()
    torch.save(rule.state_dict(state), buffer)
    buffer.seek(0)
    back = rule.load_state_dict(torch.load(buffer, weights_only=True))
    np.testing.assert_array_equal(back.shares, state.shares)
    np.testing.assert_array_equal(back.window, state.window)
    assert rule.plan(back) == rule.plan(state)
    assert (back.step, back.moves, back.inner) == (state.step, state.moves, state.inner)


def test_then_dropcompute_keeps_the_shares_and_takes_its_threshold():
    rule = parse_strategy("rebalance:warmup=3,then=dropcompute,calibrate=5")
    state = run_steps(rule)
    plan = rule.plan(state)
    assert plan.shares == tuple(state.shares.tolist())
    assert np.isfinite(plan.threshold)  # Algorithm 2 has run on the rebalanced rounds
    assert state.inner.tau == plan.threshold


def test_rounds_of_equal_shares_reach_dropcompute_unchanged():
    times = np.arange(12.0).reshape(3, 4)
    assert on_nominal_units(times, np.full(3, 4), 4) is times
    uneven = on_nominal_units(np.array([[1.0] * 6, [2.0] * 2 + [np.nan] * 4]), np.array([6, 2]), 4)
    np.testing.assert_allclose(uneven[0], [1.5] * 4)  # six units read as four
    np.testing.assert_allclose(uneven[1], [1.0] * 4)  # two units read as four


@pytest.mark.parametrize(
    "text, words",
    [
        ("rebalance:then=sync", "then='sync' is unknown"),
        ("rebalance:threshold=1", "does not take parameter 'threshold'"),
        ("rebalance:then=dropcompute,compensate=resample", "compensate=resample"),
        ("rebalance:hysteresis=-1", "must be >= 0"),
    ],
)
def test_bad_specs_are_refused_in_one_line(text, words):
    with pytest.raises(UsageError, match=words):
        parse_strategy(text)


def test_a_floor_above_m_is_refused():
    with pytest.raises(UsageError, match="floor=5 exceeds the 4 micro-batches"):
        parse_strategy("rebalance:floor=5").init(Context(n_workers=2, micro_batches=4))


def test_an_engine_that_does_not_deal_shares_refuses_it():
    rule = parse_strategy("rebalance")
    with pytest.raises(UsageError, match="needs shares, which this entry"):
        check_contract(rule, Topology.ALLREDUCE)
    check_contract(rule, Topology.ALLREDUCE, frozenset({"shares"}))


# ---- a changing world (train --on-rank-loss shrink) ---------------------------------------
def test_a_shrinking_world_deals_the_live_ranks_batch_by_their_measured_speeds():
    rule = parse_strategy("rebalance:warmup=3")
    state = run_steps(rule)  # rank 3 twice as slow: it has the smallest share
    assert state.shares[3] < state.shares[0]
    # rank 1 is lost: L M = 3 x 6 micro-batches over ranks 0, 2, 3, from their own columns
    after = rule.follow_world(state, Context(n_workers=3, micro_batches=6, live=(0, 2, 3)))
    t = np.nanmedian(state.window[:, [0, 2, 3]], axis=0)
    np.testing.assert_array_equal(after.shares, optimal_shares(t, 18))
    np.testing.assert_array_equal(after.window, state.window[:, [0, 2, 3]])
    assert after.shares.sum() == 18 and after.n_workers == 3 and rule.plan(after).k == 3
    # rank 1 comes back unmeasured: equal shares until the window knows its speed
    back = rule.follow_world(after, Context(n_workers=4, micro_batches=6))
    assert back.shares.tolist() == [6] * 4 and np.isnan(back.window[:, 1]).all()
    times = np.array([[1.0] * 12, [1.0] * 12, [1.0] * 12, [2.0] * 12])
    moved = feed(rule, back, times, 25)
    assert moved.shares.sum() == 24 and moved.shares[3] < moved.shares[1]


def test_a_composed_dropcompute_follows_and_a_deferred_cut_refuses():
    rule = parse_strategy("rebalance:warmup=3,then=dropcompute,calibrate=3")
    state = run_steps(rule)
    after = rule.follow_world(state, Context(n_workers=2, micro_batches=6, live=(0, 3)))
    assert after.inner.n_workers == 2 and after.inner.ranks == (0, 3)
    deferred = parse_strategy("rebalance:then=dropcompute,defer=true")
    ctx = Context(n_workers=2, micro_batches=6)
    assert deferred.follow_world(deferred.init(ctx), ctx) is None
    assert "defer=true" in deferred.follow_refusal()


# ---- dealt on demand (deal=demand) --------------------------------------------------------
def served_one_by_one(times: np.ndarray, pool: int) -> tuple[np.ndarray, np.ndarray]:
    """A plain event-by-event reference of :func:`on_demand`: a heap of (free time, rank);
    the earliest free rank asks and is dealt the next micro-batch, until ``pool`` of them
    are complete (completions in (time, rank) order); the step ends at that completion."""
    import heapq

    n, units = times.shape
    index = np.full((n, units), -1)
    ends = []  # (finish, rank, unit) of every dealt unit
    free = [(0.0, rank) for rank in range(n)]
    at = np.zeros(n, dtype=int)
    dealt = 0
    while free:
        start, rank = heapq.heappop(free)
        if at[rank] == units:
            continue
        done = sorted(ends)
        if len(done) >= pool and start >= done[pool - 1][0]:
            continue  # the step has ended: this rank asks no more
        index[rank, at[rank]] = dealt
        dealt += 1
        finish = start + times[rank, at[rank]]
        ends.append((finish, rank, at[rank]))
        at[rank] += 1
        heapq.heappush(free, (finish, rank))
    counted = np.zeros((n, units), dtype=bool)
    for _, rank, unit in sorted(ends)[:pool]:
        counted[rank, unit] = True
    return index, counted


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 5),
    st.integers(1, 4),
    st.sampled_from(["exp", "const", "lognormal"]),
    st.lists(st.floats(0.5, 3.0), min_size=5, max_size=5),
    st.integers(0, 2**32 - 1),
)
def test_dealing_on_demand_is_the_event_by_event_deal(n, m, law, speeds, seed):
    """The vectorised deal equals a rank-by-rank event loop over per-rank laws (persistent
    speeds times i.i.d. draws; constant ones make ties, broken by the lower rank), and every
    micro-batch of the step goes to exactly one unit: N M counted, at most one cut a rank."""
    rng = np.random.default_rng(seed)
    draws = {
        "exp": lambda shape: rng.exponential(1.0, shape),
        "const": lambda shape: np.ones(shape),
        "lognormal": lambda shape: rng.lognormal(0.0, 1.0, shape),
    }[law]((n, n * m))
    times = draws * np.array(speeds[:n])[:, None]
    pool = n * m
    index, counted = on_demand(np.cumsum(times, axis=1), pool)
    ref_index, ref_counted = served_one_by_one(times, pool)
    np.testing.assert_array_equal(counted, ref_counted)
    np.testing.assert_array_equal(index, ref_index)
    dealt = index >= 0
    assert sorted(index[dealt].tolist()) == list(range(int(dealt.sum())))
    assert counted.sum() == pool and not (counted & ~dealt).any()
    cut = dealt.sum(axis=1) - counted.sum(axis=1)
    assert ((cut == 0) | (cut == 1)).all()
    for mask in (dealt, counted):  # prefixes: a rank's units in order
        assert (np.diff(mask.astype(int), axis=1) <= 0).all()


def test_deal_on_demand_is_its_own_spec_and_refuses_what_it_does_not_use():
    rule = parse_strategy("rebalance:deal=demand")
    assert rule.carries and rule.needs == frozenset({"shares", "demand"})
    state = rule.init(Context(n_workers=3, micro_batches=4))
    plan = rule.plan(state)
    assert plan.on_demand and plan.carry_cut and sum(plan.shares) == 12
    moved = run_steps(rule)  # no share to move: the pool is N M, dealt as ranks ask
    assert moved.moves == 0 and (moved.shares == moved.micro_batches).all()
    with pytest.raises(UsageError, match=r"deal=demand deals no shares.*drop then=, warmup="):
        parse_strategy("rebalance:deal=demand,warmup=2,then=dropcompute")
    with pytest.raises(UsageError, match=r"deal='all' is unknown"):
        parse_strategy("rebalance:deal=all")
    with pytest.raises(
        UsageError,
        match=r"needs demand, .*run it with `simulate`, `predict`, `train` or ShardedStep$",
    ) as refused:
        check_contract(rule, Topology.ALLREDUCE, frozenset({"shares", "carry"}))
    assert "\n" not in str(refused.value)
    ctx = Context(n_workers=2, micro_batches=6)
    assert rule.follow_world(rule.init(ctx), ctx) is not None  # the pool follows (below)


def test_deal_on_demand_follows_a_shrinking_world_with_the_whole_pool():
    """The pool is the world's (``Rebalance.follow_world``): after a shrink the live ranks deal
    the same N M micro-batches, and each update still divides by N, so it is the mean over
    N M micro-batch gradients whoever computed them; a heal spreads it over N again."""
    rule = parse_strategy("rebalance:deal=demand")
    state = run_steps(rule)  # N = 4, M = 6: a pool of 24
    after = rule.follow_world(state, Context(n_workers=3, micro_batches=6, live=(0, 2, 3)))
    assert after.shares.tolist() == [8, 8, 8] and after.ranks == (0, 2, 3)
    np.testing.assert_array_equal(after.window, state.window[:, [0, 2, 3]])
    plan = rule.plan(after)
    assert plan.on_demand and sum(plan.shares) == 24 and plan.k == 3
    # the live ranks completed 9, 9 and 6 of the 24: weights C_n / M over N = 4
    arrivals = round_arrivals(7, 0.0, np.array([9, 9, 6]), np.ones(3), 6)
    chosen = rule.select(after, arrivals).now
    assert chosen.total == 4 and chosen.weight.tolist() == [1.5, 1.5, 1.0]
    assert chosen.normalised().sum() == pytest.approx(24 / 6 / 4)  # the mean of 24 gradients
    two = rule.follow_world(after, Context(n_workers=2, micro_batches=6, live=(0, 3)))
    pair = round_arrivals(8, 0.0, np.array([12, 12]), np.ones(2), 6)
    assert two.shares.tolist() == [12, 12] and rule.select(two, pair).now.total == 4
    healed = rule.follow_world(two, Context(n_workers=4, micro_batches=6))
    assert healed.shares.tolist() == [6] * 4 and np.isnan(healed.window[:, 1]).all()
    assert rule.follow_world(healed, Context(n_workers=4, micro_batches=6)) is healed  # a resume
    assert spread(10, 3).tolist() == [4, 3, 3]
    # shares keep the per-rank batch instead: the global batch shrinks to L M
    shares = parse_strategy("rebalance")
    less = shares.follow_world(run_steps(shares), Context(4 - 1, micro_batches=6, live=(0, 2, 3)))
    assert less.shares.sum() == 18 and shares.select(less, arrivals).now.total == 3


def scheduled_end(cumulative: np.ndarray, pool: int) -> float:
    """The pool dealt one unit at a time to the rank free first (ties to the lower rank): an
    event loop, against :func:`pool_end`'s vectorised reading."""
    free, taken, ends = np.zeros(len(cumulative)), np.zeros(len(cumulative), dtype=int), []
    for _ in range(pool):
        n = int(np.argmin(free))
        ends.append(cumulative[n, taken[n]])
        free[n], taken[n] = cumulative[n, taken[n]], taken[n] + 1
    return float(max(ends))


@settings(max_examples=200, deadline=None)
@given(
    st.integers(1, 4),
    st.integers(1, 5),
    st.integers(0, 2**32 - 1),
)
def test_a_step_that_deals_its_pool_alone_ends_at_its_list_schedule(ranks, m, seed):
    """``pool_end`` is the event loop's end, and never before the pool's completions with
    cuts (``demand_end``)."""
    rng = np.random.default_rng(seed)
    pool = ranks * m
    cumulative = np.cumsum(rng.exponential(1.0, (ranks, pool)) + 0.01, axis=1)
    end = float(pool_end(cumulative, pool))
    assert end == scheduled_end(cumulative, pool)
    assert float(demand_end(cumulative, pool)) <= end
    other = np.cumsum(rng.exponential(1.0, (ranks, pool)) + 0.01, axis=1)
    stacked = np.stack([cumulative, other])  # the leading axes: many steps at once
    np.testing.assert_array_equal(pool_end(stacked, pool), [end, scheduled_end(other, pool)])


def test_an_engine_that_cannot_cut_deals_the_pool_alone():
    assert all(deals(k, 6, cuts_in_flight=True) for k in range(10))
    assert [deals(k, 6, cuts_in_flight=False) for k in range(4, 8)] == [True, True, False, False]
