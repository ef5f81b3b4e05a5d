"""``predict`` at large N: the K-family rows that would cost O(N^2) to simulate.

Above ``context.LARGE_N`` workers with i.i.d. jobs (``predict`` keeps its Monte Carlo below):

* K-sync: E[X_{K:N}] is exact or quadrature per K, but every K of 10^6 is too many; without
  ``--k`` it is evaluated on :func:`search_grid` (the listed K, 512 log-spaced and 512 evenly
  spaced K) and refined between the neighbours of the best K (:func:`search`). That finds
  the best K whenever K / E[X_{K:N}] is unimodal near its maximum.
* K-async: K = N is sync (every worker restarts); K > N - ``MIN_GAP`` is the exact chain of
  ``montecarlo.k_async_tail_iteration_time`` when the job law has a quantile function (else
  the Monte Carlo of ``predict`` with fewer chains); every other K is the mean-field limit of
  ``theory.meanfield`` (E[ceil(J/tau)] = N/K).
* K-batch-sync: when a worker can hardly finish two jobs before the K-th first job,
  P <= K(K-1)/(N+1), it is K-sync's E[X_{K:N}] (Lemma 2's regime); otherwise the mean-field
  limit m(t) = K/N of ``theory.meanfield``.

Both K-async and K-batch-sync are evaluated (and searched) on the listed K, as K-async's
Monte Carlo already is.

Under a ``heterogeneous`` pattern (``_Context.speeds``: worker n keeps its speed s_n ~ U(low,
high) for the whole run) the same methods apply with each worker's speed kept: K-sync and
sync on the i.i.d. per-iteration law (``theory.scale_mixture``); K-batch-sync's renewal
function is the average of the workers' own (each job sequence at one speed); K-async's
fluid balance weighs the speeds (``theory.meanfield.k_async_mean_field_mixed``), and its
K in (N - MIN_GAP, N) have no method here (left out, with a note); async and K-batch-async
are the renewal rates of :func:`async_renewal`.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from numpy.typing import NDArray

from tailtrain.delays.sum import SumDelay
from tailtrain.prediction.context import _Context
from tailtrain.theory.meanfield import (
    MIN_GAP,
    k_async_mean_field,
    k_async_mean_field_mixed,
    k_batch_sync_mean_field,
)
from tailtrain.theory.montecarlo import k_async_tail_iteration_time

SEARCH_POINTS = 512  #: log-spaced and evenly spaced K of the K-sync search grid, each
REFINE_POINTS = 64  #: K per refinement between the neighbours of the best K so far
JOB_SAMPLE = 2**16  #: jobs sampled for K-async's mean-field delta(tau)
SEQUENCES = 2**17  #: job sequences sampled for K-batch-sync's renewal function
TAIL_CHAINS, TAIL_ITERATIONS = 16, 2000  #: K-async's chain near K = N (200 warm up)
SPEED_NODES = 12  #: classes of speed for K-async's fluid limit under heterogeneous speeds
MIXED_JOB_SAMPLE = 2**14  #: job draws per class there (every class on the same draws)
SAME_AS_K_SYNC = 1e-3  #: K-batch-sync is K-sync's value while K(K-1)/(N+1) is below this

#: per K: (E[T], standard error, method)
Estimates = list[tuple[int, float, float, str]]


def search_grid(workers: int, listed: NDArray[np.int64]) -> NDArray[np.int64]:
    """K-sync's search grid: the listed K, N, and log- and evenly spaced K (sorted, unique)."""
    spaced = np.concatenate(
        [np.geomspace(1, workers, SEARCH_POINTS), np.linspace(1, workers, SEARCH_POINTS)]
    )
    ks = np.concatenate([listed, [workers], np.round(spaced).astype(np.int64)])
    return np.unique(ks.clip(1, workers))


def search(
    evaluate: Callable[[NDArray[np.int64]], tuple[NDArray, NDArray, str]],
    workers: int,
    listed: NDArray[np.int64],
) -> tuple[NDArray[np.int64], NDArray[np.float64], NDArray[np.float64], str]:
    """K-sync on :func:`search_grid`, then on up to :data:`REFINE_POINTS` K between the
    neighbours of the best K so far, until every K between them is evaluated; the best K
    maximises K / E[T] (the effective speedup over a fixed sync). ``evaluate(ks)`` returns
    E[T], standard errors and the method; the evaluated K come back sorted."""
    ks = search_grid(workers, listed)
    mean, stderr, method = evaluate(ks)
    while True:
        best = int(np.argmax(ks / mean))
        low, high = ks[max(best - 1, 0)], ks[min(best + 1, ks.size - 1)]
        between = np.unique(np.round(np.linspace(low, high, REFINE_POINTS)).astype(np.int64))
        between = between[~np.isin(between, ks)]
        if not between.size:
            return ks, mean, stderr, method
        more_mean, more_stderr, _ = evaluate(between)
        order = np.argsort(np.concatenate([ks, between]))
        ks = np.concatenate([ks, between])[order]
        mean = np.concatenate([mean, more_mean])[order]
        stderr = np.concatenate([stderr, more_stderr])[order]


def k_async_estimates(ctx: _Context, ks: list[int], sync: tuple[float, float, str]) -> Estimates:
    """K-async at each K in ``ks`` (2 <= K <= N) by the methods of the module docstring.
    Under heterogeneous speeds the fluid K use :func:`_mixed_mean_field`, and the K in
    (N - MIN_GAP, N) are left out (their chain assumes i.i.d. workers): the caller notes it."""
    n = ctx.scenario.workers
    quantile = _trip_quantile(ctx)
    out: Estimates = []
    fluid = [k for k in ks if k <= n - MIN_GAP]
    if fluid and ctx.speeds is not None:
        out += _mixed_mean_field(ctx, fluid)
    elif fluid:
        jobs = ctx.iid_jobs(ctx.rng(6), (JOB_SAMPLE,))
        mean = ctx.m * ctx.exact_delay.mean + ctx.scenario.comm_mean
        tau, stderr = k_async_mean_field(jobs, mean, n, fluid)
        method = f"mean-field(n={JOB_SAMPLE}, seed={ctx.scenario.seed})"
        out += [(k, float(t), float(e), method) for k, t, e in zip(fluid, tau, stderr, strict=True)]
    for k in (k for k in ks if k > n - MIN_GAP):
        if k == n:
            out.append((k, *sync))
        elif ctx.speeds is not None:
            continue
        elif quantile is not None:
            mean, stderr = k_async_tail_iteration_time(
                quantile, n, k, ctx.rng(3, k), chains=TAIL_CHAINS, iterations=TAIL_ITERATIONS
            )
            out.append((k, mean, stderr, ctx.method(TAIL_CHAINS * (TAIL_ITERATIONS - 200))))
        else:
            out.append((k, math.nan, math.nan, ""))  # the caller's Monte Carlo
    return sorted(out)


def _mixed_mean_field(ctx: _Context, ks: list[int]) -> Estimates:
    """K-async's fluid limit with each worker at its own speed s ~ U(low, high): the speeds'
    law on :data:`SPEED_NODES` Gauss-Legendre classes, every class on the same job sample
    (common random numbers), T^c drawn per job (``theory.meanfield.k_async_mean_field_mixed``)."""
    s, m = ctx.scenario, ctx.m
    rng = ctx.rng(6)
    compute = ctx.sampled_delay.sample(rng, (MIXED_JOB_SAMPLE, m)).sum(axis=1)
    comm = ctx.comm_times(rng, (MIXED_JOB_SAMPLE,))
    x, w = np.polynomial.legendre.leggauss(SPEED_NODES)
    low, high = ctx.speeds
    speed = low + (high - low) * (x + 1) / 2
    jobs = speed[:, None] * compute + comm
    means = speed * m * ctx.exact_delay.mean + s.comm_mean
    tau, stderr = k_async_mean_field_mixed(jobs, means, w / 2, s.workers, ks)
    method = f"mean-field(speeds={SPEED_NODES}, n={MIXED_JOB_SAMPLE}, seed={s.seed})"
    return [(k, float(t), float(e), method) for k, t, e in zip(ks, tau, stderr, strict=True)]


def async_renewal(ctx: _Context) -> float:
    """E[T] of async (one update per job) with each worker at its own speed, N -> infinity:
    worker n's jobs come at rate 1 / (s_n M mu + E[T^c]) (renewal reward, Lemma 5's
    argument), so updates come every 1 / (N E_s[1 / (s a + c)]) seconds, with a = M mu,
    c = E[T^c] and E_s[1 / (s a + c)] = ln((a high + c) / (a low + c)) / (a (high - low)).
    K-batch-async waits for K jobs: K times this."""
    low, high = ctx.speeds
    a, c = ctx.m * ctx.exact_delay.mean, ctx.scenario.comm_mean
    if a == 0 or high == low:  # one job law: Lemma 5 itself
        return (a * low + c) / ctx.scenario.workers
    rate = math.log((a * high + c) / (a * low + c)) / (a * (high - low))
    return 1.0 / (ctx.scenario.workers * rate)


def k_batch_sync_estimates(
    ctx: _Context, ks: NDArray[np.int64], k_sync: tuple[NDArray, NDArray, NDArray, str]
) -> tuple[Estimates, list[str]]:
    """K-batch-sync at each K in ``ks`` by the methods of the module docstring, and notes."""
    n = ctx.scenario.workers
    sync_ks, sync_mean, sync_stderr, sync_method = k_sync
    chance = ks * (ks - 1) / (n + 1)
    same = chance <= SAME_AS_K_SYNC
    out: Estimates = []
    for k, p in zip(ks[same], chance[same], strict=True):
        i = int(np.searchsorted(sync_ks, k))
        method = f"k-sync's {sync_method} (2 jobs first: p <= {p:.0e})"
        out.append((int(k), float(sync_mean[i]), float(sync_stderr[i]), method))
    notes = []
    bulk = ks[~same]
    if bulk.size:
        cap = 2 + math.ceil(bulk.max() / n)
        while True:
            jobs = ctx.worker_jobs(ctx.rng(2, cap), (SEQUENCES, cap))
            mean, stderr, enough = k_batch_sync_mean_field(jobs, n, bulk)
            if enough.all() or cap >= 64:
                break
            cap *= 2
        if not enough.all():
            short = ", ".join(str(k) for k in bulk[~enough])
            notes.append(f"k-batch-sync K={short}: sequences of {cap} jobs were too short")
        method = f"mean-field(n={SEQUENCES}x{cap}, seed={ctx.scenario.seed})"
        out += [
            (int(k), float(t), float(e), method) for k, t, e in zip(bulk, mean, stderr, strict=True)
        ]
    return sorted(out), notes


def _trip_quantile(ctx: _Context) -> Callable[[NDArray[np.float64]], NDArray[np.float64]] | None:
    """Quantile function of a round trip (job plus T^c), when the job law is known."""
    law, comm = ctx.job_law, ctx.sampled_comm
    if law is None:
        return None
    if comm is None or comm.var == 0:
        shift = ctx.scenario.comm_mean
        return lambda u: law.quantile(u) + shift
    if not comm.exact:
        return None
    return SumDelay(f"({law.spec}) + ({comm.spec})", [law, comm]).quantile
