"""Numerical distribution of a sum of independent delays, by convolution on a lattice.

Each term is put on a common grid of step h: the probability of its continuous part in each
cell (from the term's exact cdf) plus its point masses, each split linearly between the two
nearest grid points (which keeps its mean); the atoms are also kept apart. With ⊛ the
discrete convolution (FFT, or shifted sums when one side has few nonzeros), the sum
S_k = S_{k-1} + T_k has cell masses M_k = M_{k-1} ⊛ m_k and atom masses A_k = A_{k-1} ⊛ a_k,
so M_k − A_k is the mass of its continuous part (C_{S_{k-1}} ⊛ A_k + S_{k-1} ⊛ C_k) and
(M_k − A_k)/h its cell-average density.

The atoms of the sum are combined exactly (all sums of the terms' atoms) unless there are more
than 2^20 combinations, when they are binned to the grid. Accuracy: the cdf of the continuous
part is exact at cell edges up to the midpoint-rule error O(h²·f′) and ≤ 1e-9 per term of
truncated tail, linear in between; the pdf is linear between cell centres, so a density jump
is smeared over one cell and the cdf near it is off by O(h·jump). h is 1/2000 of the
narrowest term's interquartile range unless the grid would exceed 2^20 points.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property, reduce

import numpy as np
from numpy.typing import ArrayLike
from scipy import signal

from tailtrain.delays.base import DelayModel, FloatArray

TAIL_MASS = 1e-9  #: probability per term left beyond the grid (folded into its end cells)
CELLS_PER_SPREAD = 2000  #: grid cells per interquartile range of the narrowest term
MAX_POINTS = 2**20  #: total grid length of all terms together
MAX_EXACT_ATOMS = 2**20  #: atom combinations enumerated exactly
FEW = 64  #: nonzeros below which a convolution is done as shifted sums (exact zeros stay 0)


@dataclass(frozen=True)
class Lattice:
    """A distribution on the grid ``origin + step·j``: cell masses and the atoms among them."""

    origin: float
    step: float
    mass: FloatArray
    atoms: FloatArray


def _range(model: DelayModel) -> tuple[float, float]:
    low, high = model.support
    low = low if math.isfinite(low) else float(model.quantile(TAIL_MASS))
    high = min(high, float(model.quantile(1.0 - TAIL_MASS)))
    return low, max(high, low)


def grid_step(models: Sequence[DelayModel]) -> float:
    """Step h: fine enough for the narrowest term, coarse enough to fit ``MAX_POINTS``."""
    spans = [high - low for low, high in map(_range, models)]
    spreads = [float(m.quantile(0.75) - m.quantile(0.25)) for m in models]
    widths = [s if s > 0 else span for s, span in zip(spreads, spans, strict=True)]
    finest = min((w for w in widths if w > 0), default=1.0) / CELLS_PER_SPREAD
    return max(finest, sum(spans) / MAX_POINTS)


def _split_atoms(
    values: FloatArray, probs: FloatArray, low: float, step: float, size: int
) -> FloatArray:
    """Atoms on the grid, each split between its two nearest points so its mean is kept."""
    position = np.clip((values - low) / step, 0, size - 1)
    below = np.floor(position).astype(np.int64)
    upper = (position - below) * probs
    above = np.minimum(below + 1, size - 1)
    return np.bincount(below, probs - upper, size) + np.bincount(above, upper, size)


def discretise(model: DelayModel, step: float) -> Lattice:
    """Cells of width ``step`` centred on ``low + step·j`` over the model's range."""
    low, high = _range(model)
    centres = low + step * np.arange(math.ceil((high - low) / step) + 1)
    values, probs = model.atoms
    atoms = _split_atoms(values, probs, low, step, centres.size)
    # continuous mass below each edge = cdf minus the exact atoms at or below it
    edges = centres[:-1] + step / 2
    below = model.cdf(edges) - step_cdf(values, probs, edges)
    continuous = np.clip(np.diff(np.concatenate([[0.0], below, [1.0 - probs.sum()]])), 0, None)
    return Lattice(low, step, mass=continuous + atoms, atoms=atoms)


def step_cdf(values: FloatArray, probs: FloatArray, x: ArrayLike, side: str = "right"):
    """P(atom ≤ x) (``side="right"``) or P(atom < x) (``"left"``) for sorted-or-not atoms."""
    order = np.argsort(values)
    cumulative = np.concatenate([[0.0], np.cumsum(probs[order])])
    return cumulative[np.searchsorted(values[order], x, side=side)]


def _shifted_sum(dense: FloatArray, sparse: FloatArray) -> FloatArray:
    out = np.zeros(dense.size + sparse.size - 1)
    for index in np.flatnonzero(sparse):  # few nonzeros: exact, and zeros stay exactly zero
        out[index : index + dense.size] += sparse[index] * dense
    return out


def convolve(a: FloatArray, b: FloatArray) -> FloatArray:
    """Full discrete convolution of two non-negative arrays."""
    if np.count_nonzero(b) <= FEW:
        return _shifted_sum(a, b)
    if np.count_nonzero(a) <= FEW:
        return _shifted_sum(b, a)
    return np.clip(signal.fftconvolve(a, b), 0.0, None)


def add(left: Lattice, right: Lattice) -> Lattice:
    """The lattice of the sum of two independent lattice variables (same step)."""
    return Lattice(
        origin=left.origin + right.origin,
        step=left.step,
        mass=convolve(left.mass, right.mass),
        atoms=convolve(left.atoms, right.atoms),
    )


def _combine_pair(left: tuple[FloatArray, FloatArray], right: tuple[FloatArray, FloatArray]):
    values = np.add.outer(left[0], right[0]).ravel()
    unique, inverse = np.unique(values, return_inverse=True)
    return unique, np.bincount(inverse, np.multiply.outer(left[1], right[1]).ravel())


def sum_atoms(models: Sequence[DelayModel], lattice: Lattice) -> tuple[FloatArray, FloatArray]:
    """Atoms of the sum: exact combinations, or binned to the lattice when too many."""
    tables = [model.atoms for model in models]
    if any(values.size == 0 for values, _ in tables):
        return np.empty(0), np.empty(0)
    if math.prod(values.size for values, _ in tables) <= MAX_EXACT_ATOMS:
        return reduce(_combine_pair, tables)
    binned = reduce(convolve, [_binned_atoms(m, lattice.step) for m in models])
    keep = binned > 1e-15
    positions = lattice.origin + lattice.step * np.arange(binned.size)
    return positions[keep], binned[keep]


def _binned_atoms(model: DelayModel, step: float) -> FloatArray:
    low, high = _range(model)
    values, probs = model.atoms
    return np.bincount(
        np.rint((values - low) / step).astype(np.int64),
        probs,
        minlength=math.ceil((high - low) / step) + 1,
    )


class ConvolvedDistribution:
    """cdf, pdf and quantile of a sum of independent models, tabulated on one lattice."""

    def __init__(self, models: Sequence[DelayModel]) -> None:
        step = grid_step(models)
        lattice = reduce(add, [discretise(model, step) for model in models])
        self.centres = lattice.origin + step * np.arange(lattice.mass.size)
        self.atoms = sum_atoms(models, lattice)
        continuous = np.clip(lattice.mass - lattice.atoms, 0.0, None)
        # cell-average density: finite at a pole (gamma with shape < 1), integrates exactly
        self._density = continuous / step
        # the continuous part's cdf at cell edges, its mass spread evenly over each cell
        self._edges = np.append(self.centres - step / 2, self.centres[-1] + step / 2)
        self._continuous = np.concatenate([[0.0], np.cumsum(continuous)])

    def _continuous_cdf(self, x: FloatArray) -> FloatArray:
        return np.interp(x, self._edges, self._continuous, left=0.0, right=self._continuous[-1])

    def cdf(self, x: ArrayLike) -> FloatArray:
        x = np.asarray(x, dtype=np.float64)
        return np.clip(self._continuous_cdf(x) + step_cdf(*self.atoms, x), 0.0, 1.0)

    def pdf(self, x: ArrayLike) -> FloatArray:
        x = np.asarray(x, dtype=np.float64)
        return np.interp(x, self.centres, self._density, left=0.0, right=0.0)

    @cached_property
    def _polyline(self) -> tuple[FloatArray, FloatArray]:
        """The cdf as a non-decreasing polyline, with a vertical step at each atom."""
        if self.atoms[0].size == 0:
            return self._edges, np.maximum.accumulate(self._continuous)
        x = np.union1d(self._edges, self.atoms[0])
        base = self._continuous_cdf(x)
        below, upto = step_cdf(*self.atoms, x, side="left"), step_cdf(*self.atoms, x)
        points = np.stack([x, x], axis=1).ravel()
        values = np.stack([base + below, base + upto], axis=1).ravel()
        return points, np.maximum.accumulate(values)

    def quantile(self, q: ArrayLike) -> FloatArray:
        q = np.asarray(q, dtype=np.float64)
        x, f = self._polyline
        target = np.clip(q, 0.0, f[-1])
        # generalised inverse inf{x : F(x) ≥ q}, linear inside each polyline segment
        right = np.clip(np.searchsorted(f, target, side="left"), 1, f.size - 1)
        f0, f1, x0, x1 = f[right - 1], f[right], x[right - 1], x[right]
        rise = np.where(f1 > f0, f1 - f0, 1.0)
        inside = np.where(f1 > f0, x0 + (target - f0) / rise * (x1 - x0), x1)
        inside = np.where(target <= f[0], x[0], inside)
        return np.where((q >= 0) & (q <= 1), inside, np.nan)
