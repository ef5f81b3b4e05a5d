"""predict's rebalance row: the closed form T* under constant per-worker times, the Monte
Carlo of successive steps, and the row beside sync and DropCompute."""

from __future__ import annotations

import heapq
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tailtrain.delays import parse_delay, parse_pattern
from tailtrain.prediction import DelayScenario, predict
from tailtrain.prediction.context import _Context
from tailtrain.prediction.estimates import DEMAND_SPEC, _demand_rows
from tailtrain.prediction.rebalance import (
    DEMAND_DRAWS,
    DEMAND_GROUPS,
    DEMAND_SEQUENCES,
    demand_ends,
    demand_mean_field,
    demand_times,
    rebalance_quadrature,
    rebalance_times,
    stepped_times,
)
from tailtrain.strategies.rebalance import makespan, optimal_shares
from tailtrain.theory.sums import partial_sum_laws


def rows_of(**kw):
    scenario = DelayScenario(**kw)
    rows = predict(scenario).rows
    return {r.spec or r.strategy: r for r in rows if r.strategy in ("sync", "rebalance")}


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


# ---- rebalance:deal=demand ------------------------------------------------------------------
def demand_step_by_events(draws: list[list[float]], pool: int) -> float:
    """Reference: one step dealt on demand, event by event. Every worker starts at 0 and
    takes its next draw as soon as it finishes one; the step ends at the pool-th completion."""
    events = [(d[0], n, 0) for n, d in enumerate(draws) if d]
    heapq.heapify(events)
    done = 0
    while True:
        end, n, u = heapq.heappop(events)
        done += 1
        if done == pool:
            return end
        if u + 1 < len(draws[n]):
            heapq.heappush(events, (end + draws[n][u + 1], n, u + 1))


LAWS = ["exp:rate=1", "uniform:low=0.5,high=1.5", "lognormal:mu=0,sigma=1", "const:value=1"]


@settings(max_examples=40, deadline=None)
@given(
    st.sampled_from(LAWS),
    st.integers(1, 5),
    st.integers(1, 4),
    st.lists(st.sampled_from([0.25, 0.5, 1.0, 1.5, 3.0]), min_size=5, max_size=5),
    st.integers(0, 2**16),
)
def test_a_step_dealt_on_demand_is_the_event_by_event_one(law, workers, m, factors, seed):
    """demand_times (predict's Monte Carlo of deal=demand) step by step against the event
    loop on the same streams, with the draws per step it settled on."""
    factor = np.array(factors[:workers])
    t = parse_delay(law).sample(np.random.default_rng(seed), (30, workers, m))
    t *= factor[None, :, None]
    comm = np.full(30, 0.25)
    mean, stderr, closed, units = demand_times(t, comm, parse_delay(law).mean * factor)
    streams = t.transpose(1, 0, 2).reshape(workers, -1)
    steps = 30 * m // units
    reference = [
        demand_step_by_events(
            [list(streams[n, j * units : (j + 1) * units]) for n in range(workers)],
            workers * m,
        )
        for j in range(steps)
    ]
    end, exact = demand_ends(t, units)
    assert exact and steps >= 1
    np.testing.assert_allclose(end, reference, rtol=1e-12)
    assert mean == pytest.approx(np.mean(reference) + 0.25, rel=1e-12)
    if law == "const:value=1":  # constant times: the closed form, exactly
        assert mean == closed and stderr == 0.0


def test_too_few_draws_per_step_are_seen_and_doubled():
    """A worker 64 times faster than the others ends the step alone: the draws per step at
    the means (2 x its share + 2) are exact, and a stream cut shorter is reported inexact."""
    t = np.ones((50, 3, 2))
    t[:, 0] = 2.0**-6  # dyadic: its partial sums are exact
    end, exact = demand_ends(t, 2)
    assert not exact and end[0] == 2.0  # worker 0's two draws end at 1/32: 4 completions unseen
    mean, _, closed, units = demand_times(t, np.zeros(50), np.array([2.0**-6, 1.0, 1.0]))
    assert mean == closed == 6 * 2.0**-6 and units >= 6


def test_constant_times_give_the_closed_form_of_deal_demand_exactly():
    """Constant times mu_n: the (N M)-th smallest of {k mu_n}, optimal_shares with no floor
    (a worker 20 times slower finishes none)."""
    mu = np.array([1.0, 1.0, 1.5, 2.0, 20.0])
    t = np.broadcast_to(mu[None, :, None], (40, 5, 6)).copy()
    mean, stderr, closed, _ = demand_times(t, np.full(40, 0.5), mu)
    ends = np.sort((np.arange(1, 31)[None, :] * mu[:, None]).ravel())
    assert mean == closed == ends[29] + 0.5 and stderr == 0.0
    assert optimal_shares(mu, 30, floor=0)[-1] == 0


def test_the_demand_row_sits_beside_rebalance_and_beats_it_under_noise():
    """predict's deal=demand row: a Monte Carlo on the shared sample, nothing dropped (its
    effective speedup is its speedup), faster than static shares under noise and than sync
    even for i.i.d. workers (every worker stays busy until the N M-th completion)."""
    noise = parse_delay("const:value=0.01+dropcompute-noise:scale=0.01")
    iid = rows_of(workers=8, delay=noise, micro_batches=12)
    mixed = rows_of(
        workers=8, delay=noise, pattern=parse_pattern("heterogeneous:low=1,high=1.5"),
        micro_batches=12,
    )  # fmt: skip
    for rows in (iid, mixed):
        demand = rows[DEMAND_SPEC]
        assert demand.strategy == "rebalance" and demand.method.startswith("monte-carlo")
        assert demand.iteration_time < rows["rebalance"].iteration_time
        assert demand.effective_speedup == pytest.approx(demand.speedup_vs_sync)
        assert demand.speedup_vs_sync > 1.1


@pytest.mark.parametrize("spec", ["exp:rate=1", "uniform:low=0.5,high=1.5"])
def test_the_large_n_limit_agrees_with_the_monte_carlo_at_2048_workers(spec):
    """Above LARGE_N predict solves E_s[m(t / s)] = M (mean-field over sequences of draws);
    at 2048 heterogeneous workers, where the Monte Carlo of N workers still runs, the two
    agree within their standard errors (4 of them); for Exp(1), m(t) = t, so the limit is
    M / E[1/s] = M (high - low) / ln(high / low)."""
    m, speeds = 4, (1.0, 2.0)
    scenario = DelayScenario(
        2048,
        parse_delay(spec),
        pattern=parse_pattern("heterogeneous:low=1,high=2"),
        micro_batches=m,
    )
    (carlo,) = _demand_rows(_Context.build(scenario))
    law = parse_delay(spec)
    value, stderr, _, _, exact = demand_mean_field(law.sample, speeds, m, np.random.default_rng(7))
    assert exact and carlo.method.startswith("monte-carlo")
    gap = abs(carlo.iteration_time - value)
    assert gap <= 4 * math.hypot(carlo.iteration_time_stderr, stderr)
    if spec == "exp:rate=1":
        assert abs(value - m / math.log(2.0)) <= 4 * stderr


def test_the_large_n_limit_holds_its_draws_cap_with_many_micro_batches():
    """``DEMAND_DRAWS`` caps the mean-field's draws from the first: with M = 512 and speeds
    1 to 3 a sequence starts 3074 draws long, and 2^17 of them (3 GiB, and as much again for
    their sums) would not fit; fewer sequences (still in whole groups) hold the cap, and
    the figure is as good as their count allows (Exp(1): M / E[1/s])."""
    m, speeds, law = 512, (1.0, 3.0), parse_delay("exp:rate=1")
    asked = []

    def draw(rng, shape):
        asked.append(shape)
        assert shape[0] * shape[1] <= DEMAND_DRAWS, shape  # before allocating it
        return law.sample(rng, shape)

    value, stderr, sequences, length, exact = demand_mean_field(
        draw, speeds, m, np.random.default_rng(7)
    )
    assert sequences * length <= DEMAND_DRAWS and sequences % DEMAND_GROUPS == 0
    assert sequences == asked[0][0] < DEMAND_SEQUENCES and exact
    assert abs(value - m * 2.0 / math.log(3.0)) <= 4 * stderr
