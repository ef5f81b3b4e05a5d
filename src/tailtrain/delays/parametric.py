"""Continuous compute-time distributions backed by :mod:`scipy.stats` frozen distributions.

Parameterisations follow the papers (see each builder's docstring); scipy supplies the exact
mean, var, cdf, pdf and quantile. Sampling transforms numpy's standard generators in place,
several times faster than ``frozen.rvs`` at 10⁷ draws; the tests check that both sides agree
(moments against samples, and a DKW bound on the cdf).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from numpy.typing import ArrayLike
from scipy import stats

from tailtrain.delays.base import DelayModel, FloatArray, Shape
from tailtrain.delays.params import duration, number, positive
from tailtrain.errors import UsageError
from tailtrain.spec import Spec

Sampler = Callable[[np.random.Generator, Shape], FloatArray]


def affine(draw: Sampler, scale: float, shift: float = 0.0, *, exp: bool = False) -> Sampler:
    """shift + scale·X (or shift + scale·exp(X)) for a standard draw X, in place."""

    def sample(rng: np.random.Generator, shape: Shape) -> FloatArray:
        out = draw(rng, shape)
        if exp:
            np.exp(out, out=out)
        out *= scale
        out += shift
        return out

    return sample


def _uniform01(rng: np.random.Generator, shape: Shape) -> FloatArray:
    return rng.random(shape)


def _normal01(rng: np.random.Generator, shape: Shape) -> FloatArray:
    return rng.standard_normal(shape)


def _exp1(rng: np.random.Generator, shape: Shape) -> FloatArray:
    return rng.standard_exponential(shape)


class ScipyDelay(DelayModel):
    """A delay model that is one frozen ``scipy.stats`` continuous distribution."""

    def __init__(self, spec: str, frozen: stats.distributions.rv_frozen, sampler: Sampler) -> None:
        self.spec = spec
        self.frozen = frozen
        self._sampler = sampler

    def sample(self, rng: np.random.Generator, shape: Shape) -> FloatArray:
        return self._sampler(rng, shape)

    @property
    def mean(self) -> float:
        return float(self.frozen.mean())

    @property
    def var(self) -> float:
        return float(self.frozen.var())

    @property
    def support(self) -> tuple[float, float]:
        low, high = self.frozen.support()
        return float(low), float(high)

    def cdf(self, x: ArrayLike) -> FloatArray:
        return np.asarray(self.frozen.cdf(x), dtype=np.float64)

    def pdf(self, x: ArrayLike) -> FloatArray:
        return np.asarray(self.frozen.pdf(x), dtype=np.float64)

    def quantile(self, q: ArrayLike) -> FloatArray:
        return np.asarray(self.frozen.ppf(q), dtype=np.float64)


def uniform(spec: Spec) -> ScipyDelay:
    """``uniform:low=,high=``: U(low, high), 0 <= low < high."""
    spec.require_known(("low", "high"))
    low, high = duration(spec, "low"), duration(spec, "high")
    if not high > low:
        raise UsageError(f"{spec.text!r} needs high > low (got low={low:g}, high={high:g})")
    frozen = stats.uniform(loc=low, scale=high - low)
    return ScipyDelay(spec.text, frozen, affine(_uniform01, high - low, low))


def normal(spec: Spec) -> ScipyDelay:
    """``normal:mean=,std=``: N(mean, std²) (DropCompute App. C.3, Fig. 13b).

    Not truncated, so the mean and variance are exactly the parameters; a sampler that needs
    durations clips negatives at 0 (see :class:`~tailtrain.delays.process.DelayProcess`).
    """
    spec.require_known(("mean", "std"))
    mean, std = duration(spec, "mean"), positive(spec, "std")
    return ScipyDelay(spec.text, stats.norm(loc=mean, scale=std), affine(_normal01, std, mean))


def exponential(spec: Spec) -> ScipyDelay:
    """``exp:rate=``: Exp(rate) with mean 1/rate (slow-and-stale Cor. 1; DropCompute Fig. 13d)."""
    spec.require_known(("rate",))
    scale = 1.0 / positive(spec, "rate")
    return ScipyDelay(spec.text, stats.expon(scale=scale), affine(_exp1, scale))


def shifted_exponential(spec: Spec) -> ScipyDelay:
    """``shifted-exp:shift=,rate=`` or ``shift=,scale=``: shift + Exp with that rate or mean.

    DBW §4.1's round-trip time 1−α+α·Exp(1) is ``shift=1-α,scale=α``; slow-and-stale's
    Δ + Exp(μ) (Lemma 4) is ``shift=Δ,rate=μ``.
    """
    spec.require_known(("shift", "rate", "scale"))
    if spec.has("rate") == spec.has("scale"):
        raise UsageError(f"{spec.text!r} needs exactly one of rate= or scale= (mean = 1/rate)")
    scale = positive(spec, "scale") if spec.has("scale") else 1.0 / positive(spec, "rate")
    shift = duration(spec, "shift")
    return ScipyDelay(spec.text, stats.expon(loc=shift, scale=scale), affine(_exp1, scale, shift))


def pareto(spec: Spec) -> ScipyDelay:
    """``pareto:shape=,scale=``: Pareto type I, density shape·scale^shape / x^(shape+1), x ≥ scale.

    Mean shape·scale/(shape−1) for shape > 1 (infinite otherwise), so slow-and-stale's
    Pareto(2, 1) (Fig. 6, Fig. 7) has mean 2 and infinite variance. Sampled as
    scale·exp(E/shape) with E ~ Exp(1).
    """
    spec.require_known(("shape", "scale"))
    shape, scale = positive(spec, "shape"), positive(spec, "scale")
    frozen = stats.pareto(b=shape, scale=scale)
    return ScipyDelay(spec.text, frozen, affine(affine(_exp1, 1.0 / shape), scale, exp=True))


def lognormal(spec: Spec) -> ScipyDelay:
    """``lognormal:mu=,sigma=``: exp(N(mu, sigma²)); mu may be negative (DropCompute App. C.3)."""
    spec.require_known(("mu", "sigma"))
    mu, sigma = number(spec, "mu"), positive(spec, "sigma")
    frozen = stats.lognorm(s=sigma, scale=float(np.exp(mu)))
    return ScipyDelay(spec.text, frozen, affine(affine(_normal01, sigma, mu), 1.0, exp=True))


def gamma(spec: Spec) -> ScipyDelay:
    """``gamma:shape=,rate=``: Γ(shape, rate), mean shape/rate (DropCompute Fig. 13e: γ(1, 4.5))."""
    spec.require_known(("shape", "rate"))
    shape, rate = positive(spec, "shape"), positive(spec, "rate")

    def standard(rng: np.random.Generator, size: Shape) -> FloatArray:
        return rng.standard_gamma(shape, size)

    return ScipyDelay(
        spec.text, stats.gamma(a=shape, scale=1.0 / rate), affine(standard, 1.0 / rate)
    )
