"""predict's rebalance row: the closed form T* under constant per-worker times, the Monte
Carlo of successive steps, and the row beside sync and DropCompute."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tailtrain.delays import parse_delay, parse_pattern
from tailtrain.prediction import DelayScenario, predict
from tailtrain.prediction.rebalance import rebalance_quadrature, rebalance_times, stepped_times
from tailtrain.strategies.rebalance import makespan, optimal_shares
from tailtrain.theory.sums import partial_sum_laws


def rows_of(**kw):
    scenario = DelayScenario(**kw)
    return {r.strategy: r for r in predict(scenario).rows if r.strategy in ("sync", "rebalance")}


def test_successive_steps_cut_each_workers_stream_by_its_share():
    t = np.arange(1.0, 13.0).reshape(2, 2, 3)  # t[i, n, m]
    # worker 0's stream 1 2 3 7 8 9, worker 1's 4 5 6 10 11 12; shares 4 and 2
    steps = stepped_times(t, np.array([4, 2]))
    np.testing.assert_allclose(steps, [max(1 + 2 + 3 + 7, 4 + 5)])


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 4), st.integers(1, 6), st.integers(1, 5), st.data())
def test_grouped_cuts_equal_each_workers_stream_cut_one_by_one(iterations, workers, m, data):
    shares = np.array(
        data.draw(st.lists(st.integers(1, 2 * m), min_size=workers, max_size=workers))
    )
    t = np.random.default_rng(workers * 100 + m).exponential(size=(iterations, workers, m))
    steps = iterations * m // shares.max()
    streams = [t[:, n, :].reshape(-1) for n in range(workers)]
    naive = [
        max(streams[n][j * shares[n] : (j + 1) * shares[n]].sum() for n in range(workers))
        for j in range(steps)
    ]
    np.testing.assert_allclose(stepped_times(t, shares), naive, rtol=1e-12)


def test_constant_times_meet_the_closed_form():
    """With constant per-worker times every step takes T* = max_n m_n mu_n exactly."""
    mu = np.array([1.0, 1.0, 1.5, 2.0])
    t = np.broadcast_to(mu[None, :, None], (40, 4, 6)).copy()
    mean, stderr, closed, shares = rebalance_times(t, np.full(40, 0.5), mu)
    assert shares.sum() == 24 and stderr == pytest.approx(0.0, abs=1e-12)
    assert mean == pytest.approx(closed) == pytest.approx(makespan(shares, mu) + 0.5)
    assert makespan(shares, mu) == makespan(optimal_shares(mu, 24), mu)


def test_the_row_equals_sync_for_iid_workers_and_beats_it_for_heterogeneous_ones():
    iid = rows_of(workers=8, delay=parse_delay("exp:rate=10"), micro_batches=4)
    assert iid["rebalance"].iteration_time == pytest.approx(iid["sync"].iteration_time)
    mixed = rows_of(
        workers=8,
        delay=parse_delay("const:value=0.01"),
        pattern=parse_pattern("heterogeneous:low=1,high=1.5"),
        micro_batches=12,
    )
    rebalance, sync = mixed["rebalance"], mixed["sync"]
    assert rebalance.iteration_time < sync.iteration_time
    assert rebalance.effective_speedup == pytest.approx(rebalance.speedup_vs_sync)
    assert rebalance.method.startswith("monte-carlo")


def test_noise_puts_the_expected_step_above_the_closed_form():
    """E[max_n S_n] >= max_n E[S_n] = T* (Jensen), far above it among 10^5 noisy workers."""
    n = 100_000
    mu = np.random.default_rng(0).uniform(1.0, 2.0, n)
    t = mu[None, :, None] * np.random.default_rng(1).exponential(1.0, (3, n, 2))
    mean, _, closed, shares = rebalance_times(t, np.zeros(3), mu)
    assert shares.sum() == 2 * n and mean > 1.5 * closed


@pytest.mark.parametrize("spec", ["exp:rate=1", "uniform:low=0.5,high=1.5"])
@pytest.mark.parametrize("m", [1, 6])
def test_quadrature_over_the_speeds_is_the_monte_carlo_of_one_step(spec, m):
    """rebalance_quadrature (predict above LARGE_N under heterogeneous speeds): E[max_n s_n
    S_n(m_n)] for given speeds against a Monte Carlo of one step with those speeds (a bounded
    law too: its sums' cdf ends at the support's top)."""
    rng = np.random.default_rng(m)
    n, model = 500, parse_delay(spec)
    laws = partial_sum_laws(model, 4 * m)
    speeds = rng.uniform(1.0, 1.5, n)
    value, closed, shares = rebalance_quadrature(speeds, model.mean, lambda j: laws[j - 1], n * m)
    np.testing.assert_array_equal(shares, optimal_shares(speeds * model.mean, n * m))
    assert closed == pytest.approx(float((shares * speeds * model.mean).max()))
    draws = model.sample(rng, (2000, n, int(shares.max())))
    sums = np.where(np.arange(draws.shape[2]) < shares[:, None], draws, 0.0).sum(axis=2)
    steps = (speeds * sums).max(axis=1)
    assert abs(value - steps.mean()) <= 4 * steps.std(ddof=1) / np.sqrt(steps.size)
