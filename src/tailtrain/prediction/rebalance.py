"""``predict``'s row for ``rebalance``: the iteration time under the optimal shares.

Worker n's micro-batch law has mean mu_n. The shares are the makespan-optimal integers for
those means (``strategies.rebalance.optimal_shares``, the rule's own function): T* is the
smallest T with sum_n max(1, floor(T / mu_n)) >= N M and m_n = floor(T* / mu_n), trimmed to
N M. T* itself is the closed form, exact when the times are constant. With random times a
step takes E[max_n S_n(m_n)] + E[T^c], S_n(m) the sum of m of worker n's micro-batch times;
that expectation is a Monte Carlo on ``predict``'s shared sample, which reads each worker's
draws as one stream of micro-batches and cuts it into successive steps of m_n (so a share
above M takes the next iteration's draws, as the simulator does).

The means come from the laws: i.i.d. workers all have the delay's mean, so the shares are
equal and the row is the allreduce sync's; under a worker pattern, mu_n is worker n's mean
in each independent run, the same run replayed over the delay's mean
(``_Context.worker_means``: per-run patterns such as ``heterogeneous`` draw their speeds
once per run); a trace replayed per worker gives each worker's mean over its own draws.
Nothing is dropped, so the effective speedup (samples per second over sync) is the speedup.
Everything is vectorised over workers: a few reshaped sums over the draws per run (one per
distinct share), no gather.

Above ``LARGE_N`` workers under ``heterogeneous`` speeds no draws are made
(:func:`rebalance_quadrature`): given a run's speeds s_n and shares m_n, the workers are
independent, so E[max_n s_n S_n(m_n)] = int_0^inf (1 - prod_n F_{m_n}(x / s_n)) dx with F_m
the law of the sum of m micro-batches, integrated numerically with the speeds binned per
share (:data:`SPEED_BINS` bins, each at its members' mean speed), from where P(max <= x)
reaches 1e-16 to where P(max > x) falls to 1e-13 (or the support ends); the runs' spread
gives the standard error.

``rebalance:deal=demand`` (:func:`demand_times`, :func:`demand_mean_field`) has no shares:
each micro-batch goes to whichever rank asks next until N M are complete, and the unit each
other rank has in flight then is cut (its work lost; carried units draw fresh times). So a
step takes T = the smallest t with sum_n N_n(t) >= N M, N_n(t) the number of micro-batches
worker n finishes by t from fresh draws (a renewal count), plus T^c: the (N M)-th smallest
of the N workers' partial sums of their draws. Constant times give the closed form T*, the
makespan of ``optimal_shares`` with no floor (a rank may finish none). Up to ``LARGE_N``
workers E[T] is a Monte Carlo on ``predict``'s shared sample; above it (i.i.d. workers, or
``heterogeneous`` speeds) the law of large numbers: sum_n N_n(t) / N tends to E_s[m(t / s)],
m the renewal function, so T tends to the t* with E_s[m(t* / s)] = M, m estimated from
independent sequences of micro-batch times each at its own speed (as K-batch-sync's
mean-field, ``theory.meanfield``: t* is the ceil(S M)-th smallest of their pooled partial
sums).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from numpy.typing import NDArray

from tailtrain.delays.base import DelayModel
from tailtrain.strategies.rebalance import demand_end, optimal_shares

DEMAND_SPEC = "rebalance:deal=demand"  #: the spec of predict's rebalance row dealt on demand
DEMAND_SEQUENCES = 2**17  #: micro-batch sequences of :func:`demand_mean_field`
DEMAND_GROUPS = 16  #: batches of those sequences whose spread gives the standard error
DEMAND_DRAWS = 2**25  #: at most this many micro-batch draws there (256 MiB)
SPEED_BINS = 1024  #: speed bins per share in :func:`rebalance_quadrature`
_PANELS, _NODES = 64, 8  # Gauss-Legendre panels over the max's range, nodes per panel
_EDGE = 1e-16  # the range: from P(max <= x) = _EDGE ...
_TAIL = 1e-13  # ... up to P(max > x) = _TAIL (a sum law's cdf may stop short of 1 by ~1e-15)
_SCAN = 512  # points of the scan for the lower end of that range


def stepped_times(t: NDArray[np.float64], shares: NDArray[np.int64]) -> NDArray[np.float64]:
    """Compute times max_n S_n(m_n) of the successive steps in draws t[i, n, m].

    Worker n's draws, iteration after iteration, are one stream of micro-batches; step j
    takes its micro-batches j m_n .. (j + 1) m_n - 1. As many steps as the busiest worker's
    stream holds. Workers of one share are cut alike: their streams (one slice once the
    workers are sorted by share) reshape to (workers, steps, share) and sum, no gather. A run
    has few distinct shares (they sum to N M: at most sqrt(2 N M), about M times the speed
    spread in practice), so this is a few passes over the draws: at 10^6 workers the row
    takes ~1 s of CPU where a gather of partial sums took ~14 s."""
    iterations, workers, m = t.shape
    steps = iterations * m // int(shares.max())
    order = np.argsort(shares, kind="stable")
    # one copy: worker-major streams, rows sorted by share, so each share's rows are a slice
    streams = t.transpose(1, 0, 2)[order].reshape(workers, iterations * m)
    ranked = shares[order]
    starts = np.flatnonzero(np.diff(ranked, prepend=-1))
    out = np.zeros(steps)
    for lo, hi in zip(starts, [*starts[1:], workers], strict=True):
        share = int(ranked[lo])
        cut = streams[lo:hi, : steps * share]
        sums = cut if share == 1 else cut.reshape(hi - lo, steps, share).sum(axis=2)
        np.maximum(out, sums.max(axis=0), out=out)  # draws are non-negative: 0 is a floor
    return out


def rebalance_times(
    t: NDArray[np.float64], comm: NDArray[np.float64], means: NDArray[np.float64]
) -> tuple[float, float, float, NDArray[np.int64]]:
    """One run's (E[T], its standard error, T* + mean T^c, shares) under the optimal shares
    for the workers' mean micro-batch times ``means``; E[T] is NaN when the busiest worker's
    share exceeds the run's draws (no whole step to measure)."""
    iterations, workers, m = t.shape
    shares = optimal_shares(means, workers * m)
    closed = float((shares * means).max()) + float(comm.mean())
    if shares.max() > iterations * m:
        return np.nan, np.nan, closed, shares
    steps = stepped_times(t, shares) + comm[: iterations * m // int(shares.max())]
    stderr = float(steps.std(ddof=1) / np.sqrt(steps.size)) if steps.size > 1 else 0.0
    return float(steps.mean()), stderr, closed, shares


def rebalance_quadrature(
    speeds: NDArray[np.float64],
    mean: float,
    sum_law: Callable[[int], DelayModel],
    total: int,
) -> tuple[float, float, NDArray[np.int64]]:
    """One run's (E[max_n s_n S_n(m_n)], T*, shares) with worker n at speed ``speeds[n]``
    (micro-batch times s_n X, E[X] = ``mean``), the shares optimal for the means s_n E[X]
    (the rule's ``optimal_shares``) and ``sum_law(m)`` the law of the sum of m micro-batches.
    See the module docstring."""
    shares = optimal_shares(speeds * mean, total)
    closed = float((shares * speeds * mean).max())
    low, high = float(speeds.min()), float(speeds.max())
    scale = SPEED_BINS / max(high - low, 1e-300)
    groups = []  # (law, bin speeds, bin counts) per distinct share
    for m in np.flatnonzero(np.bincount(shares)):
        mine = speeds[shares == m]
        index = np.clip((mine - low) * scale, 0, SPEED_BINS - 1).astype(np.int64)
        count = np.bincount(index, minlength=SPEED_BINS)
        total_speed = np.bincount(index, weights=mine, minlength=SPEED_BINS)
        used = count > 0
        groups.append((sum_law(int(m)), total_speed[used] / count[used], count[used]))

    def log_cdf(x: NDArray[np.float64]) -> NDArray[np.float64]:
        """log P(max <= x) for each x."""
        out = np.zeros(x.shape)
        with np.errstate(divide="ignore"):
            for law, speed, count in groups:
                cdf = np.asarray(law.cdf(x[:, None] / speed[None, :]), dtype=float)
                out += (count * np.log(cdf)).sum(axis=1)
        return out

    hi = max(closed, 1e-300)
    top = max(float(speed.max()) * law.support[1] for law, speed, _ in groups)
    for _ in range(64):  # P(max > hi) above _TAIL: double, up to the support's top
        if hi >= top or log_cdf(np.array([hi]))[0] >= -_TAIL:
            break
        hi *= 2
    hi = min(hi, top)
    # below the last x where P(max <= x) < _EDGE, 1 - P(max <= x) is 1 (to _EDGE)
    coarse = hi * np.arange(1, _SCAN + 1) / _SCAN
    below = coarse[log_cdf(coarse) < np.log(_EDGE)]
    start = float(below[-1]) if below.size else 0.0
    nodes, weights = np.polynomial.legendre.leggauss(_NODES)
    width = (hi - start) / _PANELS
    x = start + width * (np.arange(_PANELS)[:, None] + (nodes + 1) / 2)
    tail = -np.expm1(log_cdf(x.ravel())).reshape(x.shape)
    return start + float((tail * weights).sum() * width / 2), closed, shares


def demand_ends(t: NDArray[np.float64], units: int) -> tuple[NDArray[np.float64], bool]:
    """The (N M)-th completion of each successive step of ``deal=demand`` in draws t[i, n, m]:
    worker n's draws are one stream, each step takes ``units`` fresh ones per worker, and its
    end is the (N M)-th smallest of the N workers' partial sums. Also whether that is exact:
    every worker's ``units`` draws last until the end, so no completion before it is unseen."""
    iterations, workers, m = t.shape
    steps = iterations * m // units
    streams = t.transpose(1, 0, 2).reshape(workers, iterations * m)[:, : steps * units]
    ends = np.cumsum(streams.reshape(workers, steps, units), axis=2)
    end = demand_end(ends.transpose(1, 0, 2), workers * m)  # the rule's own end, every step
    return end, bool((ends[:, :, -1] >= end[None, :]).all())


def demand_times(
    t: NDArray[np.float64], comm: NDArray[np.float64], means: NDArray[np.float64]
) -> tuple[float, float, float, int]:
    """One run's (E[T], its standard error, T* + mean T^c, draws per worker per step) of
    ``deal=demand`` (module docstring); E[T] is NaN when no step's draws suffice."""
    iterations, workers, m = t.shape
    pool = workers * m
    shares = optimal_shares(means, pool, floor=0)
    closed = float((shares * means).max()) + float(comm.mean())
    # twice each worker's share at the means, doubled while some worker runs out before the
    # step ends (its later completions unseen); N M draws each always suffice: any one worker
    # finishing N M alone ends the step
    units = min(pool, 2 * int(shares.max()) + 2)
    while units <= iterations * m:
        end, exact = demand_ends(t, units)
        if exact:
            steps = end + comm[: end.size]
            stderr = float(steps.std(ddof=1) / np.sqrt(steps.size)) if steps.size > 1 else 0.0
            return float(steps.mean()), stderr, closed, units
        if units == pool:
            break
        units = min(pool, 2 * units)
    return np.nan, np.nan, closed, units


def demand_mean_field(
    draw: Callable[[np.random.Generator, tuple[int, int]], NDArray[np.float64]],
    speeds: tuple[float, float] | None,
    m: int,
    rng: np.random.Generator,
    sequences: int = DEMAND_SEQUENCES,
) -> tuple[float, float, int, int, bool]:
    """(t*, its standard error, sequences, draws per sequence, whether exact) of
    ``deal=demand`` as N -> infinity (module docstring): ``sequences`` sequences of
    micro-batch times ``draw(rng, shape)``, each scaled by its own speed ~ U(``speeds``)
    (none: i.i.d. workers), lengthened until every one lasts beyond t* (so no partial sum
    below t* is unseen; not exact if :data:`DEMAND_DRAWS` would not hold them); the spread
    of :data:`DEMAND_GROUPS` batches of sequences gives the standard error. Fewer
    sequences where the first draws alone would pass :data:`DEMAND_DRAWS` (a large M)."""
    fastest = 1.0 if speeds is None else speeds[1] / speeds[0]
    length = 2 * m * math.ceil(fastest) + 2  # the fastest finishes ~M high/low units by t*
    # whole groups, at least one sequence each, the first draws within the cap
    sequences = min(sequences, DEMAND_DRAWS // length)
    sequences = max(sequences // DEMAND_GROUPS, 1) * DEMAND_GROUPS
    speed = None if speeds is None else rng.uniform(*speeds, size=(sequences, 1))

    def more(count: int) -> NDArray[np.float64]:
        times = draw(rng, (sequences, count))
        return times if speed is None else times * speed

    times = more(length)
    while True:
        sums = np.cumsum(times, axis=1)
        value = _demand_quantile(sums, m)
        exact = bool(sums[:, -1].min() >= value)
        if exact or 2 * times.size > DEMAND_DRAWS:
            break
        times = np.concatenate([times, more(times.shape[1])], axis=1)
    parts = [_demand_quantile(part, m) for part in np.split(sums, DEMAND_GROUPS)]
    stderr = float(np.std(parts, ddof=1) / math.sqrt(DEMAND_GROUPS))
    return value, stderr, sequences, times.shape[1], exact


def _demand_quantile(sums: NDArray[np.float64], m: int) -> float:
    """The ceil(S m)-th smallest pooled partial sum of S sequences: m-hat(t) >= m there."""
    rank = sums.shape[0] * m - 1
    return float(np.partition(sums.ravel(), rank)[rank])
