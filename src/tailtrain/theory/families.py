"""Closed-form families behind a delay model, and the exact law of a sum of M i.i.d. copies.

A worker's iteration time with M micro-batches is the sum of M i.i.d. micro-batch times
(DropCompute Sec. 3.1). That sum has a closed form for these families, each plus a constant
shift: exponential and gamma (same rate) -> gamma, normal -> normal, const -> const,
``value * Bernoulli(p)`` -> ``value * Binomial(M, p)``. The family is read from the model's
spec and then verified against the model's own mean, variance and cdf, so a model that only
looks like a family by name (e.g. a truncated normal) is never treated as one.

:class:`NonNegative` is ``max(X, 0)``, the law the samplers actually draw from a model with
negative support.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy import integrate, stats

from tailtrain.delays.base import DelayModel, Shape
from tailtrain.delays.parse import split_terms
from tailtrain.errors import UsageError
from tailtrain.spec import parse_spec

log = logging.getLogger(__name__)

_CHECK_Q = np.array([0.001, 0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99, 0.999])


class ScaledScipyDelay(DelayModel):
    """``loc + scale * D`` for a frozen scipy distribution ``D`` (continuous or discrete)."""

    def __init__(self, dist, *, loc: float = 0.0, scale: float = 1.0, spec: str) -> None:
        if not scale > 0:
            raise ValueError(f"scale must be > 0, got {scale}")
        self.dist, self.loc, self.scale, self.spec = dist, float(loc), float(scale), spec
        self.discrete = isinstance(dist.dist, stats.rv_discrete)

    def sample(self, rng: np.random.Generator, shape: Shape) -> NDArray[np.float64]:
        draws = np.asarray(self.dist.rvs(size=shape, random_state=rng), dtype=float)
        return self.loc + self.scale * draws

    @property
    def mean(self) -> float:
        with np.errstate(divide="ignore", invalid="ignore"):  # scipy's point-mass skewness
            return self.loc + self.scale * float(self.dist.mean())

    @property
    def var(self) -> float:
        with np.errstate(divide="ignore", invalid="ignore"):
            return self.scale**2 * float(self.dist.var())

    @property
    def support(self) -> tuple[float, float]:
        low, high = self.dist.support()
        return (self.loc + self.scale * float(low), self.loc + self.scale * float(high))

    def cdf(self, x: ArrayLike) -> NDArray[np.float64]:
        return np.asarray(self.dist.cdf((np.asarray(x, float) - self.loc) / self.scale), float)

    def pdf(self, x: ArrayLike) -> NDArray[np.float64]:
        """Density; for a lattice (discrete) law, the probability mass at ``x``."""
        z = (np.asarray(x, float) - self.loc) / self.scale
        if self.discrete:
            return np.asarray(self.dist.pmf(z), float)
        return np.asarray(self.dist.pdf(z), float) / self.scale

    def quantile(self, q: ArrayLike) -> NDArray[np.float64]:
        return self.loc + self.scale * np.asarray(self.dist.ppf(q), float)

    @property
    def atoms(self) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        if not self.discrete:
            return np.empty(0), np.empty(0)
        low, high = self.dist.support()
        k = np.arange(low, high + 1)
        return self.loc + self.scale * k, np.asarray(self.dist.pmf(k), float)


class NonNegative(DelayModel):
    """``max(X, 0)``: how the samplers use a model with negative support (e.g. a wide normal)."""

    def __init__(self, model: DelayModel) -> None:
        self.model, self.spec = model, model.spec

    def sample(self, rng: np.random.Generator, shape: Shape) -> NDArray[np.float64]:
        return np.maximum(self.model.sample(rng, shape), 0.0)

    @property
    def per_worker(self) -> bool:
        return self.model.per_worker

    def draw_block(
        self, rng: np.random.Generator, start: int, shape: tuple[int, int, int]
    ) -> NDArray[np.float64]:
        return np.maximum(self.model.draw_block(rng, start, shape), 0.0)

    @property
    def mean(self) -> float:
        return float(integrate.quad(lambda q: max(float(self.model.quantile(q)), 0.0), 0, 1)[0])

    @property
    def var(self) -> float:
        second = integrate.quad(lambda q: max(float(self.model.quantile(q)), 0.0) ** 2, 0, 1)[0]
        return float(second - self.mean**2)

    @property
    def exact(self) -> bool:
        return self.model.exact

    @property
    def support(self) -> tuple[float, float]:
        return 0.0, max(self.model.support[1], 0.0)

    def cdf(self, x: ArrayLike) -> NDArray[np.float64]:
        x = np.asarray(x, float)
        return np.where(x < 0, 0.0, self.model.cdf(x))

    def pdf(self, x: ArrayLike) -> NDArray[np.float64]:
        x = np.asarray(x, float)
        return np.where(x < 0, 0.0, self.model.pdf(x))

    def quantile(self, q: ArrayLike) -> NDArray[np.float64]:
        return np.maximum(self.model.quantile(q), 0.0)


def nonnegative(model: DelayModel, tolerance: float = 1e-6) -> DelayModel:
    """``max(model, 0)``, as the samplers draw it, when P(X < 0) > tolerance; else ``model``
    itself, keeping its closed form (e.g. N(1, 0.2²) has P(X < 0) = 3e-7)."""
    if model.support[0] >= 0 or float(model.cdf(0.0)) <= tolerance:
        return model
    return NonNegative(model)


@dataclass(frozen=True)
class ClosedForm:
    """``shift + D`` where D is one of the families closed under i.i.d. sums."""

    kind: str  # "const" | "gamma" | "normal" | "bernoulli"
    shift: float
    a: float = 0.0  # gamma shape, normal mean, Bernoulli p
    b: float = 0.0  # gamma rate, normal std, Bernoulli value

    @property
    def exponential_rate(self) -> float | None:
        """The rate when this is ``shift + Exp(rate)`` (gamma of shape 1), else None."""
        return self.b if self.kind == "gamma" and self.a == 1.0 else None

    def sum_of(self, m: int) -> DelayModel:
        """Exact law of the sum of ``m`` i.i.d. copies."""
        loc, spec = m * self.shift, f"sum of {m} x {self}"
        if self.kind == "const":
            return ScaledScipyDelay(stats.randint(0, 1), loc=loc, spec=spec)
        if self.kind == "gamma":
            return ScaledScipyDelay(stats.gamma(m * self.a), loc=loc, scale=1 / self.b, spec=spec)
        if self.kind == "normal":
            dist = stats.norm(m * self.a, math.sqrt(m) * self.b)
            return ScaledScipyDelay(dist, loc=loc, spec=spec)
        return ScaledScipyDelay(stats.binom(m, self.a), loc=loc, scale=self.b, spec=spec)


def closed_form(model: DelayModel) -> ClosedForm | None:
    """The closed-form family of ``model``, or None when it has none (or fails verification)."""
    try:
        candidate = _from_spec(getattr(model, "spec", ""))
    except UsageError:
        return None
    if candidate is None or not _agrees(model, candidate.sum_of(1)):
        return None
    return candidate


def exponential_params(model: DelayModel) -> tuple[float, float] | None:
    """``(shift, rate)`` when ``model`` is ``shift + Exp(rate)``, else None."""
    form = closed_form(model)
    if form is None or form.exponential_rate is None:
        return None
    return form.shift, form.exponential_rate


def _from_spec(text: str) -> ClosedForm | None:
    shift, parts = 0.0, []
    for term in split_terms(text, what="delay"):
        form = _term(term)
        if form is None:
            return None
        if form.kind == "const":
            shift += form.shift
        else:
            shift += form.shift
            parts.append(form)
    if not parts:
        return ClosedForm("const", shift)
    combined = _combine(parts)
    if combined is None:
        return None
    return ClosedForm(combined.kind, shift, combined.a, combined.b)


def _term(text: str) -> ClosedForm | None:
    spec = parse_spec(text, what="delay")
    if spec.name == "const":
        return ClosedForm("const", spec.get_float("value"))
    if spec.name == "exp":
        return ClosedForm("gamma", 0.0, 1.0, spec.get_float("rate", positive=True))
    if spec.name == "shifted-exp":
        rate = (
            1 / spec.get_float("scale", positive=True)
            if spec.has("scale")
            else spec.get_float("rate", positive=True)
        )
        return ClosedForm("gamma", spec.get_float("shift"), 1.0, rate)
    if spec.name == "gamma":
        shape, rate = spec.get_float("shape", positive=True), spec.get_float("rate", positive=True)
        return ClosedForm("gamma", 0.0, shape, rate)
    if spec.name == "normal":
        return ClosedForm(
            "normal", 0.0, spec.get_float("mean"), spec.get_float("std", positive=True)
        )
    if spec.name == "bernoulli":
        p, value = spec.get_float("p"), spec.get_float("value", positive=True)
        return ClosedForm("bernoulli", 0.0, p, value) if 0 < p < 1 else None
    return None


def _combine(parts: list[ClosedForm]) -> ClosedForm | None:
    """Sum of independent terms of one kind: normals add; gammas of one rate add shapes."""
    if len(parts) == 1:
        return parts[0]
    kinds = {p.kind for p in parts}
    if kinds == {"normal"}:
        return ClosedForm("normal", 0.0, sum(p.a for p in parts), math.hypot(*(p.b for p in parts)))
    if kinds == {"gamma"} and len({p.b for p in parts}) == 1:
        return ClosedForm("gamma", 0.0, sum(p.a for p in parts), parts[0].b)
    return None


def _agrees(model: DelayModel, candidate: DelayModel) -> bool:
    """Mean, variance and cdf (between atoms for lattice laws) match to 1e-6."""
    try:
        moments = np.allclose([model.mean, model.var], [candidate.mean, candidate.var], rtol=1e-6)
        x = _check_points(candidate)
        same_cdf = np.allclose(model.cdf(x), candidate.cdf(x), atol=1e-6)
    except (ValueError, TypeError, ArithmeticError) as exc:
        log.debug("closed form check of %r failed: %s", model, exc)
        return False
    return bool(moments and same_cdf)


def _check_points(candidate: DelayModel) -> NDArray[np.float64]:
    q = candidate.quantile(_CHECK_Q)
    if isinstance(candidate, ScaledScipyDelay) and candidate.discrete:
        atoms = np.unique(q)
        # lattice laws: compare between and around atoms, never on an atom (rounding-sensitive)
        return np.concatenate([atoms - 0.5 * candidate.scale, atoms + 0.5 * candidate.scale])
    return q
