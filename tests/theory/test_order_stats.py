"""E[X_{k:n}]: exact for the exponential, quadrature otherwise, Monte Carlo for traces."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import special, stats

from tailtrain.delays import parse_delay
from tailtrain.delays.atomic import AtomicDelay
from tailtrain.errors import UsageError
from tailtrain.theory.estimate import EXACT, NUMERICAL
from tailtrain.theory.order_stats import expected_order_stat, expected_order_stats

MODELS = [
    "normal:mean=1,std=0.2",
    "uniform:low=0.5,high=2",
    "lognormal:mu=-1,sigma=0.8",
    "gamma:shape=2,rate=3",
    "pareto:shape=3,scale=1",
    "bernoulli:p=0.3,value=2",
    "const:value=0.5+dropcompute-noise:scale=0.5",
]


@pytest.mark.parametrize("rate", [1.0, 2.5])
def test_exponential_is_the_harmonic_sum_exactly(rate):
    n = 16
    stats = expected_order_stats(parse_delay(f"exp:rate={rate}"), n)
    expected = [
        float(sum(Fraction(1, i) for i in range(n - k + 1, n + 1))) / rate for k in range(1, n + 1)
    ]
    assert stats.method == EXACT
    np.testing.assert_allclose(stats.mean, expected, rtol=1e-14)


def test_shifted_exponential_adds_the_shift():
    shifted = expected_order_stats(parse_delay("shifted-exp:shift=0.7,rate=2"), 9)
    plain = expected_order_stats(parse_delay("exp:rate=2"), 9)
    assert shifted.method == EXACT
    np.testing.assert_allclose(shifted.mean, plain.mean + 0.7, rtol=1e-14)


def test_quadrature_matches_the_pareto_closed_form():
    # E[X_{k:n}] = Γ(n+1)Γ(n-k+1-1/a) / (Γ(n-k+1)Γ(n+1-1/a)) for Pareto(a, scale 1)
    a, n = 2.5, 200
    k = np.arange(1, n + 1)
    log_exact = (
        special.gammaln(n + 1)
        + special.gammaln(n - k + 1 - 1 / a)
        - special.gammaln(n - k + 1)
        - special.gammaln(n + 1 - 1 / a)
    )
    stats = expected_order_stats(parse_delay(f"pareto:shape={a},scale=1"), n)
    assert stats.method == NUMERICAL
    np.testing.assert_allclose(stats.mean, np.exp(log_exact), rtol=1e-6)


@pytest.mark.parametrize("spec", MODELS)
def test_quadrature_matches_monte_carlo(spec, rng, mc):
    model, n = parse_delay(spec), 12
    draws = np.sort(np.maximum(model.sample(rng, (20_000, n)), 0.0), axis=1)
    mean, stderr = mc.mean(draws)
    # lattice laws can show no spread at extreme ranks: allow one sample's worth of change
    stderr = np.maximum(stderr, np.ptp(draws) / draws.shape[0])
    stats = expected_order_stats(model, n)
    assert stats.method in (EXACT, NUMERICAL)
    mc.within(stats.mean, mean, stderr)


def test_trace_uses_seeded_monte_carlo(tmp_path, mc):
    seconds = np.array([0.8, 1.0, 1.1, 1.5, 3.0, 0.9, 2.2])
    path = tmp_path / "trace.csv"
    rows = "\n".join(f"{i},{i % 2},{s}" for i, s in enumerate(seconds))
    path.write_text("iteration,worker,seconds\n" + rows + "\n")
    trace = parse_delay(f"trace:path={path}")
    first = expected_order_stats(trace, 5, rng=np.random.default_rng(3), samples=20_000)
    again = expected_order_stats(trace, 5, rng=np.random.default_rng(3), samples=20_000)
    assert first.method == "monte-carlo(n=20000)"
    np.testing.assert_array_equal(first.mean, again.mean)
    # the same empirical law, declared exact, goes through quadrature
    exact = expected_order_stats(AtomicDelay("atoms", seconds, 1.0), 5)
    assert exact.method == NUMERICAL
    mc.within(exact.mean, first.mean, first.stderr)


def test_trace_without_rng_is_refused(tmp_path):
    path = tmp_path / "trace.csv"
    path.write_text("iteration,worker,seconds\n0,0,1.0\n0,1,2.0\n")
    with pytest.raises(UsageError, match="rng"):
        expected_order_stats(parse_delay(f"trace:path={path}"), 3)


@pytest.mark.parametrize(("k", "n"), [(0, 3), (4, 3), (1, 0)])
def test_ranks_out_of_range_are_refused(k, n):
    with pytest.raises(UsageError):
        expected_order_stat(parse_delay("exp:rate=1"), k, n)


@settings(max_examples=15, deadline=None)
@given(spec=st.sampled_from(["exp:rate=1.5", *MODELS[:6]]), n=st.integers(1, 30))
def test_nondecreasing_in_k_and_nonincreasing_in_n(spec, n):
    model = parse_delay(spec)
    here = expected_order_stats(model, n).mean
    more = expected_order_stats(model, n + 1).mean
    slack = 1e-9 * np.abs(more).max()
    assert np.all(np.diff(here) >= -slack)
    # the k-th smallest of n + 1 draws is no larger than the k-th smallest of n
    assert np.all(more[:-1] <= here + slack)


@pytest.mark.parametrize("n", [10**5, 10**6])
def test_large_n_windows_match_closed_forms(n):
    """Above WINDOWED_ABOVE each k has its own window: uniform E = a + (b-a) k/(n+1), Pareto's
    Gamma ratio, and a two-point law's binomial tail, including k near its jump."""
    k = np.unique(np.concatenate([[1, 2, 3], np.geomspace(1, n, 200).astype(int), [n - 1, n]]))
    uniform = expected_order_stats(parse_delay("uniform:low=0.5,high=2"), n, k)
    assert uniform.method == NUMERICAL
    np.testing.assert_allclose(uniform.mean, 0.5 + 1.5 * k / (n + 1), rtol=1e-8)
    a = 2.5
    log_exact = (
        special.gammaln(n + 1)
        + special.gammaln(n - k + 1 - 1 / a)
        - special.gammaln(n - k + 1)
        - special.gammaln(n + 1 - 1 / a)
    )
    pareto = expected_order_stats(parse_delay(f"pareto:shape={a},scale=1"), n, k)
    np.testing.assert_allclose(pareto.mean, np.exp(log_exact), rtol=1e-5)
    jump = np.arange(int(0.7 * n) - 300, int(0.7 * n) + 300, 7)
    two_point = expected_order_stats(parse_delay("bernoulli:p=0.3,value=2"), n, jump)
    np.testing.assert_allclose(two_point.mean, 2 * stats.binom.sf(n - jump, n, 0.3), atol=1e-8)
