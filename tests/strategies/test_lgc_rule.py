"""LGC (Algorithm 1, Eqs. 6-7) at the rule level: weights, warm-up and the compensation sum."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tailtrain.errors import UsageError
from tailtrain.strategies.base import Context, StepStats, SyncMode
from tailtrain.strategies.lgc import Lgc
from tailtrain.strategies.registry import parse_strategy
from tailtrain.strategies.testing import ArrivalRow, arrivals, weights


def step_arrivals(version: int, fresh: list[int], partial: dict[int, float]):
    """The candidates the engine hands to ``select``: fresh whole gradients, then stragglers'
    partial work (units = r/s)."""
    out = [ArrivalRow(w, version, 0.0, 1.0 + w) for w in fresh]
    out += [ArrivalRow(w, version, 0.0, 9.0, units=u, partial=True) for w, u in partial.items()]
    return arrivals(out)


def no_stats(step: int) -> StepStats:
    return StepStats(step=step, version=step + 1, time=float(step), k=0)


def applied(selection, cols, grads, deferred):
    """The engine's update direction and the new deferred term (base.Selection)."""
    g = grads[cols.worker]
    now, later = weights(selection, cols)
    return now @ g + deferred, later @ g


def by_worker(selection, cols):
    """({worker: now weight}, {worker: later weight}) of the non-zero weights."""
    now, later = weights(selection, cols)
    pick = lambda w: {int(cols.worker[i]): float(w[i]) for i in np.flatnonzero(w)}  # noqa: E731
    return pick(now), pick(later)


@given(n=st.integers(2, 9), steps=st.integers(1, 30), seed=st.integers(0, 2**31))
def test_compensation_sums_to_full_sync_minus_the_pending_term(n, steps, seed):
    # K = N - 1, the same straggler every step, whose whole gradient arrives one step late
    # (complete=true); gradients do not depend on the model, so they are constant vectors
    rng = np.random.default_rng(seed)
    grads = rng.normal(size=(n, 5))
    straggler = int(rng.integers(n))
    strategy = parse_strategy(f"lgc:k={n - 1},blocks=4,complete=true")
    state = strategy.init(Context(n_workers=n))
    assert strategy.plan(state).complete_stragglers
    total, deferred = np.zeros(5), np.zeros(5)
    fresh = [w for w in range(n) if w != straggler]
    for step in range(steps):
        arrivals = step_arrivals(step, fresh, {straggler: 1.0})
        direction, deferred = applied(strategy.select(state, arrivals), arrivals, grads, deferred)
        total += direction
        state = strategy.adapt(state, no_stats(step))
    np.testing.assert_allclose(total, steps * grads.mean(axis=0) - deferred, atol=1e-12)


def test_weights_follow_eq7_with_eq6_scaling():
    n, k, s = 5, 3, 4
    strategy = Lgc("lgc", k, s)
    state = strategy.init(Context(n_workers=n))
    plan = strategy.plan(state)
    assert (plan.k, plan.mode, plan.partial_blocks, plan.complete_stragglers) == (
        k,
        SyncMode.PSI,
        s,
        False,
    )
    # fresh 0, 2, 4; worker 1 finished r = 3 of 4 blocks, worker 3 finished 1
    arrivals = step_arrivals(0, [0, 2, 4], {1: 3 / 4, 3: 1 / 4})
    sel = strategy.select(state, arrivals)
    now, later = by_worker(sel, arrivals)
    assert now == pytest.approx({0: 1 / 3, 2: 1 / 3, 4: 1 / 3})
    comp = -(n - k) / (n * k)
    assert later == pytest.approx({0: comp, 2: comp, 4: comp, 1: 0.75 / n, 3: 0.25 / n})
    # e_t of Eq. (7): 1/N (r/s mean-of-r-blocks) - (N-K)/N mean of the fresh
    grads = np.arange(10.0).reshape(5, 2)
    _, e = applied(sel, arrivals, grads, np.zeros(2))
    fresh_mean = grads[[0, 2, 4]].mean(axis=0)
    expected = (0.75 * grads[1] + 0.25 * grads[3]) / n - (n - k) / n * fresh_mean
    np.testing.assert_allclose(e, expected)


def test_selection_does_not_depend_on_arrival_order():
    strategy = Lgc("lgc", 2, 4)
    state = strategy.init(Context(n_workers=4))
    arrivals = step_arrivals(0, [3, 1], {0: 0.5, 2: 0.25})
    perm = [2, 0, 3, 1]
    shuffled = arrivals.take(np.array(perm))
    a = by_worker(strategy.select(state, arrivals), arrivals)
    b = by_worker(strategy.select(state, shuffled), shuffled)
    assert a[0] == pytest.approx(b[0]) and a[1] == pytest.approx(b[1])


def test_warmup_epochs_run_fully_synchronous():
    n = 4
    strategy = parse_strategy("lgc:k=2,blocks=3,warmup=1.5")
    state = strategy.init(Context(n_workers=n, iterations_per_epoch=4))  # 6 warm-up steps
    for step in range(8):
        plan = strategy.plan(state)
        if step < 6:
            assert (plan.k, plan.partial_blocks) == (n, 0)
            cols = step_arrivals(step, list(range(n)), {})
            now, later = by_worker(strategy.select(state, cols), cols)
            assert now == pytest.approx(dict.fromkeys(range(n), 1 / n)) and not later
        else:
            assert (plan.k, plan.partial_blocks) == (2, 3)
        state = strategy.adapt(state, no_stats(step))


def test_k_equal_n_is_plain_synchronous_sgd():
    strategy = Lgc("lgc", 3)
    state = strategy.init(Context(n_workers=3))
    cols = step_arrivals(0, [0, 1, 2], {})
    now, later = by_worker(strategy.select(state, cols), cols)
    assert now == pytest.approx(dict.fromkeys(range(3), 1 / 3)) and later == {}


def test_spec_round_trip():
    strategy = parse_strategy("lgc:k=7,blocks=4,warmup=2,complete=true")
    assert strategy == Lgc("lgc", 7, 4, 2.0, True)
    assert parse_strategy(strategy.describe()) == strategy


@pytest.mark.parametrize(
    "text",
    [
        "lgc",
        "lgc:k=0",
        "lgc:k=2,blocks=0",
        "lgc:k=2,warmup=-1",
        "lgc:k=2,complete=maybe",
        "lgc:k=2,delay=1",
    ],
)
def test_bad_specs_raise_usage_errors(text):
    with pytest.raises(UsageError):
        parse_strategy(text)


def test_k_above_n_is_a_usage_error_at_init():
    with pytest.raises(UsageError):
        parse_strategy("lgc:k=5").init(Context(n_workers=4))
