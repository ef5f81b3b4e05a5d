"""Every distribution's moments, cdf, pdf and quantile against samples and closed forms."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import integrate, stats

from tailtrain.delays import DelayModel, DropComputeNoise, parse_delay
from tailtrain.delays.dropcompute_noise import ALPHA, BETA

N = 200_000

#: one spec per distribution (finite fourth moment, so the standard errors are meaningful),
#: plus the sums the papers use and sums that need numerical convolution
CATALOGUE = [
    "const:value=0.5",
    "uniform:low=0.1,high=0.9",
    "normal:mean=0.23,std=0.22",
    "exp:rate=4.47",
    "shifted-exp:shift=0.3,scale=0.7",
    "shifted-exp:shift=1,rate=2",
    "pareto:shape=5,scale=1",
    "lognormal:mu=-1.84,sigma=0.83",
    "gamma:shape=1,rate=4.5",
    "gamma:shape=0.5,rate=2",
    "bernoulli:p=0.5,value=0.45",
    "bernoulli:p=0.1,value=2",
    "dropcompute-noise:scale=0.5",
    "const:value=0.5+dropcompute-noise:scale=0.5",
    "const:value=0.45+lognormal:mu=-1.84,sigma=0.83",
    "exp:rate=1+exp:rate=2",
    "bernoulli:p=0.3,value=1+exp:rate=2",
    "uniform:low=0,high=1+normal:mean=1,std=0.1+gamma:shape=2,rate=3",
    "dropcompute-noise:scale=1+dropcompute-noise:scale=0.5",
    "bernoulli:p=0.3,value=1+bernoulli:p=0.5,value=2",
]


def draw(model: DelayModel, n: int = N, seed: int = 1) -> np.ndarray:
    return model.sample(np.random.default_rng(seed), n)


@pytest.mark.parametrize("spec", CATALOGUE)
def test_mean_matches_samples(spec: str, stat) -> None:
    model = parse_delay(spec)
    samples = draw(model)
    assert abs(samples.mean() - model.mean) <= stat.mean_tolerance(samples)


@pytest.mark.parametrize("spec", CATALOGUE)
def test_var_matches_samples(spec: str, stat) -> None:
    model = parse_delay(spec)
    samples = draw(model)
    assert abs(samples.var() - model.var) <= stat.var_tolerance(samples)


@pytest.mark.parametrize("spec", CATALOGUE)
def test_cdf_within_dkw_band_of_samples(spec: str, stat) -> None:
    model = parse_delay(spec)
    samples = draw(model, seed=2)
    assert stat.ecdf_distance(model, samples) <= stat.dkw_epsilon(samples.size)


@pytest.mark.parametrize("spec", CATALOGUE)
def test_quantile_is_generalised_inverse_of_cdf(spec: str) -> None:
    model = parse_delay(spec)
    q = np.linspace(0.001, 0.999, 201)
    x = model.quantile(q)
    slack = 1e-9 if model.method == "closed-form" else 1e-6
    assert np.all(model.cdf(x) >= q - slack)  # F(Q(q)) ≥ q
    assert np.all(model.cdf(x - 1e-6 * (1 + np.abs(x))) <= q + slack)  # nothing smaller works
    assert np.all(np.diff(x) >= 0)


@pytest.mark.parametrize("spec", [s for s in CATALOGUE if not parse_delay(s).atoms[0].size])
def test_quantile_of_cdf_is_identity_for_continuous_models(spec: str) -> None:
    model = parse_delay(spec)
    x = model.quantile(np.linspace(0.01, 0.99, 99))
    tolerance = 1e-9 if model.method == "closed-form" else 1e-4
    np.testing.assert_allclose(model.quantile(model.cdf(x)), x, atol=tolerance, rtol=tolerance)


@pytest.mark.parametrize("spec", CATALOGUE)
def test_pdf_and_atoms_carry_all_the_probability(spec: str) -> None:
    model = parse_delay(spec)
    low, *inner, high = model.quantile([1e-12, 0.25, 0.5, 0.75, 1.0 - 1e-12])
    if low == high:  # a single atom has no continuous part
        continuous = 0.0
    else:
        inner = np.unique(np.clip(inner, low, high))
        continuous, _ = integrate.quad(model.pdf, low, high, points=inner, limit=1000)
    assert continuous + model.atoms[1].sum() == pytest.approx(1.0, abs=1e-3)


@pytest.mark.parametrize("spec", [s for s in CATALOGUE if not parse_delay(s).atoms[0].size])
def test_pdf_is_the_derivative_of_cdf(spec: str) -> None:
    model = parse_delay(spec)
    x = model.quantile(np.linspace(0.05, 0.95, 37))
    h = 1e-4 * (model.quantile(0.75) - model.quantile(0.25))
    slope = (model.cdf(x + h) - model.cdf(x - h)) / (2 * h)
    np.testing.assert_allclose(model.pdf(x), slope, rtol=1e-2, atol=1e-3)


def test_out_of_range_quantiles_are_nan() -> None:
    for spec in ("exp:rate=1", "bernoulli:p=0.5,value=1", "exp:rate=1+exp:rate=1"):
        assert np.isnan(parse_delay(spec).quantile([-0.1, 1.1])).all()


# --- parameterisations from the papers ---------------------------------------------------


def test_pareto_2_1_of_slow_and_stale_has_mean_2_and_infinite_variance() -> None:
    model = parse_delay("pareto:shape=2,scale=1")
    assert model.mean == pytest.approx(2.0)
    assert math.isinf(model.var)
    assert model.support == (1.0, math.inf)
    assert model.cdf(2.0) == pytest.approx(1 - 1 / 4)  # 1 − (scale/x)^shape


def test_pareto_2_1_samples_have_the_right_median_and_tail(stat) -> None:
    model = parse_delay("pareto:shape=2,scale=1")
    samples = draw(model)
    assert stat.ecdf_distance(model, samples) <= stat.dkw_epsilon(samples.size)


def test_exp_rate_is_one_over_mean() -> None:
    model = parse_delay("exp:rate=4")
    assert (model.mean, model.var) == pytest.approx((0.25, 0.0625))


def test_shifted_exp_rate_and_scale_describe_the_same_distribution() -> None:
    by_rate = parse_delay("shifted-exp:shift=0.3,rate=2")
    by_scale = parse_delay("shifted-exp:shift=0.3,scale=0.5")
    x = np.linspace(0, 5, 51)
    np.testing.assert_allclose(by_rate.cdf(x), by_scale.cdf(x))
    assert by_rate.mean == pytest.approx(0.8)


def test_dbw_round_trip_time_is_shift_1_minus_alpha_scale_alpha() -> None:
    """DBW §4.1: 1−α+α·Exp(1) has mean 1 and variance α² for every α."""
    for alpha in (0.1, 0.7, 1.0):
        model = parse_delay(f"shifted-exp:shift={1 - alpha},scale={alpha}")
        assert (model.mean, model.var) == pytest.approx((1.0, alpha**2))
        assert model.support[0] == pytest.approx(1 - alpha)


@pytest.mark.parametrize(
    ("spec", "mean", "var"),
    [  # DropCompute App. C.3, Fig. 13 (a–e) and Fig. 14 (b–f): parameters rounded in the table
        ("lognormal:mu=-1.84,sigma=0.83", 0.225, 0.05),
        ("normal:mean=0.23,std=0.22", 0.225, 0.05),
        ("bernoulli:p=0.5,value=0.45", 0.225, 0.05),
        ("exp:rate=4.47", 0.225, 0.05),
        ("gamma:shape=1,rate=4.5", 0.225, 0.05),
        ("lognormal:mu=-2.04,sigma=1.04", 0.225, 0.1),
        ("lognormal:mu=-2.18,sigma=1.17", 0.225, 0.15),
        ("lognormal:mu=-2.29,sigma=1.26", 0.225, 0.2),
        ("lognormal:mu=-2.38,sigma=1.33", 0.225, 0.25),
        ("lognormal:mu=-2.46,sigma=1.39", 0.225, 0.3),
    ],
)
def test_dropcompute_noise_table_moments(spec: str, mean: float, var: float) -> None:
    model = parse_delay(spec)
    assert model.mean == pytest.approx(mean, abs=0.006)
    assert model.var == pytest.approx(var, rel=0.05)


def test_appendix_c3_base_plus_lognormal_shifts_the_lognormal_exactly() -> None:
    total = parse_delay("const:value=0.45+lognormal:mu=-1.84,sigma=0.83")
    alone = stats.lognorm(s=0.83, scale=math.exp(-1.84))
    x = np.linspace(0.3, 3, 50)
    np.testing.assert_allclose(total.cdf(x), alone.cdf(x - 0.45))
    np.testing.assert_allclose(total.pdf(x), alone.pdf(x - 0.45))
    np.testing.assert_allclose(total.quantile([0.1, 0.9]), alone.ppf([0.1, 0.9]) + 0.45)
    assert total.method == "closed-form" and total.mean == pytest.approx(0.45 + alone.mean())


# --- DropCompute's bounded log-normal noise (App. B.1) ------------------------------------


def test_dropcompute_noise_mean_and_var_match_numerical_integration() -> None:
    model = DropComputeNoise("dropcompute-noise:scale=1", 1.0)
    z = stats.lognorm(s=1.0, scale=math.exp(4.0))
    first = z.expect(lambda v: np.minimum(v / ALPHA, BETA))
    second = z.expect(lambda v: np.minimum(v / ALPHA, BETA) ** 2)
    assert model.mean == pytest.approx(first, rel=1e-7)
    assert model.var == pytest.approx(second - first**2, rel=1e-6)


def test_dropcompute_noise_matches_the_papers_description(stat) -> None:
    """×1.5 longer on average (mean ε ≈ 0.5) and at most 6× longer (β = 5.5), App. B.1."""
    mu = 0.5
    model = parse_delay(f"dropcompute-noise:scale={mu}")
    assert model.mean / mu == pytest.approx(0.5, abs=0.01)
    assert model.support == (0.0, pytest.approx(BETA * mu))
    samples = draw(model)
    assert samples.max() <= BETA * mu
    assert abs(samples.mean() - model.mean) <= stat.mean_tolerance(samples)


def test_dropcompute_noise_has_an_atom_at_the_bound() -> None:
    model = parse_delay("dropcompute-noise:scale=2")
    cap = 2 * BETA
    atom = stats.lognorm(s=1.0, scale=math.exp(4.0)).sf(BETA * ALPHA)  # P(Z/α ≥ β)
    values, probs = model.atoms
    assert values.tolist() == [pytest.approx(cap)] and probs[0] == pytest.approx(atom)
    assert model.cdf(np.nextafter(cap, 0)) == pytest.approx(1 - atom)
    assert model.cdf(cap) == 1.0 and model.pdf(cap) == 0.0
    assert model.quantile(1.0) == pytest.approx(cap) and model.quantile(1 - atom / 2) == cap


def test_dropcompute_noise_spec_with_base_time_keeps_exact_atom() -> None:
    model = parse_delay("const:value=0.5+dropcompute-noise:scale=0.5")
    values, _ = model.atoms
    assert values == pytest.approx([0.5 + 0.5 * BETA])
    assert model.cdf(0.5 + 0.5 * BETA) == 1.0 and model.method == "closed-form"


# --- sums ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "exact"),
    [
        ("exp:rate=1+exp:rate=1", stats.gamma(2)),
        ("exp:rate=2+exp:rate=2+exp:rate=2", stats.gamma(3, scale=0.5)),
        ("normal:mean=1,std=0.5+normal:mean=2,std=1", stats.norm(3, math.sqrt(1.25))),
        ("uniform:low=0,high=1+uniform:low=0,high=1", stats.triang(0.5, scale=2)),
        ("gamma:shape=0.5,rate=1+gamma:shape=0.5,rate=1", stats.expon()),
    ],
)
def test_numerical_convolution_matches_closed_forms(spec: str, exact) -> None:
    model = parse_delay(spec)
    x = exact.ppf(np.linspace(0.01, 0.99, 99))
    assert model.method == "numerical" and model.exact
    np.testing.assert_allclose(model.cdf(x), exact.cdf(x), atol=5e-5)
    np.testing.assert_allclose(
        model.quantile([0.05, 0.5, 0.95]), exact.ppf([0.05, 0.5, 0.95]), rtol=1e-3
    )
    inner = x[5:-5]
    np.testing.assert_allclose(model.pdf(inner), exact.pdf(inner), rtol=2e-3, atol=2e-3)


def test_bernoulli_plus_exp_is_the_exact_mixture() -> None:
    model = parse_delay("bernoulli:p=0.3,value=1+exp:rate=2")
    tail = stats.expon(scale=0.5)
    x = np.linspace(0.01, 6, 300)
    np.testing.assert_allclose(model.cdf(x), 0.7 * tail.cdf(x) + 0.3 * tail.cdf(x - 1), atol=1e-4)
    assert model.atoms[0].size == 0


def test_sum_of_atomic_terms_has_exact_atoms() -> None:
    model = parse_delay("bernoulli:p=0.3,value=1+bernoulli:p=0.5,value=2")
    values, probs = model.atoms
    np.testing.assert_allclose(values, [0, 1, 2, 3])
    np.testing.assert_allclose(probs, [0.35, 0.15, 0.35, 0.15])
    np.testing.assert_allclose(model.cdf([0, 0.5, 1, 2, 3]), [0.35, 0.35, 0.5, 0.85, 1.0])
    np.testing.assert_allclose(model.quantile([0.35, 0.36, 0.9]), [0, 1, 3])


def test_sum_moments_add_up() -> None:
    parts = ["exp:rate=2", "uniform:low=1,high=3", "dropcompute-noise:scale=0.3"]
    total = parse_delay("+".join(parts))
    assert total.mean == pytest.approx(sum(parse_delay(p).mean for p in parts))
    assert total.var == pytest.approx(sum(parse_delay(p).var for p in parts))
    assert total.support == pytest.approx((1.0, math.inf))
