"""Large-N (mean-field) iteration times of K-async and K-batch-sync with i.i.d. jobs (and
K-async's with workers of several speeds, :func:`k_async_mean_field_mixed`).

At N = 10^6 workers a Monte Carlo of these variants must warm up for about N/K iterations of
O(N) work each, so ``predict`` uses these N -> infinity limits with K/N fixed instead. Both
are exact for the exponential in the limit, and their finite-N error is O(1/N) relative in
the bulk of K (tests compare them with the Monte Carlo of ``theory.montecarlo`` at N = 200
and 2000).

* K-async (slow-and-stale Sec. II-B: the K first finishers wait for the update, the others
  keep going). With many workers the K-th finish time is nearly deterministic, so in steady
  state updates come every tau seconds and a job J started at an update restarts at the first
  update after it finishes: its worker's cycle lasts tau * ceil(J / tau). K workers restart
  per update, so the renewal rate N / (tau E[ceil(J / tau)]) equals K / tau, i.e.

      E[ceil(J / tau)] = N / K.

  For J ~ Exp(mu) this gives tau = log(N / (N - K)) / mu, the limit of E[X_{K:N}] (Theorem 2's
  proof). Writing E[ceil(J/tau)] = E[J]/tau + delta(tau) with delta = E[ceil(J/tau) - J/tau]
  in [0, 1), tau lies in [K E[J] / N, K E[J] / (N - K)]: the renewal-reward bounds of the
  finite system (every worker is busy or waits less than one update, Lemma 5's argument).
  delta is estimated on a sample of J with E[J] exact (a control variate), so the sampling
  error only enters through the bounded fractional part. Near K = N the K-th finish is an
  extreme order statistic, not a fluid quantity: the error grows like 1 / (N - K), so
  ``predict`` simulates K > N - :data:`MIN_GAP` instead.
* K-batch-sync (every worker computes back to back, the update comes with the K-th job
  overall). The number of jobs done by time t is a sum of N i.i.d. renewal counts, so the
  K-th arrival tends to the t with m(t) = K / N, m(t) = sum_j P(J_1 + ... + J_j <= t) the
  renewal function. m is estimated from S independent job sequences: t* is the
  ceil(S K / N)-th smallest of their pooled partial sums (for Exp(mu), m(t) = mu t and
  t* = K / (N mu), Eq. 10).
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike, NDArray

from tailtrain.errors import UsageError

MIN_GAP = 256  #: K-async's mean-field limit is used for N - K >= MIN_GAP only
GROUPS = 16  #: batches of K-batch-sync sequences whose spread gives the standard error
_BISECTIONS = 64  #: halvings of the bracket [K E[J]/N, K E[J]/(N-K)]: below 1e-12 relative


def k_async_mean_field(
    jobs: NDArray[np.float64], mean: float, workers: int, ks: ArrayLike
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """tau solving E[J]/tau + delta(tau) = N/K for each K (see the module docstring), with
    delta estimated on the job sample ``jobs`` and E[J] = ``mean``; returns tau and the
    standard error propagated from delta's (d tau / d delta = tau^2 / E[J])."""
    k = np.asarray(ks, dtype=float)
    if np.any(k < 1) or np.any(k >= workers) or not mean > 0 or jobs.ndim != 1:
        raise UsageError(f"need 1 <= K < N={workers}, E[J] > 0 and a 1-D job sample")
    low, high = k * mean / workers, k * mean / (workers - k)
    for _ in range(_BISECTIONS):
        mid = 0.5 * (low + high)
        ratio = jobs[:, None] / mid
        cycles = mean / mid + (np.ceil(ratio) - ratio).mean(axis=0)
        short = cycles > workers / k  # more than N/K updates per job: tau is too small
        low, high = np.where(short, mid, low), np.where(short, high, mid)
    tau = high  # the smallest tau with E[ceil(J/tau)] <= N/K (a lattice law has a range)
    ratio = jobs[:, None] / tau
    spread = (np.ceil(ratio) - ratio).std(axis=0, ddof=1) / math.sqrt(jobs.size)
    return tau, tau**2 / mean * spread


def k_async_mean_field_mixed(
    jobs: NDArray[np.float64],
    means: NDArray[np.float64],
    weights: NDArray[np.float64],
    workers: int,
    ks: ArrayLike,
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """K-async's mean-field tau when workers differ in speed: a share ``weights[g]`` of them
    has jobs J_g (sample ``jobs[g]``, mean ``means[g]``). A worker of class g restarts once
    every E[ceil(J_g / tau)] updates, so the renewal balance of the module docstring becomes

        sum_g weights[g] / E[ceil(J_g / tau)] = K / N,

    the same as E[ceil(J/tau)] = N/K for one class (a harmonic, not arithmetic, mean: a slow
    worker restarts less often). E[ceil(J_g/tau)] = E[J_g]/tau + delta_g(tau) as above, with
    delta_g on the sample. tau is bisected from its renewal-reward lower bound
    (K/N) / sum_g weights[g] / E[J_g] up; the standard error is propagated from the deltas'
    (jointly, the classes share their random numbers)."""
    k = np.asarray(ks, dtype=float)
    if np.any(k < 1) or np.any(k >= workers) or not np.all(means > 0) or jobs.ndim != 2:
        raise UsageError(f"need 1 <= K < N={workers}, every E[J] > 0 and jobs[class, draw]")
    w, mu = weights[:, None, None], means[:, None, None]
    target = k / workers

    def rate(tau: NDArray[np.float64]) -> tuple[NDArray, NDArray]:
        ratio = jobs[:, :, None] / tau
        frac = np.ceil(ratio) - ratio
        cycles = mu[:, :, 0] / tau + frac.mean(axis=1)  # (class, K)
        return (weights[:, None] / cycles).sum(axis=0), frac

    low = target / float((weights / means).sum())
    high = 2 * low
    while np.any(few := rate(high)[0] < target):  # fewer than K restarts: tau too small
        high = np.where(few, 2 * high, high)
    for _ in range(_BISECTIONS):
        mid = 0.5 * (low + high)
        few = rate(mid)[0] < target
        low, high = np.where(few, mid, low), np.where(few, high, mid)
    tau = high
    _, frac = rate(tau)
    cycles = mu / tau + frac.mean(axis=1, keepdims=True)
    # d(rate) per draw, and d(rate)/d(tau) with delta held: tau's error by the delta method
    per_draw = -(w * (frac - frac.mean(axis=1, keepdims=True)) / cycles**2).sum(axis=0)
    slope = (w * mu / tau**2 / cycles**2).sum(axis=0)[0]
    stderr = per_draw.std(axis=0, ddof=1) / math.sqrt(jobs.shape[1]) / slope
    return tau, stderr


def k_batch_sync_mean_field(
    jobs: NDArray[np.float64], workers: int, ks: ArrayLike, groups: int = GROUPS
) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.bool_]]:
    """t* with m(t*) = K/N from ``jobs[s, j]``, job j of independent sequence s; returns t*,
    its standard error (spread of ``groups`` batches of sequences) and, per K, whether the
    sequences were long enough: at most 1e-3 K/N of them may end before t*."""
    k = np.asarray(ks, dtype=np.int64)
    sequences = jobs.shape[0] // groups * groups
    if sequences < groups or np.any(k < 1) or np.any(k > workers):
        raise UsageError(f"need {groups}+ job sequences and 1 <= K <= N={workers}")
    sums = np.cumsum(jobs[:sequences], axis=1)
    share = k / workers
    value = _pooled_quantile(sums, share)
    parts = np.stack([_pooled_quantile(part, share) for part in np.split(sums, groups)])
    stderr = parts.std(axis=0, ddof=1) / math.sqrt(groups)
    ended = (sums[:, -1, None] <= value).mean(axis=0)
    return value, stderr, ended <= 1e-3 * share


def _pooled_quantile(sums: NDArray[np.float64], share: NDArray[np.float64]) -> NDArray[np.float64]:
    """The ceil(S share)-th smallest pooled partial sum of S sequences: m-hat(t) >= share."""
    pooled = sums.ravel()
    rank = np.clip(np.ceil(sums.shape[0] * share).astype(np.int64), 1, pooled.size) - 1
    unique = np.unique(rank)
    ordered = np.partition(pooled, unique)
    return ordered[rank]
