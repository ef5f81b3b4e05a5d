"""Slow-and-stale Table II, Lemmas 1-5 and Theorems 1-2, against exact sums and simulation."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from tailtrain.delays import parse_delay
from tailtrain.errors import UsageError
from tailtrain.theory import kfamily
from tailtrain.theory.montecarlo import (
    equilibrium_residuals,
    k_async_iteration_time,
    k_batch_async_iteration_time,
    k_batch_sync_iteration_times,
    table_draw,
)

P = 8


def harmonic(n: int) -> Fraction:
    return sum((Fraction(1, i) for i in range(1, n + 1)), Fraction(0))


def simulate_k_async(model, k, rng, chains=32, iterations=400, warmup=60):
    """K-async chains from equilibrium residuals, fresh i.i.d. jobs on every restart."""
    pool = model.sample(rng, (4096, 1))
    first = equilibrium_residuals(pool, chains * P, rng).reshape(chains, P)
    draw = lambda workers, index: model.sample(rng, workers.shape)  # noqa: E731
    return k_async_iteration_time(first, draw, k, iterations, warmup)


def test_exponential_k_sync_is_the_harmonic_sum():
    for k in range(1, P + 1):
        est = kfamily.k_sync_time(parse_delay("exp:rate=2"), k, P)
        exact = (harmonic(P) - harmonic(P - k)) / 2
        assert est.method == "exact" and est.value == pytest.approx(float(exact), rel=1e-14)


@pytest.mark.parametrize("spec", ["exp:rate=2", "pareto:shape=2,scale=1", "uniform:low=1,high=3"])
def test_k_batch_async_is_k_mean_over_p_exactly(spec):
    model = parse_delay(spec)
    for k in range(1, P + 1):
        assert kfamily.k_batch_async_time(model, k, P) == k * model.mean / P
    assert kfamily.async_time(model, P) == model.mean / P


def test_theorems_1_and_2_for_the_exponential_are_exact():
    model = parse_delay("exp:rate=3")
    assert kfamily.async_speedup(model, P).value == pytest.approx(float(P * harmonic(P)), rel=1e-14)
    for k in range(1, P + 1):
        exact = P * (harmonic(P) - harmonic(P - k)) / k
        assert kfamily.batch_speedup(model, k, P).value == pytest.approx(float(exact), rel=1e-14)


def test_theorem_2_approximation_within_the_euler_maclaurin_error():
    # H_P - H_{P-K} = log(P/(P-K)) + 1/(2P) - 1/(2(P-K)) + O(1/(P-K)^2)
    p = 1000
    for k in (10, 300, 900):
        exact = kfamily.batch_speedup(parse_delay("exp:rate=1"), k, p).value
        bound = p / k * (1 / (2 * (p - k)) + 1 / (p - k) ** 2)
        assert abs(kfamily.batch_speedup_approx(k, p) - exact) <= bound


def test_theorem_1_against_simulation(rng, mc):
    model = parse_delay("pareto:shape=3,scale=1")
    largest = np.max(model.sample(rng, (40_000, P)), axis=1)
    mean, stderr = mc.mean(largest * P / model.mean)
    mc.within(kfamily.async_speedup(model, P).value, mean, stderr)


def test_lemma_4_telescopes_and_matches_its_approximation():
    shift, rate, k, p = 1.0, 2.0, 4, 16
    bound = kfamily.k_async_shifted_exp_bound(shift, rate, k, p)
    telescoped = k * shift / p + k * float(harmonic(p)) / (p * rate)
    assert bound == pytest.approx(telescoped, rel=1e-13)
    # Eq. (13) replaces H_P by log P, so the gap is K (H_P - log P) / (P mu) <= K / (P mu)
    approx = kfamily.k_async_shifted_exp_approx(shift, rate, k, p)
    assert 0 < bound - approx <= k / (p * rate)
    with pytest.raises(UsageError, match="P = nK"):
        kfamily.k_async_shifted_exp_bound(shift, rate, 3, p)


def test_k_async_simulation_is_exact_for_the_exponential(rng, mc):
    model = parse_delay("exp:rate=1")
    for k in (2, 5, P):
        mean, stderr = simulate_k_async(model, k, rng)
        mc.within(kfamily.k_async_bound(model, k, P).value, mean, stderr)


def test_k_async_with_k_1_is_async(rng, mc):
    model = parse_delay("uniform:low=0.5,high=1.5")
    mean, stderr = simulate_k_async(model, 1, rng, iterations=800)
    mc.within(kfamily.async_time(model, P), mean, stderr)


@pytest.mark.parametrize("k", [2, 4])
def test_lemmas_3_and_4_bound_k_async_for_shifted_exponential(k, rng):
    shift, rate = 1.0, 1.0
    model = parse_delay(f"shifted-exp:shift={shift},rate={rate}")
    mean, stderr = simulate_k_async(model, k, rng)
    lemma_3 = kfamily.k_async_bound(model, k, P).value
    lemma_4 = kfamily.k_async_shifted_exp_bound(shift, rate, k, P)
    assert mean <= min(lemma_3, lemma_4) + 4 * stderr
    # and the bounds are not vacuous: K-async beats the K-sync runtime here
    assert mean < lemma_3


def test_k_batch_sync_simulation_is_erlang_for_the_exponential(rng, mc):
    rate = 2.0
    jobs = parse_delay(f"exp:rate={rate}").sample(rng, (8000, P, 4))
    ks = np.arange(1, P + 1)
    mean, stderr, enough = k_batch_sync_iteration_times(jobs, ks)
    assert enough[: P // 2].all()
    exact = ks / (P * rate)  # Erlang(K, P mu), Eq. (10)
    mc.within(exact[enough], mean[enough], stderr[enough])


@pytest.mark.parametrize("spec", ["uniform:low=0.5,high=1.5", "shifted-exp:shift=1,rate=1"])
def test_lemma_2_bounds_k_batch_sync(spec, rng):
    model = parse_delay(spec)
    ks = np.arange(1, P + 1)
    mean, stderr, enough = k_batch_sync_iteration_times(model.sample(rng, (4000, P, 6)), ks)
    assert enough.all()
    bound = np.array([kfamily.k_batch_sync_bound(model, k, P).value for k in ks])
    assert np.all(mean <= bound + 4 * stderr)
    assert kfamily.k_sync_time(model, 1, P).value == pytest.approx(bound[0])


def test_cap_check_flags_too_few_jobs(rng):
    jobs = parse_delay("exp:rate=1").sample(rng, (500, P, 1))
    _, _, enough = k_batch_sync_iteration_times(jobs, [1, P])
    assert enough[0] and not enough[1]


@pytest.mark.parametrize("spec", ["uniform:low=0.5,high=1.5", "pareto:shape=3,scale=1"])
def test_lemma_5_against_a_renewal_simulation(spec, rng, mc):
    """Superpose P renewal processes; every K arrivals are one K-batch-async iteration."""
    model, k = parse_delay(spec), 3
    estimates = []
    for _ in range(40):
        arrivals = np.cumsum(model.sample(rng, (600, P)), axis=0)
        horizon = arrivals[-1].min()  # every arrival before it has been sampled
        estimates.append(k * horizon / np.count_nonzero(arrivals <= horizon))
    mean, stderr = mc.mean(np.array(estimates))
    mc.within(kfamily.k_batch_async_time(model, k, P), mean, stderr)
    plug_in, plug_in_se = k_batch_async_iteration_time(model.sample(rng, (20_000, P)), k)
    mc.within(kfamily.k_batch_async_time(model, k, P), plug_in, plug_in_se)


def test_table_ii_matches_the_single_formulas():
    model = parse_delay("uniform:low=1,high=2")
    table = kfamily.table_ii(model, P, [1, 3, P])
    for i, k in enumerate(table.k):
        assert table.k_sync[i] == pytest.approx(kfamily.k_sync_time(model, k, P).value)
        assert table.k_batch_sync[i] == pytest.approx(kfamily.k_batch_sync_bound(model, k, P).value)
        assert table.k_batch_async[i] == kfamily.k_batch_async_time(model, k, P)
    assert not table.bounds_exact and kfamily.table_ii(parse_delay("exp:rate=1"), P).bounds_exact


@pytest.mark.parametrize(
    ("spec", "expected"), [("exp:rate=2", 0.5), ("uniform:low=0,high=1", 1 / 3)]
)
def test_equilibrium_residual_mean_is_second_moment_over_twice_the_mean(spec, expected, rng, mc):
    pool = parse_delay(spec).sample(rng, (50_000, 1))
    mean, stderr = mc.mean(equilibrium_residuals(pool, 50_000, rng).ravel())
    mc.within(expected, mean, stderr)


def test_table_draw_reads_job_index_of_each_worker():
    jobs = np.arange(2 * 3 * 4, dtype=float).reshape(2, 3, 4)
    draw = table_draw(jobs)
    got = draw(np.array([[0, 3], [1, 2]]), np.array([[2, 1], [0, 2]]))
    np.testing.assert_array_equal(
        got, [[jobs[0, 2, 0], jobs[0, 1, 3]], [jobs[1, 0, 1], jobs[1, 2, 2]]]
    )


def test_k_out_of_range_is_refused():
    with pytest.raises(UsageError):
        kfamily.k_sync_time(parse_delay("exp:rate=1"), P + 1, P)
