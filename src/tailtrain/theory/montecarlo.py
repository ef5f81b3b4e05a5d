"""Monte Carlo iteration times of the K-family where Table II gives only a bound.

Pure functions of arrays of job times (one job = one mini-batch gradient of one worker), so a
caller chooses the distribution, the worker pattern and the seed. They follow the variants'
definitions in slow-and-stale Sec. II-B:

* K-sync: the K-th of P fresh jobs; the rest are cancelled.
* K-batch-sync: every worker computes jobs back to back at the same parameters; the update
  comes with the K-th finished job overall and cancels everything in flight.
* K-async: the K first finishers wait for the update, then restart; the others keep going
  (nothing is cancelled), so each iteration restarts exactly K workers. For K near N,
  :func:`k_async_tail_iteration_time` follows only the N - K busy workers.
* K-batch-async: every worker computes back to back; every K finished jobs are an update. Its
  long-run E[T] is K / sum_n 1/E[X_n] by the elementary renewal theorem (Lemma 5's proof).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from numpy.typing import ArrayLike, NDArray

from tailtrain.errors import UsageError


def k_sync_iteration_times(
    jobs: NDArray[np.float64], ks: ArrayLike
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Mean and standard error of the K-th smallest job in each row of ``jobs`` (I, P)."""
    k = np.asarray(ks, dtype=np.int64)
    ordered = np.sort(jobs, axis=1)[:, k - 1]
    return ordered.mean(axis=0), ordered.std(axis=0, ddof=1) / np.sqrt(jobs.shape[0])


def k_batch_sync_iteration_times(
    jobs: NDArray[np.float64], ks: ArrayLike
) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.bool_]]:
    """K-batch-sync E[T] from ``jobs[i, n, c]``, worker n's c-th job in iteration i.

    Returns mean, standard error and, per K, whether C jobs per worker were enough: the K-th
    arrival must come no later than every worker's C-th, else an unsampled job could precede it.
    """
    k = np.asarray(ks, dtype=np.int64)
    arrivals = np.cumsum(jobs, axis=2)
    iterations = arrivals.reshape(arrivals.shape[0], -1)
    if k.max() > iterations.shape[1]:
        raise UsageError(f"K={k.max()} exceeds the {iterations.shape[1]} sampled jobs")
    kth = np.sort(iterations, axis=1)[:, k - 1]
    enough = (kth <= arrivals[:, :, -1].min(axis=1, keepdims=True)).all(axis=0)
    return kth.mean(axis=0), kth.std(axis=0, ddof=1) / np.sqrt(kth.shape[0]), enough


#: ``draw(workers, jobs)``: times of job number ``jobs[s, i]`` of worker ``workers[s, i]``
JobDraw = Callable[[NDArray[np.int64], NDArray[np.int64]], NDArray[np.float64]]


def k_async_iteration_time(
    first: NDArray[np.float64], draw: JobDraw, k: int, iterations: int, warmup: int
) -> tuple[float, float]:
    """Long-run K-async E[T] over S parallel chains; ``first[s, n]`` is worker n's first job.

    Each iteration ends at the K-th earliest finish; those K workers restart with their next
    job from ``draw``. Iteration times after ``warmup`` are averaged per chain, and the
    standard error comes from the spread of the S chain means.
    """
    chains, workers = first.shape
    if not 1 <= k <= workers or not 0 <= warmup < iterations or chains < 2:
        raise UsageError(
            f"need 1 <= K <= P, warmup < iterations and 2+ chains; got K={k}, "
            f"P={workers}, warmup={warmup}, iterations={iterations}, chains={chains}"
        )
    rows = np.arange(chains)[:, None]
    finish, used = first.astype(float), np.ones((chains, workers), dtype=np.int64)
    now, times = np.zeros(chains), np.empty((chains, iterations))
    for j in range(iterations):  # iterations are sequential; each step is vectorised
        done = np.argpartition(finish, k - 1, axis=1)[:, :k]
        end = finish[rows, done].max(axis=1)
        times[:, j], now = end - now, end
        finish[rows, done] = end[:, None] + draw(done, used[rows, done])
        used[rows, done] += 1
    means = times[:, warmup:].mean(axis=1)
    return float(means.mean()), float(means.std(ddof=1) / np.sqrt(chains))


def k_async_tail_iteration_time(
    quantile: Callable[[NDArray[np.float64]], NDArray[np.float64]],
    workers: int,
    k: int,
    rng: np.random.Generator,
    *,
    chains: int = 16,
    iterations: int = 2000,
    warmup: int = 200,
) -> tuple[float, float]:
    """Long-run K-async E[T] for K close to N, in O(N - K) per iteration (exact chain).

    After each update N - K workers are still busy; with their residual times R the next
    update is the (N-K+1)-th largest of R and the K fresh jobs, so only the top N - K + 1 of
    the fresh jobs matter. Those are drawn directly: the top order statistics of K uniforms
    by the Renyi representation, U_(K-j) = U_(K-j+1) V_j^(1/(K-j)), through ``quantile``.
    Chains start with every worker fresh; ``warmup`` iterations are dropped.
    """
    busy = workers - k
    if not 1 <= k <= workers or not 0 <= warmup < iterations or chains < 2:
        raise UsageError(f"need 1 <= K <= N, warmup < iterations and 2+ chains; got K={k}")
    exponents = 1.0 / (k - np.arange(busy + 1))
    log_u = np.cumsum(np.log(rng.random((iterations, chains, busy + 1))) * exponents, axis=2)
    fresh = quantile(np.exp(log_u))  # descending along the last axis
    residual, times = np.zeros((chains, busy)), np.empty((chains, iterations))
    for j in range(iterations):  # iterations are sequential; each step is vectorised
        top = -np.sort(-np.concatenate([residual, fresh[j]], axis=1), axis=1)
        times[:, j] = top[:, busy]
        residual = top[:, :busy] - top[:, busy, None]
    means = times[:, warmup:].mean(axis=1)
    return float(means.mean()), float(means.std(ddof=1) / np.sqrt(chains))


def equilibrium_residuals(
    pool: NDArray[np.float64], count: int, rng: np.random.Generator
) -> NDArray[np.float64]:
    """``count`` draws of a renewal process's residual time in equilibrium, per column.

    The job in progress at a random time is length-biased (density x f(x) / E[X]) and a uniform
    fraction of it remains, so residual = U * (a length-biased resample of ``pool[:, n]``).
    Starting K-async chains here instead of with every worker fresh avoids the long transient
    of synchronised waves when job times vary little (e.g. sums of many micro-batches).
    """
    size, columns = pool.shape
    cumulative = np.cumsum(pool, axis=0) / pool.sum(axis=0)
    # one sorted search for all columns: column c's cumulative weights lie in [c, c + 1]
    offsets = np.arange(columns)
    flat = (cumulative + offsets).T.ravel()
    found = np.searchsorted(flat, rng.random((count, columns)) + offsets, side="left")
    picks = np.minimum(found - offsets * size, size - 1)
    return rng.random((count, columns)) * pool[picks, offsets]


def table_draw(jobs: NDArray[np.float64]) -> JobDraw:
    """A :data:`JobDraw` reading ``jobs[s, j, n]``, job j of worker n in chain s (J must
    exceed the iterations simulated: each iteration restarts a worker at most once)."""
    rows = np.arange(jobs.shape[0])[:, None]
    return lambda workers, index: jobs[rows, index, workers]


def k_batch_async_iteration_time(jobs: NDArray[np.float64], k: int) -> tuple[float, float]:
    """Long-run K-batch-async E[T] = K / sum_n 1/E[X_n] from ``jobs[j, n]`` (Lemma 5 with
    per-worker means). 1/mean is biased up by var/(J mean^3) for J jobs; that second-order
    term is subtracted. The standard error is by the delta method."""
    count = jobs.shape[0]
    means, variances = jobs.mean(axis=0), jobs.var(axis=0, ddof=1)
    rate = float(np.sum((1.0 - variances / (count * means**2)) / means))
    rate_var = float(np.sum(variances / (count * means**4)))
    return k / rate, k * np.sqrt(rate_var) / rate**2
