"""DropCompute's bounded log-normal compute noise (App. B.1).

ε = min(Z/α, β) with Z ~ LogNormal(4, 1), α = 2·e^4.5, β = 5.5, and each micro-batch time
becomes t ← t + μ·ε, where μ is the mean of t. ``dropcompute-noise:scale=μ`` is the term μ·ε,
so ``const:value=0.5+dropcompute-noise:scale=0.5`` is the paper's noisy micro-batch.

μ·ε is a log-normal censored at μ·β: a continuous part on [0, μβ) plus an atom at μβ. The cdf
includes the atom; the pdf is the density of the continuous part.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike
from scipy import special, stats

from tailtrain.delays.base import DelayModel, FloatArray, Shape
from tailtrain.delays.params import positive
from tailtrain.spec import Spec

#: log-normal parameters of Z (App. B.1, fitted to user post lengths)
Z_MU, Z_SIGMA = 4.0, 1.0
#: scaling constant α = 2·exp(4.5) (App. B.1)
ALPHA = 2.0 * math.exp(4.5)
#: bound β = 5.5 (App. B.1): a micro-batch takes at most (1 + β)·μ
BETA = 5.5


class DropComputeNoise(DelayModel):
    """μ·min(Z/α, β), Z ~ LogNormal(4, 1): DropCompute App. B.1."""

    def __init__(self, spec: str, scale: float) -> None:
        self.spec = spec
        self.scale = scale
        self.cap = scale * BETA
        # μ·Z/α is log-normal with log-mean m = 4 + ln μ − ln α and log-sd 1
        self.log_mean = Z_MU + math.log(scale) - math.log(ALPHA)
        self.uncapped = stats.lognorm(s=Z_SIGMA, scale=math.exp(self.log_mean))
        self.atom_prob = float(self.uncapped.sf(self.cap))

    def sample(self, rng: np.random.Generator, shape: Shape) -> FloatArray:
        # μ·min(Z/α, β) = min(exp(m + σN), μβ) with m = 4 + ln μ − ln α, computed in place
        noise = rng.standard_normal(shape)
        noise *= Z_SIGMA
        noise += self.log_mean
        np.exp(noise, out=noise)
        return np.minimum(noise, self.cap, out=noise)

    def _capped_moment(self, k: int) -> float:
        """E[min(Y, c)^k] from the log-normal partial moment E[Y^k; Y < c] (closed form)."""
        m, s, c = self.log_mean, Z_SIGMA, self.cap
        below = math.exp(k * m + (k * s) ** 2 / 2) * special.ndtr((math.log(c) - m - k * s * s) / s)
        return float(below + c**k * self.atom_prob)

    @property
    def mean(self) -> float:
        return self._capped_moment(1)

    @property
    def var(self) -> float:
        return self._capped_moment(2) - self.mean**2

    @property
    def support(self) -> tuple[float, float]:
        return 0.0, self.cap

    @property
    def atoms(self) -> tuple[FloatArray, FloatArray]:
        return np.array([self.cap]), np.array([self.atom_prob])

    def cdf(self, x: ArrayLike) -> FloatArray:
        x = np.asarray(x, dtype=np.float64)
        return np.where(x >= self.cap, 1.0, self.uncapped.cdf(x))

    def pdf(self, x: ArrayLike) -> FloatArray:
        x = np.asarray(x, dtype=np.float64)
        return np.where(x < self.cap, self.uncapped.pdf(x), 0.0)

    def quantile(self, q: ArrayLike) -> FloatArray:
        return np.minimum(self.uncapped.ppf(q), self.cap)


def dropcompute_noise(spec: Spec) -> DropComputeNoise:
    """``dropcompute-noise:scale=μ``: μ·ε of DropCompute App. B.1."""
    spec.require_known(("scale",))
    return DropComputeNoise(spec.text, positive(spec, "scale"))
