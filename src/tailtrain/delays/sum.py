"""``A+B+…``: the sum of independent delay terms.

Mean and variance are exact (sums of the terms'). Constant terms fold into a shift, so a sum
with one non-constant term (``const:value=0.45+lognormal:…``, ``const+dropcompute-noise``)
keeps that term's exact cdf, pdf, quantile and atoms, shifted. With two or more non-constant
terms, cdf/pdf/quantile come from numerical convolution
(:class:`~tailtrain.delays.convolution.ConvolvedDistribution`) and ``method`` says
``numerical``; ``exact`` is False only when a term is empirical (a trace).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property

import numpy as np
from numpy.typing import ArrayLike

from tailtrain.delays.base import DelayModel, FloatArray, Shape
from tailtrain.delays.convolution import ConvolvedDistribution


class SumDelay(DelayModel):
    """T_1 + … + T_n, independent: the non-constant terms sampled in order, plus the shift."""

    def __init__(self, spec: str, terms: Sequence[DelayModel]) -> None:
        self.spec = spec
        self.terms = tuple(terms)
        constant = [t for t in self.terms if t.support[0] == t.support[1]]
        self.shift = float(sum(t.support[0] for t in constant))
        self.varying = tuple(t for t in self.terms if t.support[0] != t.support[1])

    def sample(self, rng: np.random.Generator, shape: Shape) -> FloatArray:
        if not self.varying:
            return np.full(shape, self.shift)
        total = np.asarray(self.varying[0].sample(rng, shape), dtype=np.float64)  # fresh array
        for term in self.varying[1:]:
            total += term.sample(rng, shape)
        total += self.shift
        return total

    @property
    def per_worker(self) -> bool:
        return any(t.per_worker for t in self.terms)

    @property
    def cuttable(self) -> bool:
        return all(t.cuttable for t in self.terms)  # a part that cannot be cut holds the unit

    def draw_block(
        self, rng: np.random.Generator, start: int, shape: tuple[int, int, int]
    ) -> FloatArray:
        """Each term's own block (a trace replays per worker), in ``sample``'s order."""
        if not self.per_worker:
            return self.sample(rng, shape)  # the same draws as before blocks existed
        total = np.full(shape, self.shift)
        for term in self.varying:
            total += term.draw_block(rng, start, shape)
        return total

    @property
    def mean(self) -> float:
        return float(sum(t.mean for t in self.terms))

    @property
    def var(self) -> float:
        return float(sum(t.var for t in self.terms))

    @property
    def exact(self) -> bool:
        return all(t.exact for t in self.terms)

    @property
    def method(self) -> str:
        if not self.exact:
            return "empirical"
        if len(self.varying) > 1:
            return "numerical"
        return self.varying[0].method if self.varying else "closed-form"

    @property
    def support(self) -> tuple[float, float]:
        lows, highs = zip(*(t.support for t in self.terms), strict=True)
        return float(sum(lows)), float(sum(highs))

    @cached_property
    def _numerical(self) -> ConvolvedDistribution:
        return ConvolvedDistribution(self.varying)

    @property
    def atoms(self) -> tuple[FloatArray, FloatArray]:
        if not self.varying:
            return np.array([self.shift]), np.array([1.0])
        if len(self.varying) == 1:
            values, probs = self.varying[0].atoms
            return values + self.shift, probs
        values, probs = self._numerical.atoms
        return values + self.shift, probs.copy()

    def cdf(self, x: ArrayLike) -> FloatArray:
        x = np.asarray(x, dtype=np.float64) - self.shift
        if not self.varying:
            return np.where(x >= 0, 1.0, 0.0)
        if len(self.varying) == 1:
            return self.varying[0].cdf(x)
        return self._numerical.cdf(x)

    def pdf(self, x: ArrayLike) -> FloatArray:
        x = np.asarray(x, dtype=np.float64) - self.shift
        if not self.varying:
            return np.zeros(x.shape)
        if len(self.varying) == 1:
            return self.varying[0].pdf(x)
        return self._numerical.pdf(x)

    def quantile(self, q: ArrayLike) -> FloatArray:
        q = np.asarray(q, dtype=np.float64)
        if not self.varying:
            return np.where((q >= 0) & (q <= 1), self.shift, np.nan)
        if len(self.varying) == 1:
            return self.varying[0].quantile(q) + self.shift
        low, high = (sum(ends) for ends in zip(*(t.support for t in self.varying), strict=True))
        return np.clip(self._numerical.quantile(q), low, high) + self.shift
