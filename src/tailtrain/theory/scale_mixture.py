"""The law of s X, a delay X scaled by an independent speed s ~ U(low, high) (low <= high:
with low = high, X scaled).

Under the ``heterogeneous:low=,high=`` pattern worker n's times are s_n X with s_n ~ U(low,
high) drawn once per run (``delays.patterns.Heterogeneous``). The workers' speeds are i.i.d.,
so within one iteration the N workers' times are N i.i.d. draws of this mixture: sync's
E[max_n], K-sync's E[X_{K:N}] (slow-and-stale Lemma 1) and DropCompute's partial-sum laws
(Giladi et al. App. C.2) are those of the i.i.d. mixture, whatever N (``predict`` uses them
above a few thousand workers, where a Monte Carlo of N workers is too costly).

    F(x) = 1/(high - low) int_low^high F_X(x / s) ds.

The integral over s is composite Gauss-Legendre, split where x / s crosses an end of X's
support (a kink of F_X); X's atoms are integrated exactly (an atom a contributes
P(s <= x / a)). An X made of atoms only (constant, lattice) gives a piecewise-linear cdf,
linear between the points low a and high a: its cdf is that sum alone and its quantile the
exact linear interpolation on those breakpoints (a table would clip at low u, where F rises
linearly from low min(a)). Otherwise the quantile inverts a table of the cdf over logit(u)
(monotone cubic, PCHIP), as ``theory.sums`` does. Accuracy
(tests/theory/test_scale_mixture.py): the cdf agrees with adaptive quadrature to 1e-10 and
the quantile inverts it to 1e-7 relative.
"""

from __future__ import annotations

from functools import cached_property

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy import interpolate, special

from tailtrain.delays.base import DelayModel, FloatArray, Shape

_NODES = 24  # Gauss-Legendre nodes per smooth piece of [low, high]
_TABLE = 16384  # logit(u) points of the quantile table, on each of X's two scalings
_CELLS = 4_000_000  # numbers per batch of cdf evaluations, bounds memory
_LOGIT = 37.0  # the table spans u = expit(+-37): beyond double precision's 1 - u


class ScaleMixture(DelayModel):
    """s X with s ~ U(``low``, ``high``) independent of X (``base``, non-negative)."""

    def __init__(self, base: DelayModel, low: float, high: float) -> None:
        if not 0 < low <= high:
            raise ValueError(f"need 0 < low <= high, got low={low}, high={high}")
        self.base, self.low, self.high = base, float(low), float(high)
        self.spec = f"({base.spec}) scaled by U({low:g}, {high:g})"
        values, probs = base.atoms
        self._atoms = (np.asarray(values, dtype=float), np.asarray(probs, dtype=float))
        # no continuous part: the cdf is the atoms' exact piecewise-linear sum
        self._atoms_only = bool(probs.size) and abs(float(np.sum(probs)) - 1.0) < 1e-12

    def sample(self, rng: np.random.Generator, shape: Shape) -> NDArray[np.float64]:
        draws = self.base.sample(rng, shape)
        return draws * rng.uniform(self.low, self.high, np.shape(draws))

    @property
    def mean(self) -> float:
        return self.base.mean * (self.low + self.high) / 2

    @property
    def var(self) -> float:
        second = (self.low**2 + self.low * self.high + self.high**2) / 3
        return second * (self.base.var + self.base.mean**2) - self.mean**2

    @property
    def method(self) -> str:
        return "numerical"

    @property
    def support(self) -> tuple[float, float]:
        lo, hi = self.base.support
        return (self.low * lo, self.high * hi)

    @property
    def atoms(self) -> tuple[FloatArray, FloatArray]:
        """Only an atom at 0 survives the scaling (all of them, scaled, with one speed)."""
        values, probs = self._atoms
        if self.low == self.high:
            return self.low * values, probs
        zero = values == 0
        return values[zero], probs[zero]

    def cdf(self, x: ArrayLike) -> NDArray[np.float64]:
        if self.low == self.high:  # one speed: X scaled
            return np.asarray(self.base.cdf(np.asarray(x, dtype=float) / self.low), dtype=float)
        if self._atoms_only:
            return self._atoms_cdf(np.asarray(x, dtype=float))
        return self._integral(x, density=False)

    def pdf(self, x: ArrayLike) -> NDArray[np.float64]:
        if self.low == self.high:
            x = np.asarray(x, dtype=float)
            return np.asarray(self.base.pdf(x / self.low), dtype=float) / self.low
        return self._integral(x, density=True)

    def quantile(self, q: ArrayLike) -> NDArray[np.float64]:
        if self.low == self.high:
            return self.low * np.asarray(self.base.quantile(q), dtype=float)
        q = np.asarray(q, dtype=float)
        if self._atoms_only:
            return self._atoms_quantile(q)
        z, _, zero_mass = self._table
        with np.errstate(divide="ignore"):
            logit = special.logit(np.clip(q, 0.0, 1.0))
        out = np.asarray(self._inverse(np.clip(logit, z[0], z[-1])), dtype=float)
        return np.where(q <= zero_mass, 0.0, out)

    def _atoms_cdf(self, x: NDArray[np.float64]) -> NDArray[np.float64]:
        """F(x) = sum_a p_a P(s <= x / a) for an X of atoms only (an atom at 0: a step)."""
        values, probs = self._atoms
        width = self.high - self.low
        out = np.zeros(x.shape)
        for a, p in zip(values, probs, strict=True):
            if a == 0:
                out += np.where(x >= 0, p, 0.0)
            else:
                out += p * np.clip((x / a - self.low) / width, 0.0, 1.0)
        return np.clip(out, 0.0, 1.0)

    @cached_property
    def _breakpoints(self) -> tuple[FloatArray, FloatArray]:
        """(x, F(x)) at every low a and high a (and 0 for an atom at 0), increasing in x:
        F is linear between consecutive points, non-decreasing along them."""
        values, _ = self._atoms
        x = np.unique(np.concatenate([self.low * values, self.high * values]))
        return x, self._atoms_cdf(x)

    def _atoms_quantile(self, q: NDArray[np.float64]) -> NDArray[np.float64]:
        """Q(u) = inf{x : F(x) >= u}: the first breakpoint with F >= u, then exact linear
        interpolation back into the piece below it, where F rises (np.interp would need
        strictly increasing F, which a gap between atoms' ranges breaks)."""
        x, f = self._breakpoints
        u = np.clip(q, 0.0, 1.0)
        i = np.minimum(np.searchsorted(f, u, side="left"), x.size - 1)
        below = np.maximum(i - 1, 0)
        rise = f[i] - f[below]
        with np.errstate(divide="ignore", invalid="ignore"):
            frac = np.clip((u - f[below]) / rise, 0.0, 1.0)
        out = np.where(rise > 0, x[below] + frac * (x[i] - x[below]), x[i])
        return np.asarray(out, dtype=float)

    def _integral(self, x: ArrayLike, *, density: bool) -> NDArray[np.float64]:
        """F(x) (or its density) as the integral over s, plus the atoms' exact part; in
        batches of x, so that nodes times atoms stay within :data:`_CELLS` numbers."""
        x = np.asarray(x, dtype=float)
        flat = x.ravel()
        step = max(1, _CELLS // (3 * _NODES * (1 + self._atoms[0].size)))
        parts = [self._batch(flat[i : i + step], density) for i in range(0, flat.size, step)]
        return (np.concatenate(parts) if parts else np.empty(0)).reshape(x.shape)

    def _batch(self, x: NDArray[np.float64], density: bool) -> NDArray[np.float64]:
        flat = x[:, None]
        width = self.high - self.low
        # kinks of F_X(x / s) in s: where x / s crosses an end of X's support
        ends = [e for e in self.base.support if 0 < e < np.inf]
        with np.errstate(divide="ignore", invalid="ignore"):
            kinks = [np.clip(flat / e, self.low, self.high) for e in ends]
        bounds = [np.full_like(flat, self.low), *kinks, np.full_like(flat, self.high)]
        edges = np.sort(np.concatenate(bounds, axis=1), axis=1)
        nodes, weights = np.polynomial.legendre.leggauss(_NODES)
        size = np.diff(edges, axis=1)[:, :, None]
        s = edges[:, :-1, None] + size * (nodes + 1) / 2
        v = flat[:, :, None] / s
        values, probs = self._atoms
        if density:
            inner = np.asarray(self.base.pdf(v), dtype=float) / s
        else:
            inner = np.asarray(self.base.cdf(v), dtype=float)
            if values.size:  # the atoms' steps, integrated exactly below
                inner = inner - (probs * (v[..., None] >= values)).sum(axis=-1)
        out = (inner * weights / 2 * size).sum(axis=(1, 2)) / width
        for a, p in zip(values, probs, strict=True):
            if density:
                if a > 0:
                    inside = (flat[:, 0] >= self.low * a) & (flat[:, 0] <= self.high * a)
                    out += np.where(inside, p / (a * width), 0.0)
            elif a == 0:
                out += np.where(flat[:, 0] >= 0, p, 0.0)
            else:
                out += p * np.clip((flat[:, 0] / a - self.low) / width, 0.0, 1.0)
        return out if density else np.clip(out, 0.0, 1.0)

    @cached_property
    def _table(self) -> tuple[FloatArray, FloatArray, float]:
        """(logit F, x) on the quantiles of low X and high X (the mixture's quantile lies
        between them), strictly increasing in logit F; and the mass at 0."""
        u = special.expit(np.linspace(-_LOGIT, _LOGIT, _TABLE))
        q = np.asarray(self.base.quantile(u), dtype=float)
        q = q[np.isfinite(q)]
        body = np.linspace(self.low * q.min(), self.high * q.max(), _TABLE)  # e.g. a constant X
        x = np.unique(np.concatenate([self.low * q, self.high * q, body]))
        x = x[np.isfinite(x) & (x > 0)]
        with np.errstate(divide="ignore"):
            z = special.logit(self.cdf(x))
        keep = np.isfinite(z)
        z, x = z[keep], x[keep]
        # rounding can make F dip by an ulp; a flat F keeps its smallest x (Q's rule)
        first = np.concatenate([[True], np.diff(z) > 0])
        while not first.all():
            z, x = z[first], x[first]
            first = np.concatenate([[True], np.diff(z) > 0])
        zero = self.atoms[1]
        return z, x, float(zero.sum()) if zero.size else 0.0

    @cached_property
    def _inverse(self) -> interpolate.PchipInterpolator:
        z, x, _ = self._table
        return interpolate.PchipInterpolator(z, x, extrapolate=False)
