"""Large-N K-async and K-batch-sync (theory.meanfield, the tail chain of theory.montecarlo)
against exponential closed forms and against the step-by-step Monte Carlo at moderate N."""

from __future__ import annotations

import numpy as np
import pytest

from tailtrain.delays import parse_delay
from tailtrain.errors import UsageError
from tailtrain.theory.meanfield import (
    k_async_mean_field,
    k_async_mean_field_mixed,
    k_batch_sync_mean_field,
)
from tailtrain.theory.montecarlo import (
    equilibrium_residuals,
    k_async_iteration_time,
    k_async_tail_iteration_time,
    k_batch_sync_iteration_times,
)
from tailtrain.theory.order_stats import exponential_order_stats

LAWS = ["uniform:low=0.5,high=1.5", "lognormal:mu=0,sigma=1", "pareto:shape=2.5,scale=1"]


def step_by_step_k_async(model, n, k, rng, chains=16, measured=200):
    """The Monte Carlo ``predict`` uses below LARGE_N: every finish time, K restarts a step."""
    warmup = n // k + 10
    first = equilibrium_residuals(model.sample(rng, (4096, 1)), chains * n, rng)
    draw = lambda workers, index: model.sample(rng, workers.shape)  # noqa: E731
    return k_async_iteration_time(first.reshape(chains, n), draw, k, warmup + measured, warmup)


@pytest.mark.parametrize("k", [2, 4, 125_000, 500_000, 875_000])
def test_k_async_mean_field_is_the_exponential_order_statistic_at_large_n(k, rng):
    """For Exp(mu), K-async is exactly E[X_{K:N}] (Theorem 2's proof); the limit differs by
    O(1/(N - K)) relative, below 1e-5 here."""
    n, rate = 10**6, 2.0
    jobs = rng.exponential(1 / rate, 2**16)
    tau, stderr = k_async_mean_field(jobs, 1 / rate, n, [k])
    exact = exponential_order_stats(rate, n, [k])[0]
    assert abs(tau[0] - exact) <= 4 * stderr[0] + 1e-5 * exact
    assert k / (n * rate) <= tau[0] <= k / ((n - k) * rate)  # the renewal-reward bracket


@pytest.mark.parametrize("spec", LAWS)
@pytest.mark.parametrize(("n", "k"), [(200, 2), (200, 100), (2000, 4), (2000, 1000), (2000, 1750)])
def test_k_async_mean_field_agrees_with_the_step_by_step_monte_carlo(spec, n, k, rng):
    """Within sampling error plus the limit's O(1/N) bias (1/N relative allowed)."""
    model = parse_delay(spec)
    mean, mc_stderr = step_by_step_k_async(model, n, k, rng)
    tau, stderr = k_async_mean_field(model.sample(rng, 2**16), model.mean, n, [k])
    assert abs(tau[0] - mean) <= 4 * np.hypot(stderr[0], mc_stderr) + mean / n


def test_k_async_mean_field_refuses_k_equal_to_n():
    with pytest.raises(UsageError, match="K < N"):
        k_async_mean_field(np.ones(10), 1.0, 8, [8])


@pytest.mark.parametrize("k", [1000, 999, 990])
def test_tail_chain_is_exact_for_the_exponential_near_k_equal_n(k, rng):
    exact = exponential_order_stats(1.0, 1000, [k])[0]
    mean, stderr = k_async_tail_iteration_time(lambda u: -np.log1p(-u), 1000, k, rng)
    assert abs(mean - exact) <= 4 * stderr


@pytest.mark.parametrize("spec", LAWS)
@pytest.mark.parametrize("k", [199, 190])
def test_tail_chain_agrees_with_the_step_by_step_monte_carlo(spec, k, rng):
    model = parse_delay(spec)
    mean, mc_stderr = step_by_step_k_async(model, 200, k, rng, measured=400)
    tail, stderr = k_async_tail_iteration_time(model.quantile, 200, k, rng)
    assert abs(tail - mean) <= 4 * np.hypot(stderr, mc_stderr)


def test_k_batch_sync_mean_field_is_eq_10_for_the_exponential(rng):
    """m(t) = mu t for Exp(mu) jobs, so t* = K / (N mu) (slow-and-stale Eq. 10)."""
    n, rate, ks = 10**6, 3.0, np.array([50_000, 500_000, 10**6])
    value, stderr, enough = k_batch_sync_mean_field(rng.exponential(1 / rate, (2**17, 24)), n, ks)
    assert enough.all()
    np.testing.assert_array_less(np.abs(value - ks / (n * rate)), 4 * stderr)


@pytest.mark.parametrize("spec", [*LAWS, "const:value=0.5+dropcompute-noise:scale=0.5"])
def test_k_batch_sync_mean_field_agrees_with_the_monte_carlo(spec, rng):
    model, n, ks = parse_delay(spec), 2000, np.array([250, 1000, 1999, 2000])
    mean, mc_stderr, long_enough = k_batch_sync_iteration_times(model.sample(rng, (300, n, 8)), ks)
    value, stderr, enough = k_batch_sync_mean_field(model.sample(rng, (2**17, 8)), n, ks)
    assert long_enough.all() and enough.all()
    np.testing.assert_array_less(np.abs(value - mean), 4 * np.hypot(stderr, mc_stderr) + mean / n)


def test_k_batch_sync_mean_field_says_when_sequences_are_too_short(rng):
    _, _, enough = k_batch_sync_mean_field(rng.exponential(1.0, (2**12, 2)), 100, [100])
    assert not enough.any()


def step_by_step_k_async_with_speeds(model, n, k, speeds, rng, chains=16, measured=200):
    """The step-by-step Monte Carlo with worker n at its own speed for the whole run (the
    heterogeneous pattern): chains draw their own speeds; jobs and residuals scale by them."""
    warmup = n // k + 10
    speed = rng.uniform(*speeds, size=(chains, n))
    first = equilibrium_residuals(model.sample(rng, (4096, 1)), chains * n, rng)
    rows = np.arange(chains)[:, None]
    draw = lambda workers, index: speed[rows, workers] * model.sample(rng, workers.shape)  # noqa: E731
    return k_async_iteration_time(
        speed * first.reshape(chains, n), draw, k, warmup + measured, warmup
    )


def test_mixed_mean_field_with_one_class_is_the_iid_one(rng):
    jobs = rng.exponential(1.0, 2**14)
    one = k_async_mean_field(jobs, 1.0, 10**6, [2, 1000, 500_000])
    mixed = k_async_mean_field_mixed(jobs[None], np.ones(1), np.ones(1), 10**6, [2, 1000, 500_000])
    np.testing.assert_allclose(mixed, one, rtol=1e-12)


@pytest.mark.parametrize("spec", ["exp:rate=1", "uniform:low=0.5,high=1.5"])
@pytest.mark.parametrize("k", [4, 1000, 1750])
def test_mixed_mean_field_agrees_with_the_step_by_step_monte_carlo(spec, k, rng):
    """Workers at speeds U(1, 1.5) kept for the whole run, N = 2000; the speeds' law on 12
    Gauss-Legendre classes. Within sampling error plus the limit's O(1/N) bias."""
    n, model = 2000, parse_delay(spec)
    mean, mc_stderr = step_by_step_k_async_with_speeds(model, n, k, (1.0, 1.5), rng)
    x, w = np.polynomial.legendre.leggauss(12)
    speed = 1.0 + 0.5 * (x + 1) / 2
    jobs = speed[:, None] * model.sample(rng, 2**14)
    tau, stderr = k_async_mean_field_mixed(jobs, speed * model.mean, w / 2, n, [k])
    assert abs(tau[0] - mean) <= 4 * np.hypot(stderr[0], mc_stderr) + mean / n
    # the renewal-reward bracket's lower end: K / (N E[1 / E[J_s]])
    assert tau[0] >= k / (n * np.sum(w / 2 / (speed * model.mean))) * (1 - 1e-12)
