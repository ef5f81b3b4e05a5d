"""The law of a sum of M i.i.d. micro-batch times (theory.sums) against closed forms and an
independent Monte Carlo of the definition (sort N sums of M draws, take the K-th)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from tailtrain.delays import parse_delay
from tailtrain.delays.parametric import ScipyDelay
from tailtrain.prediction import DelayScenario, predict
from tailtrain.theory.order_stats import expected_order_stats
from tailtrain.theory.sums import FFT, SPLIT, partial_sum_laws


def _unnamed(frozen) -> ScipyDelay:
    """A law whose spec names no closed-form family, so the split convolution is used."""
    return ScipyDelay("unnamed", frozen, lambda rng, shape: frozen.rvs(shape, random_state=rng))


@pytest.mark.parametrize(
    ("frozen", "exact"),
    [
        (stats.expon(), lambda j: stats.gamma(j)),
        (stats.norm(10, 1), lambda j: stats.norm(10 * j, np.sqrt(j))),
    ],
)
@pytest.mark.parametrize("m", [4, 12])
def test_split_sum_matches_closed_form(frozen, exact, m: int) -> None:
    law = partial_sum_laws(_unnamed(frozen), m)[-1]
    assert law.method == SPLIT
    ref = exact(m)
    # upper tail down to 1e-18 (the order statistics of 10^6 draws reach there)
    p = np.array([1e-3, 1e-6, 1e-9, 1e-12, 1e-15, 1e-18])
    x = ref.isf(p)
    assert np.allclose(1 - law.cdf(x[:2]), p[:2], rtol=2e-3)
    sf = np.exp(law.table.lsf(x))
    assert np.allclose(sf, p, rtol=2e-3)
    q = np.array([1e-6, 1e-3, 0.1, 0.5, 0.9, 1 - 1e-3, 1 - 1e-6, 1 - 1e-10])
    assert np.allclose(law.quantile(q), ref.ppf(q), rtol=6e-3)  # body: see theory.sums
    n = 10**6
    got = expected_order_stats(law, n, [1, n // 2, n]).mean
    want = expected_order_stats(ScipyDelay("x", ref, None), n, [1, n // 2, n]).mean
    assert np.allclose(got, want, rtol=4e-3)


LAWS = [
    ("lognormal:mu=0,sigma=0.5", SPLIT),
    ("pareto:shape=3,scale=1", SPLIT),
    ("uniform:low=0.5,high=1.5", FFT),
    ("const:value=0.5+dropcompute-noise:scale=0.5", FFT),
]


@pytest.mark.parametrize(("spec", "method"), LAWS)
@pytest.mark.parametrize("m", [4, 12])
def test_order_stats_of_sum_match_monte_carlo(spec: str, method: str, m: int) -> None:
    model, n, reps = parse_delay(spec), 1000, 400
    law = partial_sum_laws(model, m)[-1]
    assert law.method == method
    ks = np.array([1, 500, 990, 1000])
    got = expected_order_stats(law, n, ks).mean
    rng = np.random.default_rng(7)
    draws = np.sort(model.sample(rng, (reps, n, m)).sum(axis=2), axis=1)[:, ks - 1]
    mean, err = draws.mean(axis=0), draws.std(axis=0, ddof=1) / np.sqrt(reps)
    assert np.all(np.abs(got - mean) <= 4 * err + 1e-9 * mean), (got, mean, err)


@pytest.mark.parametrize(("spec", "method"), LAWS)
def test_partial_sums_cdf(spec: str, method: str) -> None:
    """P(S_m <= x) for every m (DropCompute's E[M~]) against a DKW band on samples."""
    model = parse_delay(spec)
    laws = partial_sum_laws(model, 4)
    draws = np.cumsum(model.sample(np.random.default_rng(3), (200_000, 4)), axis=1)
    for j, law in enumerate(laws):
        x = np.quantile(draws[:, j], [0.01, 0.2, 0.5, 0.8, 0.99])
        empirical = (draws[:, j, None] <= x).mean(axis=0)
        assert np.allclose(law.cdf(x), empirical, atol=0.006)


def test_predict_rows_name_the_sum_method() -> None:
    """sync and DropCompute from the numerical sum agree with their Monte Carlo (below the
    large-N search, with a pattern-free scenario simulated at small N) and say how."""
    delay = parse_delay("lognormal:mu=0,sigma=0.5")
    rows = {r.strategy: r for r in predict(DelayScenario(20000, delay, micro_batches=4)).rows}
    assert rows["sync"].method.startswith(SPLIT)
    assert rows["dropcompute"].method.startswith(SPLIT)
    # Monte Carlo of the same quantities (sorted sums) at N = 20000
    rng = np.random.default_rng(11)
    t = delay.sample(rng, (60, 20000, 4))
    sync = t.sum(axis=2).max(axis=1)
    assert abs(rows["sync"].iteration_time - sync.mean()) < 4 * sync.std(ddof=1) / np.sqrt(60)
    tau = rows["dropcompute"].threshold
    clipped = np.minimum(sync, tau)
    assert abs(rows["dropcompute"].iteration_time - clipped.mean()) < 1e-3 + 4 * clipped.std(
        ddof=1
    ) / np.sqrt(60)
