"""theory.scale_mixture: the law of s X, s ~ U(low, high), against adaptive quadrature of its
definition, its own inverse, its moments, and a Monte Carlo of the heterogeneous pattern."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import integrate

from tailtrain.delays import DelayProcess, parse_delay, parse_pattern
from tailtrain.delays.atomic import AtomicDelay
from tailtrain.theory.families import closed_form
from tailtrain.theory.order_stats import expected_order_stats
from tailtrain.theory.scale_mixture import ScaleMixture

LAWS = [
    "exp:rate=1",
    "uniform:low=0.5,high=1.5",
    "lognormal:mu=0,sigma=0.5",
    "const:value=0.5+dropcompute-noise:scale=0.5",
]


@pytest.mark.parametrize("spec", LAWS)
def test_cdf_is_the_integral_over_the_speeds(spec):
    base = parse_delay(spec)
    law = ScaleMixture(base, 1.0, 1.5)
    x = np.array([0.3, 0.7, 1.0, 1.6, 3.0, 10.0])

    def by_quad(v: float) -> float:
        return integrate.quad(lambda s: float(base.cdf(v / s)), 1.0, 1.5, epsabs=1e-13)[0] / 0.5

    reference = [by_quad(v) for v in x]
    np.testing.assert_allclose(law.cdf(x), reference, atol=1e-9)


@pytest.mark.parametrize("spec", LAWS)
def test_quantile_inverts_the_cdf(spec):
    law = ScaleMixture(parse_delay(spec), 1.0, 1.5)
    u = np.array([1e-6, 0.01, 0.3, 0.5, 0.9, 0.999, 1 - 1e-6])
    assert np.all(np.diff(law.quantile(u)) > 0)
    np.testing.assert_allclose(law.cdf(law.quantile(u)), u, rtol=1e-5, atol=1e-9)


def test_a_constant_scaled_by_a_uniform_speed_is_uniform():
    """The atom of const:value=2 is integrated exactly: s 2 ~ U(2, 3)."""
    law = ScaleMixture(parse_delay("const:value=2"), 1.0, 1.5)
    x = np.array([1.0, 2.0, 2.25, 2.5, 2.99, 3.0, 4.0])
    np.testing.assert_allclose(law.cdf(x), np.clip(x - 2.0, 0.0, 1.0), atol=1e-12)
    assert law.mean == 2.5 and law.var == pytest.approx(1 / 12)
    np.testing.assert_allclose(law.quantile([0.25, 0.5]), [2.25, 2.5], rtol=1e-4)


def test_moments_match_a_sample_and_the_law_is_no_closed_form(rng):
    law = ScaleMixture(parse_delay("gamma:shape=2,rate=1"), 1.0, 1.5)
    draws = law.sample(rng, 400_000)
    assert draws.mean() == pytest.approx(law.mean, rel=5e-3)
    assert draws.var() == pytest.approx(law.var, rel=1e-2)
    assert closed_form(law) is None  # never mistaken for the gamma it scales


def test_expected_max_is_the_heterogeneous_patterns_sync_time(rng, mc):
    """Within one iteration the pattern's N workers are N i.i.d. draws of the mixture, so
    E[max] of the mixture is the Monte Carlo of the pattern over fresh runs (one iteration
    each: a run's speeds are drawn once)."""
    n, runs = 500, 3000
    base = parse_delay("exp:rate=1")
    pattern = parse_pattern("heterogeneous:low=1,high=1.5")
    children = rng.spawn(runs)
    draws = [DelayProcess(base, pattern, c, n).next_block(1).max() for c in children]
    mean, stderr = mc.mean(draws)
    law = ScaleMixture(base, 1.0, 1.5)
    mc.within(expected_order_stats(law, n, [n]).mean[0], mean, stderr)


ATOM_BASES = [
    parse_delay("const:value=0.1"),
    AtomicDelay("lattice", [0.1, 0.25], [0.3, 0.7]),  # two atoms whose ranges overlap
    AtomicDelay("lattice", [0.1, 1.0], [0.4, 0.6]),  # ... and apart: F is flat between
    parse_delay("bernoulli:p=0.5,value=0.45"),  # an atom at 0
]


@pytest.mark.parametrize("base", ATOM_BASES, ids=["const", "overlap", "gap", "zero-atom"])
def test_an_atom_only_base_has_the_exact_quantile_down_to_tiny_u(base):
    """Atoms only: F is piecewise linear between the points 0.5 a and 3 a, so the quantile
    inverts it exactly, also below u ~ 6e-5 where a table clipped at its first point."""
    law = ScaleMixture(base, 0.5, 3.0)
    u = np.logspace(-9, 0, 200) * (1 - 1e-9)  # [1e-9, 1 - 1e-9]
    u = np.concatenate([u, 1 - u])
    zero = base.cdf(0.0)
    u = u[u > zero]  # the atom at 0 takes u <= its mass, all to x = 0
    np.testing.assert_allclose(law.cdf(law.quantile(u)), u, rtol=1e-7, atol=0)
    values, probs = base.atoms
    # the cdf is the sum of the atoms' uniforms on [0.5 a, 3 a], by definition
    x = np.linspace(0.0, 3.5, 101)
    parts = [
        p * (np.clip((x / a - 0.5) / 2.5, 0, 1) if a else x >= 0)
        for a, p in zip(values, probs, strict=True)
    ]
    np.testing.assert_allclose(law.cdf(x), np.sum(parts, axis=0), atol=1e-15)
    assert np.all(law.quantile([0.0, zero]) == (0.0 if zero else 0.5 * values.min()))


def test_a_constant_base_quantile_is_the_uniforms():
    """const:value=0.1 on U(0.5, 3) is U(0.05, 0.3): Q(1e-6) = 0.05 + 2.5e-7 (the review's
    case, which the table gave as 0.0500153)."""
    law = ScaleMixture(parse_delay("const:value=0.1"), 0.5, 3.0)
    u = np.logspace(-9, 0, 50)
    np.testing.assert_allclose(law.quantile(u), 0.05 + 0.25 * u, rtol=1e-12)
    assert law.quantile(1e-6) == pytest.approx(0.05000025, rel=1e-12)
