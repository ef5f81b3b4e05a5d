"""Expected order statistics E[X_{k:n}] of n i.i.d. delays.

Slow-and-stale Table I / Lemma 1: K-sync waits for the K-th of P i.i.d. times, E[T] = E[X_{K:P}].
Three methods, best first:

* exact, for ``shift + Exp(rate)``: E[X_{k:n}] = shift + sum_{i=n-k+1}^{n} 1/(i rate)
  (slow-and-stale Remark 1 / proof of Theorem 2), and for a constant (zero variance);
* numerical integration, for any model with an exact quantile function:
  E[X_{k:n}] = int_0^1 Q(u) Beta(u; k, n-k+1) du (the quantile of a uniform order statistic);
  above :data:`WINDOWED_ABOVE` draws each k gets its own window around its Beta peak (the
  peaks narrow like 1/sqrt(n), and one adaptive rule shared by all k misses some);
* Monte Carlo, only for empirical models (``model.exact`` is False, e.g. traces).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy import integrate, special

from tailtrain.delays.base import DelayModel
from tailtrain.errors import UsageError
from tailtrain.theory.estimate import EXACT, NUMERICAL, Estimate, monte_carlo
from tailtrain.theory.families import closed_form

# u = expit(s) for s in [-S_MAX, S_MAX]: expit(36) is the last double below 1, so Q stays finite;
# the mass cut off at either end is below ~1e-15 of the Beta weight.
S_MAX = 36.0
_CHUNK = 2_000_000  # Monte Carlo draws per batch, bounds memory
WINDOWED_ABOVE = 4096  #: n above which each k is integrated on its own window
_WINDOW = 40.0  # half-width of a window in standard deviations of logit(U_{k:n})
_PANELS, _GAUSS = 48, 16  # Gauss-Legendre panels per window and nodes per panel
_CELLS = 2_000_000  # k x node evaluations per batch, bounds memory


@dataclass(frozen=True)
class OrderStats:
    """E[X_{k:n}] for each k in ``k`` (1-based), with standard errors and the method used."""

    n: int
    k: NDArray[np.int64]
    mean: NDArray[np.float64]
    stderr: NDArray[np.float64]
    method: str

    def at(self, k: int) -> Estimate:
        i = int(np.searchsorted(self.k, k))
        if i >= self.k.size or self.k[i] != k:
            raise KeyError(f"k={k} was not computed")
        return Estimate(float(self.mean[i]), float(self.stderr[i]), self.method)


def expected_order_stats(
    model: DelayModel,
    n: int,
    ks: ArrayLike | None = None,
    *,
    rng: np.random.Generator | None = None,
    samples: int = 20_000,
) -> OrderStats:
    """E[X_{k:n}] for every k in ``ks`` (default 1..n), vectorised over k.

    Exact for exponential and constant models, numerical integration for other exact models,
    Monte Carlo with ``samples`` draws of n from ``rng`` only when ``model.exact`` is False.
    """
    k = _check_ks(n, ks)
    form = closed_form(model)
    if model.var == 0:  # a constant (also the sum of M constants)
        return OrderStats(n, k, np.full(k.shape, model.mean), np.zeros(k.shape), EXACT)
    if form is not None and form.exponential_rate is not None:
        mean = form.shift + exponential_order_stats(form.exponential_rate, n, k)
        return OrderStats(n, k, mean, np.zeros(k.shape), EXACT)
    if model.exact:
        integrate_ = _integrate_windows if n > WINDOWED_ABOVE else _integrate
        return OrderStats(n, k, integrate_(model, n, k), np.zeros(k.shape), NUMERICAL)
    if rng is None:
        raise UsageError(
            f"{model!r} is empirical: its order statistics need an rng for Monte Carlo"
        )
    mean, stderr = _monte_carlo(model, n, k, rng, samples)
    return OrderStats(n, k, mean, stderr, monte_carlo(samples))


def expected_order_stat(
    model: DelayModel,
    k: int,
    n: int,
    *,
    rng: np.random.Generator | None = None,
    samples: int = 20_000,
) -> Estimate:
    """E[X_{k:n}], the expected k-th smallest of n i.i.d. draws of ``model``."""
    return expected_order_stats(model, n, [k], rng=rng, samples=samples).at(k)


def exponential_order_stats(rate: float, n: int, ks: ArrayLike) -> NDArray[np.float64]:
    """E[X_{k:n}] = sum_{i=n-k+1}^{n} 1/(i rate) for X ~ Exp(rate) (slow-and-stale Remark 1)."""
    k = np.asarray(ks, dtype=np.int64)
    harmonic = np.concatenate([[0.0], np.cumsum(1.0 / np.arange(1, n + 1))])
    return (harmonic[n] - harmonic[n - k]) / rate


def sample_order_stats(
    draws: NDArray[np.float64], ks: ArrayLike
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Mean and standard error of the k-th smallest along the last axis of ``draws`` (S, n)."""
    k = np.asarray(ks, dtype=np.int64)
    ordered = np.sort(draws, axis=-1)[..., k - 1].reshape(-1, k.size)
    return ordered.mean(axis=0), ordered.std(axis=0, ddof=1) / np.sqrt(ordered.shape[0])


def _check_ks(n: int, ks: ArrayLike | None) -> NDArray[np.int64]:
    if int(n) != n or n < 1:
        raise UsageError(f"number of draws n={n} must be a positive integer")
    k = np.arange(1, n + 1) if ks is None else np.asarray(ks, dtype=np.int64).ravel()
    if k.size > 1 and not np.all(k[1:] > k[:-1]):  # already sorted and unique: skip the sort
        k = np.unique(k)
    if k.size == 0 or k.min() < 1 or k.max() > n:
        raise UsageError(f"order statistic ranks must lie in 1..{n}, got {np.asarray(ks).tolist()}")
    return k


def _integrate(model: DelayModel, n: int, k: NDArray[np.int64]) -> NDArray[np.float64]:
    """int Q(u) Beta(u; k, n-k+1) du over u = expit(s): the Beta tails become exponential in s,
    which tames heavy-tailed quantiles near u = 1."""
    log_beta = special.betaln(k, n - k + 1)

    def integrand(s: float) -> NDArray[np.float64]:
        log_weight = k * special.log_expit(s) + (n - k + 1) * special.log_expit(-s) - log_beta
        weight = np.exp(log_weight)
        return np.where(weight > 0, weight * float(model.quantile(special.expit(s))), 0.0)

    peaks = np.unique(np.log(k / (n - k + 1.0)).clip(-S_MAX + 1, S_MAX - 1))
    points = peaks[np.linspace(0, peaks.size - 1, min(peaks.size, 64)).astype(int)]
    scale = max(abs(model.mean), np.sqrt(model.var), 1e-300)
    # near u = 1 the representable u are sparse and Q(u) turns into a staircase whose noise
    # (~1e-9 relative for Pareto tails) would stall the error estimate: hence the tolerance
    # and a cap of 128 subintervals (results agree with exact forms to ~1e-10, see tests)
    value, _ = integrate.quad_vec(
        integrand,
        -S_MAX,
        S_MAX,
        epsabs=1e-9 * scale,
        epsrel=1e-9,
        norm="max",
        points=points,
        limit=128,
    )
    return np.asarray(value, dtype=float)


def _integrate_windows(model: DelayModel, n: int, k: NDArray[np.int64]) -> NDArray[np.float64]:
    """The integral of :func:`_integrate`, each k on [c - 40 w, c + 40 w] within +-S_MAX, with
    c = logit(k / (n + 1)) its peak and w = sqrt((n + 1) / (k (n - k + 1))) its width (the
    log-weight is concave with curvature -1/w^2 there, and at worst exponential in its tails,
    e^s for k = 1), by composite Gauss-Legendre, split where Q jumps (at the ends of atoms);
    vectorised over k in batches."""
    x, w = np.polynomial.legendre.leggauss(_GAUSS)
    nodes = ((np.arange(_PANELS)[:, None] + (x + 1) / 2) / _PANELS).ravel()  # in [0, 1]
    weights = np.tile(w / (2 * _PANELS), _PANELS)
    breaks = _quantile_breaks(model)
    out = np.empty(k.size)
    step = max(1, _CELLS // (nodes.size * (breaks.size + 1)))
    for start in range(0, k.size, step):
        part = k[start : start + step].astype(float)[:, None]
        centre = np.log(part / (n - part + 1))
        width = np.sqrt((n + 1) / (part * (n - part + 1)))
        low = np.clip(centre - _WINDOW * width, -S_MAX, S_MAX)
        high = np.clip(centre + _WINDOW * width, -S_MAX, S_MAX)
        edges = np.sort(np.concatenate([low, np.clip(breaks, low, high), high], axis=1), axis=1)
        size = np.diff(edges, axis=1)[:, :, None]  # pieces (k, piece, 1)
        s = edges[:, :-1, None] + size * nodes
        log_weight = (
            part[:, :, None] * special.log_expit(s)
            + (n - part[:, :, None] + 1) * special.log_expit(-s)
            - special.betaln(part, n - part + 1)[:, :, None]
        )
        values = np.asarray(model.quantile(special.expit(s)), dtype=float)
        terms = np.where(log_weight > -745, np.exp(log_weight) * values, 0.0)
        out[start : start + step] = ((terms * weights).sum(axis=2) * size[:, :, 0]).sum(axis=1)
    return out


def _quantile_breaks(model: DelayModel, most: int = 32) -> NDArray[np.float64]:
    """logit(u) where Q may jump: the cdf just below and at each atom (up to ``most`` atoms;
    a law with more is close to continuous at the scale of one atom)."""
    values, probs = model.atoms
    if values.size == 0 or values.size > most:
        return np.empty((1, 0))
    upper = np.asarray(model.cdf(values), dtype=float)
    u = np.concatenate([upper - probs, upper])
    u = np.unique(u[(u > 0) & (u < 1)])
    return np.log(u / (1 - u))[None, :]


def _monte_carlo(
    model: DelayModel, n: int, k: NDArray[np.int64], rng: np.random.Generator, samples: int
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    rows = max(1, _CHUNK // n)
    parts = [
        np.sort(model.sample(rng, (min(rows, samples - start), n)), axis=1)[:, k - 1]
        for start in range(0, samples, rows)
    ]
    ordered = np.concatenate(parts)
    return ordered.mean(axis=0), ordered.std(axis=0, ddof=1) / np.sqrt(samples)
