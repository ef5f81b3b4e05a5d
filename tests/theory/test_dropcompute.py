"""DropCompute: Bailey's E[T], E[M~], S_eff, the analytic tau* and Algorithm 2."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tailtrain.delays import parse_delay
from tailtrain.prediction.context import _Context
from tailtrain.prediction.scenario import DelayScenario
from tailtrain.theory import dropcompute as dc
from tailtrain.theory.families import closed_form
from tailtrain.theory.order_stats import expected_order_stat

#: Bailey's overestimate of E[max of n standard normals] for n >= 16 (documented in the
#: docstring of bailey_expected_max and checked below against quadrature)
BAILEY_BIAS = 0.035


def normal_times(rng, iterations, workers, m, mu=1.0, sigma=0.2):
    return rng.normal(mu, sigma, (iterations, workers, m))


def algorithm_2_by_the_book(t, comm, thresholds):
    """Algorithm 2 of DropCompute App. C.1, loop for loop (reference for the vectorised one)."""
    iterations, workers, m = t.shape
    curve = []
    for tau in thresholds:
        speedups = []
        for i in range(iterations):
            completed, step = 0.0, 0.0
            for n in range(workers):
                elapsed = 0.0
                for j in range(m):
                    elapsed += t[i, n, j]
                    completed += (1.0 if elapsed < tau else 0.0) / workers
                step = max(step, elapsed)
            speedups.append((step + comm[i]) / (min(tau, step) + comm[i]) * completed / m)
        curve.append(np.mean(speedups))
    return np.array(curve)


@pytest.mark.parametrize("n", [16, 64, 200, 1000])
def test_bailey_bias_against_quadrature(n):
    exact = expected_order_stat(parse_delay("normal:mean=0,std=1"), n, n).value
    assert 0 < dc.bailey_expected_max(0.0, 1.0, n) - exact < BAILEY_BIAS


def test_bailey_against_simulated_max_of_normal_sums(rng, mc):
    mu, sigma, workers, m = 1.0, 0.2, 64, 12
    t = normal_times(rng, 4000, workers, m, mu, sigma)
    mean, stderr = mc.mean(t.sum(axis=2).max(axis=1) + 0.3)
    bailey = dc.bailey_iteration_time(mu, sigma, workers, m, comm=0.3)
    # Eq. (7) is an approximation: its known bias is added to the Monte Carlo tolerance
    assert abs(bailey - mean) <= mc.z * stderr + BAILEY_BIAS * sigma * np.sqrt(m)
    exact = expected_order_stat(closed_form(parse_delay("normal:mean=1,std=0.2")).sum_of(m), 64, 64)
    mc.within(exact.value + 0.3, mean, stderr)


def test_expected_completed_against_simulation(rng, mc):
    mu, sigma, m = 1.0, 0.3, 12
    t = normal_times(rng, 2000, 32, m, mu, sigma)
    done = np.cumsum(t, axis=2)
    for tau in (6.0, 10.5, 12.0, 13.0):
        mean, stderr = mc.mean((done < tau).sum(axis=2).mean(axis=1))
        mc.within(dc.expected_completed(tau, mu, sigma, m), mean, stderr)


def test_eq_11_given_e_t_against_algorithm_2(rng, mc):
    mu, sigma, workers, m, comm = 1.0, 0.2, 64, 12, 0.5
    t = normal_times(rng, 4000, workers, m, mu, sigma)
    step = t.sum(axis=2).max(axis=1)
    for tau in (11.0, 12.0):
        per_iteration = (np.cumsum(t, axis=2) < tau).mean(axis=(1, 2)) * (step + comm)
        mean, stderr = mc.mean(per_iteration / (np.minimum(tau, step) + comm))
        curve, _ = dc.empirical_speedup(t, np.full(4000, comm), [tau])
        assert curve[0] == pytest.approx(mean, rel=1e-12)
        analytic = dc.analytic_speedup(tau, mu, sigma, workers, m, comm, iteration_time=step.mean())
        mc.within(analytic, mean, stderr)


def test_analytic_threshold_maximises_eq_11():
    mu, sigma, workers, m, comm = 1.0, 0.3, 128, 12, 0.4
    tau, speedup = dc.analytic_threshold(mu, sigma, workers, m, comm)
    upper = dc.bailey_iteration_time(mu, sigma, workers, m)
    grid = np.linspace(m * mu / 2, upper, 20_000)
    assert speedup >= dc.analytic_speedup(grid, mu, sigma, workers, m, comm).max() - 1e-12
    assert m * mu / 2 <= tau <= upper and speedup > 1


def test_vectorised_algorithm_2_equals_the_loops(rng):
    t = rng.exponential(1.0, (5, 4, 3))
    comm = rng.uniform(0, 1, 5)
    thresholds = np.array([0.5, 1.0, 2.0, 3.0, 4.5, 100.0])
    curve, _ = dc.empirical_speedup(t, comm, thresholds)
    np.testing.assert_allclose(curve, algorithm_2_by_the_book(t, comm, thresholds), rtol=1e-12)
    choice = dc.empirical_threshold(t, comm, thresholds)
    assert choice.effective_speedup == pytest.approx(curve.max(), rel=1e-12)


def test_empirical_threshold_on_a_fine_search(rng):
    t = rng.lognormal(-1.0, 0.9, (300, 32, 8)) + 0.4
    comm = np.full(300, 0.2)
    choice = dc.empirical_threshold(t, comm)
    brute = np.linspace(choice.threshold * 0.5, choice.threshold * 1.5, 3000)
    assert choice.effective_speedup >= dc.empirical_speedup(t, comm, brute)[0].max() - 1e-3
    assert choice.effective_speedup > 1 and 0 < choice.drop_rate < 0.5


def test_exact_speedup_against_simulation(rng, mc):
    """Exp micro-batches: partial sums are gamma, so Eq. (6) in expectation is exact."""
    model, workers, m, comm = parse_delay("exp:rate=2"), 16, 6, 0.25
    sums = [closed_form(model).sum_of(j) for j in range(1, m + 1)]
    t = model.sample(rng, (20_000, workers, m))
    for tau in (2.0, 3.0, 4.0):
        exact = dc.exact_speedup(sums, workers, tau, comm)
        found = dc.evaluate_threshold(t, np.full(t.shape[0], comm), tau)
        mc.within(exact.effective_speedup, found.effective_speedup, found.stderr)
        mc.within(exact.iteration_time, found.iteration_time, found.iteration_time_stderr)


def test_exact_threshold_is_the_best_on_a_grid():
    model, workers, m = parse_delay("gamma:shape=2,rate=4"), 32, 8
    sums = [closed_form(model).sum_of(j) for j in range(1, m + 1)]
    best = dc.exact_threshold(sums, workers, comm=0.1)
    top = expected_order_stat(sums[-1], workers, workers).value
    grid = np.linspace(m * model.mean / 2, sums[-1].quantile(0.99999), 60)
    values = [
        dc.exact_speedup(sums, workers, tau, 0.1, expected_max=top).effective_speedup
        for tau in grid
    ]
    assert best.effective_speedup >= max(values) - 1e-9


def test_exact_threshold_of_an_atomic_law_is_its_curve_s_argmax():
    """A Bernoulli micro-batch (DropCompute App. C.3, Fig. 13c: 0.45 s + 0.45 Br(0.5), M = 12,
    N = 1024): the sum's atoms put a peak just past each one, and tau* is the highest of
    them, 6.30 s (23.2% dropped), not the first peak the coarse grid found (5.85 s, 28.7%)."""
    model = parse_delay("const:value=0.45+bernoulli:p=0.5,value=0.45")
    context = _Context.build(DelayScenario(workers=1024, delay=model, micro_batches=12))
    sums = context.partial_sums
    best = dc.exact_threshold(sums, 1024)
    past_atoms = 5.4 + 0.45 * np.arange(13) + 1e-7
    values = [dc.exact_speedup(sums, 1024, tau).effective_speedup for tau in past_atoms]
    assert best.effective_speedup >= max(values) - 1e-6
    assert best.threshold == pytest.approx(past_atoms[int(np.argmax(values))], abs=1e-3)
    assert best.drop_rate == pytest.approx(0.2316, abs=1e-3)


@settings(max_examples=30, deadline=None)
@given(
    mu=st.floats(0.1, 5),
    cv=st.floats(0.01, 1),
    workers=st.integers(1, 500),
    m=st.integers(1, 64),
    comm=st.floats(0, 10),
)
def test_analytic_speedup_tends_to_one(mu, cv, workers, m, comm):
    tau = 1e6 * m * mu * (1 + cv)
    assert dc.analytic_speedup(tau, mu, cv * mu, workers, m, comm) == pytest.approx(1.0, abs=1e-12)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), shape=st.tuples(*(st.integers(1, 6),) * 3))
def test_empirical_speedup_is_one_above_every_step(seed, shape):
    rng = np.random.default_rng(seed)
    t = rng.lognormal(0, 1, shape)
    comm = rng.uniform(0, 1, shape[0])
    above = np.cumsum(t, axis=2).max() * np.array([1.000001, 2.0, 1e9])
    curve, share = dc.empirical_speedup(t, comm, above)
    np.testing.assert_allclose(curve, 1.0, rtol=1e-12)
    np.testing.assert_allclose(share, 1.0, rtol=1e-12)
    assert dc.empirical_threshold(t, comm).effective_speedup >= 1.0


def test_exact_speedup_tends_to_one():
    sums = [closed_form(parse_delay("exp:rate=1")).sum_of(j) for j in (1, 2, 3)]
    assert dc.exact_speedup(sums, 8, 1e4, 0.1).effective_speedup == pytest.approx(1.0, abs=1e-9)


def carried_rate_by_the_book(t, comm, shares, tau):
    """Completed micro-batches per second with the cut carried, loop for loop."""
    completed, seconds = 0, 0.0
    for i in range(t.shape[0]):
        step = 0.0
        for n in range(t.shape[1]):
            elapsed = 0.0
            for j in range(shares[n]):
                elapsed += t[i, n, j]
                completed += elapsed < tau
            step = max(step, elapsed)
        seconds += min(tau, step) + comm[i]
    return completed / seconds


@settings(max_examples=25, deadline=None)
@given(
    st.integers(0, 2**31 - 1),
    st.integers(1, 6),
    st.integers(1, 4),
    st.lists(st.integers(1, 5), min_size=1, max_size=4),
)
def test_carried_threshold_is_the_best_rate_of_completed_micro_batches(
    seed, iterations, width, shares
):
    """Its tau is the largest whose rate is within CARRIED_TOLERANCE of the best over every
    candidate: each partial sum (just above it) and points in between, where the rate only
    falls."""
    rng = np.random.default_rng(seed)
    shares = np.array(shares)
    t = rng.lognormal(0.0, 0.7, (iterations, shares.size, max(width, shares.max())))
    comm = rng.uniform(0.0, 0.5, iterations)
    tau = dc.carried_threshold(t, comm, shares)
    sums = np.cumsum(t, axis=2).ravel()
    candidates = [*np.nextafter(sums, np.inf), *(sums * 1.001), *(sums * 0.999)]
    rates = {c: carried_rate_by_the_book(t, comm, shares, c) for c in candidates}
    best = max(rates.values())
    near = best * (1 - dc.CARRIED_TOLERANCE) * (1 - 1e-12)
    assert carried_rate_by_the_book(t, comm, shares, tau) >= near
    # of the candidates (just above a partial sum) no larger one is that close; above every
    # step's time nothing is cut and the rate is constant: tau stops there
    ends = [np.cumsum(t[i, n, : shares[n]]) for i in range(iterations) for n in range(shares.size)]
    top = max(e[-1] for e in ends)
    above = [c for c in np.nextafter(np.concatenate(ends), np.inf) if tau < c <= top]
    assert all(carried_rate_by_the_book(t, comm, shares, c) < near for c in above)


def test_carried_threshold_cuts_nothing_when_waiting_wastes_no_time():
    """Constant times and equal shares: nobody waits, and any cut wastes a partial unit."""
    t = np.ones((3, 4, 5))
    tau = dc.carried_threshold(t, np.zeros(3), np.full(4, 5))
    assert tau > 5.0 and tau == np.nextafter(5.0, np.inf)
