"""AdaSync (slow-and-stale §VI, Algorithm 1, Appendix D): the K schedule."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tailtrain.errors import UsageError
from tailtrain.strategies.adasync import AdaSync, k_sqrt_rule, k_sync_rule, next_k
from tailtrain.strategies.base import Context, StepStats, SyncMode
from tailtrain.strategies.registry import parse_strategy


def stats(step: int, time: float, loss: float) -> StepStats:
    return StepStats(step=step, version=step + 1, time=time, k=1, loss=loss)


def run(strategy: AdaSync, n: int, times: np.ndarray, losses: np.ndarray) -> list[int]:
    """K planned before each step, for steps closing at ``times`` with mini-batch ``losses``."""
    state = strategy.init(Context(n_workers=n))
    ks = []
    for step, (t, loss) in enumerate(zip(times, losses, strict=True)):
        ks.append(strategy.plan(state).k)
        state = strategy.adapt(state, stats(step, float(t), float(loss)))
    return ks


@given(
    p=st.integers(2, 500),
    data=st.data(),
    ratio=st.floats(1e-3, 1e4),
)
def test_k_sync_rule_solves_the_quadratic(p, data, ratio):
    k0 = data.draw(st.integers(1, p - 1))
    k = k_sync_rule(k0, p, ratio)
    c = k0**2 / (p - k0) * ratio
    assert 0 < k < p
    assert k**2 / (p - k) == pytest.approx(c, rel=1e-9)


@given(p=st.integers(1, 500), data=st.data(), f0=st.floats(1e-6, 1e6), fs=st.floats(0, 1e6))
def test_next_k_is_an_integer_in_1_to_p(p, data, f0, fs):
    k0 = data.draw(st.integers(1, p))
    for base in ("k-sync", "k-async", "k-batch-async"):
        k = next_k(base, k0, p, f0, fs)
        assert isinstance(k, int) and 1 <= k <= p


def test_rules_at_the_edges():
    assert k_sync_rule(8, 8, 2.0) == 8  # K0 = P: the quadratic's limit
    assert next_k("k-async", 2, 16, 1.0, 0.0) == 16  # zero loss: fully synchronous
    assert k_sqrt_rule(2, 4.0) == 4.0  # Eq. (26)


def test_k_async_schedule_grows_as_the_loss_falls():
    n, interval, window = 16, 10.0, 3
    times = np.arange(1, 201, dtype=float)
    losses = 8.0 / (1.0 + times / 15.0)
    strategy = AdaSync("adasync", "k-async", 1, interval, window)
    ks = run(strategy, n, times, losses)
    f0 = losses[:window].mean()
    expected, k = [], 1
    for step in range(times.size):
        expected.append(k)
        if times[step] % interval == 0 and k < n:  # a boundary closes at this step
            fs = losses[step - window + 1 : step + 1].mean()
            k = min(max(round(1 * math.sqrt(f0 / fs)), 1), n)
    assert ks == expected
    assert np.all(np.diff(ks) >= 0) and ks[-1] > ks[0]
    at_190 = losses[190 - window : 190].mean()  # times 188..190: the last planned boundary
    assert ks[-1] == round(math.sqrt(f0 / at_190)) == 3


def test_k_sync_schedule_follows_the_quadratic_root():
    n, k0, interval, window = 8, 2, 5.0, 4
    times = np.arange(0.5, 60.0, 0.5)
    losses = 3.0 * np.exp(-times / 20.0)
    ks = run(AdaSync("adasync", "k-sync", k0, interval, window), n, times, losses)
    f0 = losses[:window].mean()
    last_before = np.searchsorted(times, 55.0, side="right") - 1  # the boundary at t = 55
    fs = losses[last_before - window + 1 : last_before + 1].mean()
    c = k0**2 / (n - k0) * f0 / fs
    root = max(np.roots([1.0, c, -c * n]).real)  # K^2 + cK - cP = 0, independently
    assert ks[-1] == min(max(round(root), 1), n)
    assert all(1 <= k <= n for k in ks) and np.all(np.diff(ks) >= 0)
    change_steps = np.flatnonzero(np.diff(ks)) + 1
    assert all(times[s - 1] % interval == 0 for s in change_steps)  # only at boundaries


def test_k_stays_at_p_once_reached_and_without_finite_losses():
    strategy = AdaSync("adasync", "k-async", 2, 1.0, 1)
    state = strategy.init(Context(n_workers=4))
    state = strategy.adapt(state, stats(0, 0.5, 4.0))
    state = strategy.adapt(state, stats(1, 1.0, 0.25))  # sqrt(16) * 2 = 8 -> clipped to 4
    assert state.k == 4
    state = strategy.adapt(state, stats(2, 2.0, 400.0))  # Algorithm 1 line 7: K < P only
    assert state.k == 4
    nan_run = AdaSync("adasync", "k-async", 2, 1.0, 1)
    s = nan_run.init(Context(n_workers=4))
    for step in range(5):
        s = nan_run.adapt(s, stats(step, float(step + 1), math.nan))
    assert s.k == 2


@pytest.mark.parametrize(
    ("base", "mode", "stale"),
    [
        ("k-sync", SyncMode.PSI, False),
        ("k-async", SyncMode.PSW, True),
        ("k-batch-async", SyncMode.PULL, True),
    ],
)
def test_plan_follows_the_base_variant(base, mode, stale):
    strategy = parse_strategy(f"adasync:base={base},k0=3,interval=60,lr=proportional")
    plan = strategy.plan(strategy.init(Context(n_workers=8)))
    assert (plan.k, plan.mode, plan.accept_stale) == (3, mode, stale)
    assert plan.lr_scale == pytest.approx(3 / 8)


def test_spec_defaults_and_round_trip():
    strategy = parse_strategy("adasync:interval=60")
    assert isinstance(strategy, AdaSync)
    assert (strategy.base, strategy.k0, strategy.interval) == ("k-async", 1, 60.0)
    assert parse_strategy(strategy.describe()) == strategy


@pytest.mark.parametrize(
    "text",
    [
        "adasync",
        "adasync:interval=0",
        "adasync:interval=-5",
        "adasync:interval=60,base=k-batch-sync",
        "adasync:interval=60,k0=0",
        "adasync:interval=60,window=0",
        "adasync:interval=60,tau=3",
    ],
)
def test_bad_specs_raise_usage_errors(text):
    with pytest.raises(UsageError):
        parse_strategy(text)


def test_k0_above_p_is_a_usage_error_at_init():
    with pytest.raises(UsageError):
        parse_strategy("adasync:interval=60,k0=9").init(Context(n_workers=8))
