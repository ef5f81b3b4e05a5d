"""DropCompute's runtime analysis: E[T], E[M~](tau), S_eff(tau) and the threshold tau*.

N workers, M micro-batches each; t_n^(m) is a micro-batch time with mean mu and variance
sigma^2, T_n^(m) = sum_{j<=m} t_n^(j), T = max_n T_n^(M) the compute time of an iteration and
T^c the serial latency (AllReduce) of each iteration. With a threshold tau each worker stops at
min(tau, T_n), so an iteration takes min(tau, T) + T^c (Sec. 4.3).

* Closed forms under the CLT (App. C.2): Bailey's E[T] (Eqs. 4, 7, 12), E[M~] (Eqs. 5, 10),
  E[S_eff] (Eq. 11) and the analytic tau* ("Finding tau*").
* Exact expectations when the laws of the partial sums T^(m) are known (:func:`exact_speedup`).
* Algorithm 2 (App. C.1): the empirical tau* from measured t[i, n, m] and T^c[i]
  (:func:`empirical_threshold`), shared by the theory, the simulator and the runtime.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from tailtrain.delays.base import DelayModel
from tailtrain.errors import UsageError

# scipy (and ``order_stats``, which needs it) is imported in the functions that use it: a
# rank imports this module for Algorithm 2 (``strategies.dropcompute``), which needs neither,
# and a rank started again to heal would pay a second for it

_GRID = 1024  # candidate thresholds per pass of Algorithm 2 (two passes: coarse, then fine)
#: :func:`carried_threshold` takes the largest tau whose rate is within this of the best
CARRIED_TOLERANCE = 1e-3


def bailey_expected_max(mean: float, std: float, n: int) -> float:
    """E[max of n i.i.d. N(mean, std^2)] ~ std((1-g) Phi^-1(1 - 1/n) + g Phi^-1(1 - 1/(e n)))
    + mean, g the Euler-Mascheroni constant (DropCompute Eq. 4, after Bailey et al. 2014).

    For n = 1 the maximum is the draw itself and the mean is returned. Against the exact
    E[max] it overestimates by 0.034 std at n = 16, 0.026 at 64, 0.019 at 200 and 0.014 at
    1000 (normal draws; tests/theory/test_dropcompute.py); for skewed or heavy-tailed sums it
    can be far off (DropCompute Fig. 3b), which is why ``tailtrain predict`` does not use it.
    """
    from scipy import special

    if n < 1:
        raise UsageError(f"need n >= 1 workers, got {n}")
    if n == 1:
        return float(mean)
    g = np.euler_gamma
    z = (1 - g) * special.ndtri(1 - 1 / n) + g * special.ndtri(1 - 1 / (np.e * n))
    return float(std * z + mean)


def bailey_iteration_time(mu: float, sigma: float, n: int, m: int, comm: float = 0.0) -> float:
    """E[T] ~ Bailey's E[max] of n N(M mu, M sigma^2) sums, plus T^c (DropCompute Eqs. 7, 12)."""
    return bailey_expected_max(m * mu, np.sqrt(m) * sigma, n) + comm


def expected_completed(tau: ArrayLike, mu: float, sigma: float, m: int) -> NDArray[np.float64]:
    """E[M~](tau) ~ sum_{j=1}^{M} Phi((tau - j mu) / sqrt(j sigma^2)) (DropCompute Eqs. 5, 10);
    exact when micro-batch times are normal. Vectorised over ``tau``."""
    from scipy import special

    tau = np.asarray(tau, dtype=float)
    j = np.arange(1, m + 1)
    if sigma == 0:  # constant micro-batches: micro-batch j completes before tau iff j mu < tau
        return (tau[..., None] > j * mu).sum(axis=-1).astype(float)
    z = (tau[..., None] - j * mu) / np.sqrt(j * sigma**2)
    return special.ndtr(z).sum(axis=-1)


def analytic_speedup(
    tau: ArrayLike,
    mu: float,
    sigma: float,
    n: int,
    m: int,
    comm: float = 0.0,
    *,
    iteration_time: float | None = None,
) -> NDArray[np.float64]:
    """E[S_eff](tau) ~ E[M~]/M * (E[T] + T^c) / (min(tau, E[T]) + T^c) (DropCompute Eq. 11).

    E[T] is the compute part of Bailey's Eq. (12) unless ``iteration_time`` gives it (the
    paper's 'analytical given E[T]' curve, Fig. 3). Eq. (12) folds T^c into E[T]; here it is
    kept apart so that tau clips compute time only, as in Eq. (6).
    """
    compute = bailey_iteration_time(mu, sigma, n, m) if iteration_time is None else iteration_time
    tau = np.asarray(tau, dtype=float)
    share = expected_completed(tau, mu, sigma, m) / m
    return share * (compute + comm) / (np.minimum(tau, compute) + comm)


def analytic_threshold(
    mu: float, sigma: float, n: int, m: int, comm: float = 0.0
) -> tuple[float, float]:
    """tau* = argmax_tau sum_m Phi((tau - m mu)/sqrt(m sigma^2)) / (tau + T^c) (App. C.2,
    'Finding tau*'), searched over Mu/2 < tau <= E[T] (Assumption C.3 and Eq. 12).

    Returns ``(tau*, E[S_eff](tau*))`` by Eq. (11).
    """
    from scipy import optimize

    upper = bailey_iteration_time(mu, sigma, n, m)
    lower = min(m * mu / 2, upper)
    grid = np.linspace(lower, upper, 2048)
    objective = expected_completed(grid, mu, sigma, m) / (grid + comm)
    best = _last_argmax(objective)
    lo, hi = grid[max(best - 1, 0)], grid[min(best + 1, grid.size - 1)]
    if hi > lo:
        result = optimize.minimize_scalar(
            lambda t: -expected_completed(t, mu, sigma, m) / (t + comm),
            bounds=(lo, hi),
            method="bounded",
            options={"xatol": 1e-10 * max(upper, 1e-300)},
        )
        tau = float(result.x) if -result.fun >= objective[best] else float(grid[best])
    else:
        tau = float(grid[best])
    return tau, float(analytic_speedup(tau, mu, sigma, n, m, comm))


@dataclass(frozen=True)
class ThresholdChoice:
    """The outcome of Algorithm 2 (DropCompute App. C.1) on measured times.

    ``effective_speedup`` is S_eff(tau*) = mean_i S_i(tau*); ``drop_rate`` = 1 - E[M~]/M;
    ``iteration_time`` and ``baseline_time`` are the mean of min(tau*, T_i) + T^c_i and of
    T_i + T^c_i; ``thresholds``/``speedups`` is the S_eff curve that was searched.
    """

    threshold: float
    effective_speedup: float
    drop_rate: float
    iteration_time: float
    baseline_time: float
    thresholds: NDArray[np.float64]
    speedups: NDArray[np.float64]


def empirical_speedup(
    t: ArrayLike, comm: ArrayLike, thresholds: ArrayLike
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """S_eff(tau) and E[M~](tau)/M of Algorithm 2 for every tau in ``thresholds``, vectorised.

    ``t[i, n, m]``: micro-batch times; ``comm[i]``: T^c_i. S_i(tau) = (T_i + T^c_i) /
    (min(tau, T_i) + T^c_i) * M~_i(tau) / M, M~_i counting T_{i,n}^(m) < tau over n, / N.
    """
    t, comm = _check_samples(t, comm), np.asarray(comm, float)
    tau = np.sort(np.ravel(np.asarray(thresholds, dtype=float)))
    iterations, workers, m = t.shape
    cumulative = np.cumsum(t, axis=2).reshape(iterations, -1)
    step_time = cumulative.max(axis=1)
    # a micro-batch finished by time c counts for every tau > c: tally each at its first such
    # tau (index tau.size: none), then a cumulative sum over tau gives the counts
    below = (cumulative < tau[0]).sum(axis=1)
    row, col = np.nonzero((cumulative >= tau[0]) & (cumulative < tau[-1]))
    first = np.searchsorted(tau, cumulative[row, col], side="right")
    done = np.bincount(row * (tau.size + 1) + first, minlength=iterations * (tau.size + 1))
    counts = done.reshape(iterations, -1).cumsum(axis=1)[:, : tau.size] + below[:, None]
    share = counts / (workers * m)
    ratio = (step_time + comm)[:, None] / (np.minimum(tau, step_time[:, None]) + comm[:, None])
    return (share * ratio).mean(axis=0), share.mean(axis=0)


def empirical_threshold(
    t: ArrayLike, comm: ArrayLike, thresholds: ArrayLike | None = None
) -> ThresholdChoice:
    """tau* = argmax S_eff(tau) over candidate thresholds (DropCompute Algorithm 2).

    Default candidates: 1024 points from M mean(t) / 2 (Assumption C.3: lower thresholds drop
    an unacceptable share) to max_i T_i, half evenly spaced and half quantiles of the
    iterations' compute times T_i, then 1024 points around the best of them. A tau just above
    every T_i, where nothing is dropped and S_eff = 1, is always a candidate.
    """
    t, comm = _check_samples(t, comm), np.asarray(comm, float)
    step_time = np.cumsum(t, axis=2)[:, :, -1].max(axis=1)
    never = np.nextafter(step_time.max(), np.inf)
    if thresholds is not None:
        candidates = np.unique(np.append(np.ravel(thresholds), never))
        return _choice(t, comm, candidates, empirical_speedup(t, comm, candidates)[0], step_time)
    lowest = min(t.shape[2] * t.mean() / 2, step_time.min())
    coarse = np.unique(
        np.concatenate(
            [
                np.linspace(lowest, step_time.max(), _GRID // 2),
                np.quantile(step_time, np.linspace(0, 1, _GRID // 2)),
                [never],
            ]
        )
    )
    coarse_speedups = empirical_speedup(t, comm, coarse)[0]
    best = _last_argmax(coarse_speedups)
    fine = np.linspace(coarse[max(best - 1, 0)], coarse[min(best + 1, coarse.size - 1)], _GRID)
    candidates = np.concatenate([coarse, fine])
    speedups = np.concatenate([coarse_speedups, empirical_speedup(t, comm, fine)[0]])
    order = np.argsort(candidates, kind="stable")
    return _choice(t, comm, candidates[order], speedups[order], step_time)


def carried_threshold(t: ArrayLike, comm: ArrayLike, shares: ArrayLike) -> float:
    """tau* for a threshold whose cut is carried to the next step, not dropped (issue 25).

    With the cut dealt again (``rebalance:then=dropcompute,defer=true``) nothing is lost, so
    the right score is not S_eff(tau) of Algorithm 2, a mean over rounds of per-round ratios,
    but the long-run rate of completed micro-batches, a ratio of sums (renewal-reward):

        tau* = argmax_tau  sum_i sum_n #{u <= m_n : T_{i,n}^(u) < tau}
                           / sum_i (min(tau, T_i) + T^c_i),      T_i = max_n T_{i,n}^(m_n),

    rank n computing its share m_n (``shares``; ``t[i, n, u]`` holds at least max m_n units,
    those past m_n are ignored). The micro-batch in flight at tau is charged in full to the
    denominator and counts nothing: its partial time is wasted, as it is when carried. The
    rate is constant between the partial sums and falls as tau grows, so its maximum lies
    just above one of them (or at tau = max_i T_i, nothing cut): every partial sum is a
    candidate. Its top is flat, so its argmax wanders with the draws while the rate barely
    moves: the candidate returned is the largest whose rate is within ``CARRIED_TOLERANCE``
    of the best, where the rate falls steeply (and the fewest micro-batches are cut).

    Not the rule's tau: chosen on real unit times (which include each rank's compute) its flat
    top moves it far enough that the combination's real iteration time left ``simulate``'s
    by 12-14%, so ``rebalance`` keeps Algorithm 2 (docs/strategies/rebalance.md);
    ``bench/bench_rebalance.py --part feasibility`` uses :func:`carried_rates` for its bound.
    """
    tau, rate = carried_rates(t, comm, shares)
    near = np.flatnonzero(rate >= rate.max() * (1.0 - CARRIED_TOLERANCE))
    return float(tau[near[-1]])


def carried_rates(
    t: ArrayLike, comm: ArrayLike, shares: ArrayLike
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Every candidate tau of :func:`carried_threshold` (just above each partial sum,
    increasing) and the rate of completed micro-batches per second at each."""
    t, comm = _check_samples(t, comm), np.asarray(comm, float)
    shares = np.asarray(shares, dtype=np.int64)
    if shares.shape != (t.shape[1],) or shares.min() < 1 or shares.max() > t.shape[2]:
        raise UsageError(f"shares {shares.tolist()} do not fit samples of shape {t.shape}")
    cumulative = np.cumsum(t, axis=2)
    own = np.arange(t.shape[2]) < shares[:, None]
    ends = np.sort(cumulative[:, own])  # (I, sum m_n): every counted unit's finish time
    step = np.sort(ends.max(axis=1))
    # just above each partial sum: that unit (and all below it) counts
    tau = np.nextafter(np.unique(ends), np.inf)
    completed = np.searchsorted(np.sort(ends.ravel()), tau, side="left")
    # sum_i min(tau, T_i): the T_i below tau in full, tau for the rest
    below = np.searchsorted(step, tau, side="left")
    partial = np.concatenate([[0.0], np.cumsum(step)])[below]
    time = partial + tau * (step.size - below) + comm.sum()
    return tau, completed / np.maximum(time, np.finfo(float).tiny)


@dataclass(frozen=True)
class ThresholdEvaluation:
    """Long-run effect of a fixed tau on independent samples (ratio of means, Eq. 6).

    ``effective_speedup`` = (sum M~_i / (I M)) * sum(T_i + T^c_i) / sum(min(tau, T_i) + T^c_i),
    the ratio of samples per second with and without DropCompute, with a delta-method
    ``stderr``; ``iteration_time`` is the mean of min(tau, T_i) + T^c_i.
    """

    threshold: float
    effective_speedup: float
    stderr: float
    drop_rate: float
    iteration_time: float
    iteration_time_stderr: float
    baseline_time: float
    baseline_time_stderr: float


def evaluate_threshold(t: ArrayLike, comm: ArrayLike, tau: float) -> ThresholdEvaluation:
    """S_eff of a given tau on samples ``t[i, n, m]``, ``comm[i]`` not used to choose it."""
    t, comm = _check_samples(t, comm), np.asarray(comm, float)
    cumulative = np.cumsum(t, axis=2)
    share = (cumulative < tau).mean(axis=(1, 2))
    step_time = cumulative[:, :, -1].max(axis=1)
    base, clipped = step_time + comm, np.minimum(tau, step_time) + comm
    value = share.mean() * base.mean() / clipped.mean()
    influence = value * (share / share.mean() + base / base.mean() - clipped / clipped.mean())
    return ThresholdEvaluation(
        threshold=float(tau),
        effective_speedup=float(value),
        stderr=_stderr(influence),
        drop_rate=float(1 - share.mean()),
        iteration_time=float(clipped.mean()),
        iteration_time_stderr=_stderr(clipped),
        baseline_time=float(base.mean()),
        baseline_time_stderr=_stderr(base),
    )


def _stderr(values: NDArray[np.float64]) -> float:
    """Standard error of the mean; exactly 0 when every value is equal (e.g. tau < all T_i)."""
    if np.ptp(values) == 0 or values.size < 2:
        return 0.0
    return float(values.std(ddof=1) / np.sqrt(values.size))


@dataclass(frozen=True)
class ExactSpeedup:
    """S_eff(tau) = E[M~]/M * (E[T] + E[T^c]) / (E[min(tau, T)] + E[T^c]) from exact laws."""

    threshold: float
    effective_speedup: float
    drop_rate: float
    iteration_time: float
    baseline_time: float


def exact_speedup(
    partial_sums: Sequence[DelayModel],
    n: int,
    tau: float,
    comm: float = 0.0,
    *,
    expected_max: float | None = None,
) -> ExactSpeedup:
    """S_eff(tau) by Eq. (6) in expectation, with ``partial_sums[m-1]`` the law of T_n^(m).

    E[M~] = sum_m P(T^(m) < tau) (App. C.2); E[min(tau, T)] = E[T] - int_tau^inf (1 - F^n)
    with F the cdf of T_n^(M). ``comm`` is E[T^c]; ``expected_max`` is E[T] if known.
    """
    full, m = partial_sums[-1], len(partial_sums)
    from tailtrain.theory.order_stats import expected_order_stat

    mean_max = expected_order_stat(full, n, n).value if expected_max is None else expected_max
    completed = sum(float(law.cdf(tau)) for law in partial_sums)
    upper = float(full.support[1])
    beyond = _integral_of_max_sf(full, n, tau, upper)
    clipped = mean_max - (beyond if upper > tau else 0.0)
    return ExactSpeedup(
        threshold=float(tau),
        effective_speedup=completed / m * (mean_max + comm) / (clipped + comm),
        drop_rate=1 - completed / m,
        iteration_time=clipped + comm,
        baseline_time=mean_max + comm,
    )


def exact_threshold(partial_sums: Sequence[DelayModel], n: int, comm: float = 0.0) -> ExactSpeedup:
    """tau* = argmax of :func:`exact_speedup` over M mu / 2 <= tau (Assumption C.3; lower
    thresholds drop an unacceptable share) up to the top of T: 512 grid points, then 512
    around the best, then the exact value at the best point."""
    full = partial_sums[-1]
    from tailtrain.theory.order_stats import expected_order_stat

    mean_max = expected_order_stat(full, n, n).value
    lowest = max(float(full.quantile(1e-3)), full.mean / 2)
    top = float(full.quantile((1 - 1e-9) ** (1 / n)))
    # half evenly, half geometrically spaced: a heavy tail puts top far above tau*
    spaced = lowest + np.geomspace(1e-6 * (top - lowest), top - lowest, 256)
    grid = np.unique(np.concatenate([np.linspace(lowest, top, 256), spaced]))
    curve = _speedup_curve(partial_sums, n, grid, comm, mean_max)
    # an atomic law's curve has a peak just past each atom of the sum (the micro-batches it
    # completes jump there): every leading peak is refined, not the coarse grid's best alone
    found = []
    for peak in _peaks(curve, PEAKS_REFINED):
        zoom = grid
        for _ in range(2):
            zoom = np.linspace(zoom[max(peak - 1, 0)], zoom[min(peak + 1, zoom.size - 1)], 512)
            values = _speedup_curve(partial_sums, n, zoom, comm, mean_max)
            peak = _last_argmax(values)
        found.append((values[peak], zoom[peak]))
    best = max(v for v, _ in found)
    # ties (to 1e-12) go to the largest tau, which drops the least work (``_last_argmax``)
    tau = max(t for v, t in found if v >= best - 1e-12 * abs(best))
    return exact_speedup(partial_sums, n, float(tau), comm, expected_max=mean_max)


PEAKS_REFINED = 8  #: the coarse curve's highest local maxima that :func:`exact_threshold` zooms


def _peaks(curve: NDArray[np.float64], count: int) -> list[int]:
    """The indices of ``curve``'s ``count`` highest local maxima (its global one first)."""
    padded = np.concatenate([[-np.inf], curve, [-np.inf]])
    local = np.flatnonzero((padded[1:-1] >= padded[:-2]) & (padded[1:-1] >= padded[2:]))
    ranked = local[np.argsort(-curve[local], kind="stable")]
    return list(dict.fromkeys([_last_argmax(curve), *(int(i) for i in ranked)]))[:count]


def _speedup_curve(
    partial_sums: Sequence[DelayModel],
    n: int,
    grid: NDArray[np.float64],
    comm: float,
    mean_max: float,
) -> NDArray[np.float64]:
    """exact_speedup on an increasing grid, vectorised for the search: the tail integrals of
    1 - F^n use 16-point Gauss-Legendre on each grid interval, summed from the top, plus one
    adaptive quadrature beyond the grid."""
    nodes, weights = np.polynomial.legendre.leggauss(16)
    lo, hi = grid[:-1, None], grid[1:, None]
    x = (hi + lo) / 2 + (hi - lo) / 2 * nodes
    pieces = (_max_sf(partial_sums[-1], n, x) * weights).sum(axis=1) * (grid[1:] - grid[:-1]) / 2
    full = partial_sums[-1]
    tail = _integral_of_max_sf(full, n, grid[-1], float(full.support[1]))
    beyond = np.append(np.cumsum(pieces[::-1])[::-1], 0.0) + tail
    completed = sum(law.cdf(grid) for law in partial_sums)
    m = len(partial_sums)
    return completed / m * (mean_max + comm) / (mean_max - beyond + comm)


def _integral_of_max_sf(law: DelayModel, n: int, lo: float, hi: float) -> float:
    """int_lo^hi (1 - F^n) dx; the atoms of a lattice law are breakpoints for the quadrature."""
    from scipy import integrate

    if not hi > lo:
        return 0.0
    if np.isfinite(hi) and hi - lo <= 4 * np.spacing(hi):
        return 0.0  # a few ulps wide (tau at the top of T): under 1e-15, and quad warns on it
    atoms = law.atoms[0]
    inside = atoms[(atoms > lo) & (atoms < hi)]
    if np.isfinite(hi) and inside.size:
        pieces = np.concatenate([[lo], inside, [hi]])
        return float(
            sum(
                integrate.quad(lambda x: _max_sf(law, n, x), a, b)[0]
                for a, b in itertools.pairwise(pieces)
            )
        )
    return float(integrate.quad(lambda x: _max_sf(law, n, x), lo, hi, limit=400)[0])


def _last_argmax(values: NDArray[np.float64]) -> int:
    """Index of the largest value; among ties (to 1e-12) the last, i.e. the largest tau,
    which drops the least work."""
    values = np.asarray(values, dtype=float)
    top = values.max()
    return int(np.flatnonzero(values >= top - 1e-12 * abs(top))[-1])


def _max_sf(law: DelayModel, n: int, x: ArrayLike) -> NDArray[np.float64]:
    """1 - F(x)^n, formed as -expm1(n log F) to keep precision in the far tail."""
    f = np.asarray(law.cdf(x), dtype=float)
    with np.errstate(divide="ignore"):
        return np.where(f > 0, -np.expm1(n * np.log(f)), 1.0)


def _choice(
    t: NDArray[np.float64],
    comm: NDArray[np.float64],
    candidates: NDArray[np.float64],
    speedups: NDArray[np.float64],
    step_time: NDArray[np.float64],
) -> ThresholdChoice:
    best = _last_argmax(speedups)
    tau = float(candidates[best])
    share = (np.cumsum(t, axis=2) < tau).mean()
    return ThresholdChoice(
        threshold=tau,
        effective_speedup=float(speedups[best]),
        drop_rate=float(1 - share),
        iteration_time=float((np.minimum(tau, step_time) + comm).mean()),
        baseline_time=float((step_time + comm).mean()),
        thresholds=candidates,
        speedups=speedups,
    )


def _check_samples(t: ArrayLike, comm: ArrayLike) -> NDArray[np.float64]:
    t = np.asarray(t, dtype=float)
    if t.ndim != 3 or 0 in t.shape:
        raise UsageError(
            f"micro-batch times must have shape (I, N, M) with I, N, M >= 1: {t.shape}"
        )
    if np.shape(comm) != (t.shape[0],):
        raise UsageError(f"communication times need shape ({t.shape[0]},), got {np.shape(comm)}")
    return t
