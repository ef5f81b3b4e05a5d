"""Distributions made only of point masses: ``const``, ``bernoulli`` (and, empirically, traces).

``pdf`` is the density of the continuous part, which is zero here; ``cdf`` is the exact step
function and ``quantile`` its generalised inverse inf{x : F(x) ≥ q}.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from tailtrain.delays.base import DelayModel, FloatArray, Shape
from tailtrain.delays.params import duration, number
from tailtrain.spec import Spec


class AtomicDelay(DelayModel):
    """A finite discrete distribution: ``values[i]`` with probability ``probs[i]``."""

    def __init__(self, spec: str, values: ArrayLike, probs: ArrayLike) -> None:
        values = np.asarray(values, dtype=np.float64).ravel()
        probs = np.broadcast_to(np.asarray(probs, dtype=np.float64), values.shape)
        keep = probs > 0
        unique, inverse = np.unique(values[keep], return_inverse=True)
        merged = np.bincount(inverse, weights=probs[keep], minlength=unique.size)
        self.spec = spec
        self.values = unique
        self.probs = merged / merged.sum()
        self._cum = np.cumsum(self.probs)
        self._cum[-1] = 1.0  # the sum of many probabilities falls a rounding error short

    def sample(self, rng: np.random.Generator, shape: Shape) -> FloatArray:
        if self.values.size == 1:
            return np.full(shape, self.values[0])
        return self.values[self._draw_index(rng, shape)]

    def _draw_index(self, rng: np.random.Generator, shape: Shape) -> np.ndarray:
        # inverse-cdf on one uniform per draw: vectorised and valid for any number of atoms
        index = np.searchsorted(self._cum, rng.random(shape), side="right")
        return np.minimum(index, self.values.size - 1)

    @property
    def mean(self) -> float:
        return float(self.probs @ self.values)

    @property
    def var(self) -> float:
        return float(self.probs @ (self.values - self.mean) ** 2)

    @property
    def support(self) -> tuple[float, float]:
        return float(self.values[0]), float(self.values[-1])

    @property
    def atoms(self) -> tuple[FloatArray, FloatArray]:
        return self.values.copy(), self.probs.copy()

    def cdf(self, x: ArrayLike) -> FloatArray:
        index = np.searchsorted(self.values, np.asarray(x, dtype=np.float64), side="right")
        return np.where(index > 0, self._cum[np.maximum(index - 1, 0)], 0.0).clip(0.0, 1.0)

    def pdf(self, x: ArrayLike) -> FloatArray:
        return np.zeros(np.shape(x))

    def quantile(self, q: ArrayLike) -> FloatArray:
        q = np.asarray(q, dtype=np.float64)
        index = np.minimum(np.searchsorted(self._cum, q, side="left"), self.values.size - 1)
        return np.where((q >= 0) & (q <= 1), self.values[index], np.nan)


class BernoulliDelay(AtomicDelay):
    """value·Br(p): ``value`` with probability p, else 0."""

    def __init__(self, spec: str, p: float, value: float) -> None:
        super().__init__(spec, [0.0, value], [1.0 - p, p])
        self.p, self.value = p, value

    def sample(self, rng: np.random.Generator, shape: Shape) -> FloatArray:
        return np.where(rng.random(shape) < self.p, self.value, 0.0)


def constant(spec: Spec) -> AtomicDelay:
    """``const:value=``: always ``value`` seconds (DropCompute App. C.3's 0.45 s base)."""
    spec.require_known(("value",))
    return AtomicDelay(spec.text, [duration(spec, "value")], [1.0])


def bernoulli(spec: Spec) -> BernoulliDelay:
    """``bernoulli:p=,value=``: value·Br(p) (DropCompute App. C.3, Fig. 13c: 0.45·Br(0.5))."""
    spec.require_known(("p", "value"))
    p = number(spec, "p", minimum=0.0, maximum=1.0)
    return BernoulliDelay(spec.text, p, duration(spec, "value"))
