"""Predicted iteration time and throughput of every strategy in one scenario.

For each strategy (``sync``, the K-family of slow-and-stale, ``async`` and DropCompute) this
gives E[T], the speedup over sync E[T_sync]/E[T] and the effective speedup (samples per second
relative to sync), with the method behind each number. Closed forms are used where they are
exact; where the papers only bound or approximate (K-batch-sync, K-async, Bailey's E[T] for
DropCompute), the number comes from numerical integration or a seeded Monte Carlo instead.

Model of an iteration. A job is one worker's gradient: one draw of the delay, or the sum of its
M micro-batch draws. The communication time T^c has one meaning per topology, as in the
simulator. Parameter-server families (sync, K-sync, K-batch-sync, K-async, K-batch-async,
async) pay it per round trip: every job pulls the model, computes and pushes its gradient, so
it takes X + C with C a fresh draw of T^c, and e.g. sync E[T] = E[max_n (X_n + C_n)].
DropCompute's allreduce pays it once per update, after the compute (DropCompute Sec. 4.3):
E[T] = E[max_n T~_n] + E[T^c]. Under a worker pattern other than iid, every number is
simulated in independent runs (each with its own draw of the pattern's per-run state) and its
standard error comes from the spread of the run means; job j of worker n is row j of the
pattern's sampled block, as in the simulator. A trace replayed per worker
(``trace:path=FILE``) is not i.i.d. across workers either, so it is simulated the same way;
its runs replay consecutive segments of the trace, together covering all of it when the
sample budget allows, and the output notes how the workers map onto the trace's. The one
exception: above ``LARGE_N`` workers under ``heterogeneous`` speeds, the rows come from the
speeds' law instead of N workers' draws (``prediction.context``, ``prediction.large``), and
each row's method says so.

Best setting. Rows are compared by the effective speedup, the rate at which mini-batch
gradients (or samples) are applied relative to sync: K E[T_sync] / (N E[T_K]) for the K-family
and S_eff of DropCompute Eq. (6). Why: with the learning rate scaled with the batch (eta = K
eta_0) the bound of Lemma 7 after wall-clock time t depends on K only through t K / E[T], so the
error-runtime trade-off is ordered by this rate; for K-async and K-batch-async Theorem 3 adds a
factor gamma' whose staleness gamma shrinks as K grows. So within a strategy the best K is the
largest K whose effective speedup is within two standard errors (or 1e-9) of the highest.
K-async, when simulated, is evaluated (and searched) on :func:`k_grid` for N > 32; every other
K-family variant on every K. DropCompute's tau* maximises S_eff (Eq. 6; Algorithm 2 on Monte
Carlo samples), searched above M mu / 2 (Assumption C.3).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from tailtrain.delays import DelayModel
from tailtrain.delays.sum import SumDelay
from tailtrain.errors import UsageError
from tailtrain.prediction.context import LARGE_N, _Context
from tailtrain.prediction.large import (
    async_renewal,
    k_async_estimates,
    k_batch_sync_estimates,
    search,
)
from tailtrain.prediction.rebalance import (
    DEMAND_SPEC,
    demand_mean_field,
    demand_times,
    rebalance_quadrature,
    rebalance_times,
)
from tailtrain.prediction.scenario import (
    ALL_K_UP_TO,
    DelayScenario,
    Prediction,
    Row,
    k_grid,
)
from tailtrain.theory.dropcompute import (
    analytic_threshold,
    bailey_iteration_time,
    empirical_threshold,
    evaluate_threshold,
    exact_speedup,
    exact_threshold,
)
from tailtrain.theory.estimate import EXACT, NUMERICAL
from tailtrain.theory.families import exponential_params
from tailtrain.theory.montecarlo import (
    equilibrium_residuals,
    k_async_iteration_time,
    k_batch_async_iteration_time,
    k_batch_sync_iteration_times,
    k_sync_iteration_times,
    table_draw,
)
from tailtrain.theory.order_stats import OrderStats, expected_order_stats
from tailtrain.theory.sums import sum_method

RENEWAL = "renewal(N->inf, per-worker speeds)"  #: method of async_renewal's rows
_CHAINS = 16  # independent K-async chains (their spread gives the standard error)
_JOB_BUDGET = 100_000  # jobs per K-async / K-batch-sync estimate, bounds time and memory


def predict(scenario: DelayScenario) -> Prediction:
    """Every strategy's row for ``scenario`` (see the module docstring for the model).

    Every K is evaluated (as arrays) and searched for the best, but only the listed K
    (``DelayScenario.ks``, else :func:`k_grid`) and each family's best K become rows: 4 N row
    objects would dominate the run time at N = 10^6.
    """
    ctx = _Context.build(scenario)
    sync_like = _sync_rows(ctx)
    rows = [
        *sync_like,
        *_k_batch_sync_rows(ctx),
        *_k_async_rows(ctx),
        *_k_batch_async_rows(ctx),
        _dropcompute_row(ctx),
        _rebalance_row(ctx),
        *_demand_rows(ctx),
    ]
    sync_time = ctx.sync_time
    finished = [_relative(r, sync_time, ctx.scenario.workers) for r in rows]
    if scenario.micro_batches is not None:
        ctx.notes.append(_paper_note(ctx, sync_time))
    return Prediction(scenario, tuple(_mark_best(finished)), notes=tuple(ctx.notes))


def _paper_note(ctx: _Context, sync_time: float) -> str:
    """DropCompute's closed forms for comparison; they assume normal sums (App. C.2)."""
    s, delay = ctx.scenario, ctx.exact_delay
    mu, sigma = delay.mean, math.sqrt(delay.var)
    if not math.isfinite(sigma):  # e.g. Pareto with shape <= 2: no normal approximation
        return "DropCompute's closed forms (normal sums, App. C.2) need a finite variance"
    bailey = bailey_iteration_time(mu, sigma, s.workers, ctx.m, s.comm_mean)
    tau, speedup = analytic_threshold(mu, sigma, s.workers, ctx.m, s.comm_mean)
    return (
        f"for comparison, DropCompute's closed forms (Bailey Eq. 7, Eq. 11, normal sums): "
        f"E[T_sync] ~ {bailey:.4g} s (above: {sync_time:.4g} s), tau* ~ {tau:.4g} s, "
        f"S_eff ~ {speedup:.4g}"
    )


# ---------------------------------------------------------------- strategies


def _sync_rows(ctx: _Context) -> list[Row]:
    """K-sync E[T] = E[(X + C)_{K:N}] (Lemma 1 on round trips). ``sync`` is one allreduce a
    step, as every engine runs it, so it pays T^c once: E[max_n X_n] + E[T^c]
    (:func:`_allreduce_sync_stats`), which is K-sync's K = N when T^c is constant.
    Above ``LARGE_N`` workers without ``--k``, K is searched on a grid and refined
    (``prediction.large``)."""
    n = ctx.scenario.workers
    if ctx.scenario.ks is None and n > LARGE_N:
        ks, mean, stderr, method = search(lambda ks: _k_sync_stats(ctx, ks), n, ctx.listed)
    else:
        ks = np.asarray(sorted(set(ctx.ks) | {n}))
        mean, stderr, method = _k_sync_stats(ctx, ks)
    ctx.k_sync = (ks, mean, stderr, method)
    sync_stats = (mean[-1], stderr[-1], method)
    if ctx.sampled_comm is not None and ctx.sampled_comm.var > 0:
        sync_stats = _allreduce_sync_stats(ctx)
    ctx.sync_time = float(sync_stats[0])
    sync = _row("sync", n, *sync_stats)
    chosen = np.isin(ks, ctx.ks) if len(ctx.ks) < n else np.ones(len(ks), dtype=bool)
    rows = _family_rows(ctx, "k-sync", ks[chosen], mean[chosen], stderr[chosen], method)
    return [sync, *rows]


def _allreduce_sync_stats(ctx: _Context) -> tuple[float, float, str]:
    """sync's E[T] as one allreduce a step: E[max_n X_n] + E[T^c], T^c paid once after the
    slowest compute (DropCompute Sec. 4.3), from the job's law or the shared sample."""
    n, law = ctx.scenario.workers, ctx.job_law
    if law is not None:
        stats = expected_order_stats(law, n, [n])
        mean = float(stats.mean[0]) + ctx.scenario.comm_mean
        return mean, float(stats.stderr[0]), _law_method(ctx, stats.method)
    sample = ctx.sync_sample()
    runs = [t.sum(axis=2).max(axis=1) + comm for t, comm in sample]
    mean, stderr = _pooled([(x.mean(), x.std(ddof=1) / np.sqrt(x.size)) for x in runs])
    return float(mean), float(stderr), ctx.method(sum(x.size for x in runs))


def _k_sync_stats(
    ctx: _Context, ks: NDArray[np.int64]
) -> tuple[NDArray[np.float64], NDArray[np.float64], str]:
    """E[(X + C)_{K:N}] for each K in ``ks``: from the round trip's law, else Monte Carlo."""
    stats = _round_trip_order_stats(ctx, ks)
    if stats is not None:
        return stats.mean, stats.stderr, _law_method(ctx, stats.method)
    sample, rng = ctx.sync_sample(), ctx.rng(5)
    trips = [t.sum(axis=2) + ctx.comm_times(rng, t.shape[:2]) for t, _ in sample]
    mean, stderr = _pooled([k_sync_iteration_times(jobs, ks) for jobs in trips])
    return mean, stderr, ctx.method(sum(t.shape[0] for t, _ in sample))


def _round_trip_order_stats(ctx: _Context, ks: ArrayLike) -> OrderStats | None:
    """E[(X + C)_{K:N}] from the law of a round trip, job X plus T^c draw C, when it is known:
    a constant T^c shifts every order statistic; a random one is convolved with the job."""
    law, comm = ctx.job_law, ctx.sampled_comm
    if law is None:
        return None
    if comm is None or comm.var == 0:
        stats = expected_order_stats(law, ctx.scenario.workers, ks)
        return replace(stats, mean=stats.mean + ctx.scenario.comm_mean)
    if not comm.exact:
        return None
    trip = SumDelay(f"({law.spec}) + ({comm.spec})", [law, comm])
    return expected_order_stats(trip, ctx.scenario.workers, ks)


def _k_batch_sync_rows(ctx: _Context) -> list[Row]:
    """Exact K/(N mu) for Exp(mu) jobs without T^c (Eq. 10), else Monte Carlo of the variant
    on round trips (job + T^c)."""
    n, ks = ctx.scenario.workers, ctx.ks
    rate = _exponential_rate(ctx.job_law)
    if rate is not None and ctx.scenario.comm_mean == 0:
        k = np.asarray(ks, dtype=float)
        return _family_rows(ctx, "k-batch-sync", ks, k / (n * rate), np.zeros(k.size), EXACT)
    if (ctx.scenario.iid or ctx.speeds) and n > LARGE_N:
        grid = np.asarray(ctx.scenario.ks or ctx.listed, dtype=np.int64)
        found, notes = k_batch_sync_estimates(ctx, grid, ctx.k_sync)
        ctx.notes.extend(notes)
        return _mark_family(ctx, [_row("k-batch-sync", *estimate) for estimate in found])
    cap = 2 + math.ceil(max(ks) / n)
    while True:
        iterations = max(100, min(ctx.scenario.samples, _JOB_BUDGET // (n * cap)))
        estimates = []
        for jobs in _jobs(ctx, ctx.rng(2, cap), iterations * cap, per_job_comm=True):
            # consecutive rows are one worker's successive jobs within an iteration
            jobs = jobs[: jobs.shape[0] // cap * cap].reshape(-1, cap, n).transpose(0, 2, 1)
            estimates.append(k_batch_sync_iteration_times(jobs, ks))
        mean, stderr = _pooled([(mu, se) for mu, se, _ in estimates])
        enough = np.logical_and.reduce([ok for _, _, ok in estimates])
        if enough.all() or cap >= 64 * (1 + max(ks) // n):
            break
        cap *= 2
    if not enough.all():
        short = ", ".join(str(k) for k in np.asarray(ks)[~enough])
        ctx.notes.append(f"k-batch-sync K={short}: workers ran out of sampled jobs; E[T] high")
    return _family_rows(ctx, "k-batch-sync", ks, mean, stderr, ctx.method(iterations))


def _k_async_rows(ctx: _Context) -> list[Row]:
    """Exact E[X_{K:N}] for Exp jobs without T^c (Theorem 2's proof) and, for i.i.d. jobs,
    K = 1, which is async (E[X]/N, Lemma 5); otherwise Monte Carlo of the variant."""
    n, s = ctx.scenario.workers, ctx.scenario
    rate = _exponential_rate(ctx.job_law)
    if rate is not None and s.comm_mean == 0:
        stats = expected_order_stats(ctx.job_law, n, ctx.ks)
        return _family_rows(ctx, "k-async", stats.k, stats.mean, stats.stderr, EXACT)
    grid = ctx.ks if s.ks or n <= ALL_K_UP_TO else k_grid(n)
    if (s.iid or ctx.speeds) and n > LARGE_N:
        sync = (ctx.sync_time, float(ctx.k_sync[2][-1]), ctx.k_sync[3])
        wanted = [k for k in grid if k > 1]
        found = k_async_estimates(ctx, wanted, sync)
        rows = [
            _row("k-async", *estimate) if estimate[3] else _k_async_row(ctx, estimate[0])
            for estimate in found
        ]
        if missing := sorted(set(wanted) - {r.k for r in rows}):
            ctx.notes.append(
                f"k-async K={', '.join(map(str, missing))}: no large-N method with per-worker "
                f"speeds near K = N; simulate it"
            )
        if ctx.speeds and 1 in grid:
            rows.insert(0, _row("k-async", 1, async_renewal(ctx), 0.0, RENEWAL))
    else:
        rows = [_k_async_row(ctx, k) for k in grid if k > 1 or not s.iid]
    if s.iid and 1 in grid:
        job = ctx.m * ctx.exact_delay.mean + s.comm_mean
        rows.insert(0, _row("k-async", 1, job / n, 0.0, EXACT))
    return _mark_family(ctx, rows) if rows else []  # e.g. --k N-1 alone, left out above


def _k_async_row(ctx: _Context, k: int) -> Row:
    """Chains start in renewal equilibrium (see ``equilibrium_residuals``) and warm up for
    about N/K iterations, so every worker restarts about once before measuring."""
    n, samples = ctx.scenario.workers, ctx.scenario.samples
    chains = int(np.clip(2**21 // n, 2, _CHAINS))  # the job budget per iteration at large N
    warmup = math.ceil(n / k) + 10
    measured = int(np.clip(_JOB_BUDGET // (chains * k) - warmup, 16, 4 * samples // chains))
    iterations = warmup + measured
    rng = ctx.rng(3, k)
    if ctx.scenario.iid:
        pool = ctx.iid_jobs(rng, (max(4096, chains * n), 1))
        first = equilibrium_residuals(pool, chains * n, rng).reshape(chains, n)
        draw = lambda workers, index: ctx.iid_jobs(rng, workers.shape)  # noqa: E731
    else:  # one independent run per chain; its first jobs start from its own equilibrium
        runs = [
            ctx.run(child, iterations + 1, part).sum(axis=2)
            + ctx.comm_times(child, (iterations + 1, n))
            for part, child in enumerate(rng.spawn(chains))
        ]
        first = np.concatenate([equilibrium_residuals(jobs, 1, rng) for jobs in runs])
        draw = table_draw(np.stack(runs))
    mean, stderr = k_async_iteration_time(first, draw, k, iterations, warmup)
    return _row("k-async", k, mean, stderr, ctx.method(chains * measured))


def _k_batch_async_rows(ctx: _Context) -> list[Row]:
    """K (E[X] + E[T^c]) / N for i.i.d. jobs (Lemma 5), its per-worker-speed limit
    (``prediction.large.async_renewal``) above LARGE_N under heterogeneous speeds, else the
    renewal rate of sampled jobs."""
    s = ctx.scenario
    n = s.workers
    if ctx.speeds:
        ks = np.asarray(ctx.ks, dtype=np.int64)
        each = async_renewal(ctx)
        rows = _family_rows(ctx, "k-batch-async", ks, ks * each, np.zeros(ks.size), RENEWAL)
        return [*rows, _row("async", 1, each, 0.0, RENEWAL)]
    if s.iid:
        job = ctx.m * ctx.exact_delay.mean + s.comm_mean
        ks = np.asarray(ctx.ks, dtype=np.int64)
        rows = _family_rows(ctx, "k-batch-async", ks, ks * job / n, np.zeros(ks.size), EXACT)
        return [*rows, _row("async", 1, job / n, 0.0, EXACT)]
    runs = _jobs(ctx, ctx.rng(4), 4 * s.samples, per_job_comm=True)
    ks = [*ctx.ks, 1]
    per_run = [np.transpose([k_batch_async_iteration_time(jobs, k) for k in ks]) for jobs in runs]
    mean, stderr = _pooled([(mu, se) for mu, se in per_run])
    method = ctx.method(sum(jobs.shape[0] for jobs in runs))
    rows = _family_rows(ctx, "k-batch-async", ks[:-1], mean[:-1], stderr[:-1], method)
    return [*rows, _row("async", 1, mean[-1], stderr[-1], method)]


def _dropcompute_row(ctx: _Context) -> Row:
    """tau* (or the scenario's asked tau) and S_eff: exact laws of the partial sums when
    known, else Algorithm 2 on one sample and S_eff(tau*) measured on an independent one."""
    s = ctx.scenario
    sums = ctx.partial_sums
    if sums is not None:
        if s.threshold is None:
            choice = exact_threshold(sums, s.workers, s.comm_mean)
        else:
            choice = exact_speedup(sums, s.workers, s.threshold, s.comm_mean)
        return _row(
            "dropcompute",
            s.workers,
            choice.iteration_time,
            0.0,
            _law_method(ctx, NUMERICAL),
            threshold=choice.threshold,
            drop_rate=choice.drop_rate,
            effective=(choice.effective_speedup, 0.0),
        )
    rng = ctx.rng(1)
    # tau* comes from a smooth average curve: a quarter of the samples pins it down
    t = np.concatenate(ctx.blocks(rng, ctx.iterations_for(max(100, s.samples // 4))))
    tau = s.threshold
    if tau is None:
        tau = empirical_threshold(t, ctx.comm_times(rng, (t.shape[0],))).threshold
    sample = ctx.sync_sample()
    found = [evaluate_threshold(test, comm, tau) for test, comm in sample]
    time, time_se = _pooled([(f.iteration_time, f.iteration_time_stderr) for f in found])
    speedup, speedup_se = _pooled([(f.effective_speedup, f.stderr) for f in found])
    drop_rate, _ = _pooled([(f.drop_rate, 0.0) for f in found])
    return _row(
        "dropcompute",
        s.workers,
        float(time),
        float(time_se),
        ctx.method(sum(test.shape[0] for test, _ in sample)),
        threshold=tau,
        drop_rate=float(drop_rate),
        effective=(float(speedup), float(speedup_se)),
    )


def _rebalance_row(ctx: _Context) -> Row:
    """Optimal shares (``prediction.rebalance``): i.i.d. workers share equally, so the row is
    the allreduce sync's E[max_n X_n] + E[T^c]; else E[max_n S_n(m_n)] + E[T^c] by Monte
    Carlo on the shared sample (by quadrature over each run's speeds above LARGE_N under
    heterogeneous speeds), with the closed form T* in a note."""
    s = ctx.scenario
    if s.iid:
        return _row("rebalance", s.workers, *_allreduce_sync_stats(ctx))
    if ctx.speeds:
        return _rebalance_quadrature_row(ctx)
    sample = ctx.sync_sample()
    means = ctx.worker_means()
    found = [rebalance_times(t, comm, mu) for (t, comm), mu in zip(sample, means, strict=True)]
    time, time_se = _pooled([(mean, se) for mean, se, _, _ in found])
    closed = float(np.mean([c for _, _, c, _ in found]))
    fewest = min(int(shares.min()) for *_, shares in found)
    ctx.notes.append(
        f"rebalance: shares optimal for each worker's mean micro-batch time (the fewest "
        f"{fewest} of M={ctx.m}); closed form T* + E[T^c] = {closed:.4g} s, exact for constant "
        f"times; E[T] by Monte Carlo"
    )
    steps = sum(t.shape[0] for t, _ in sample)
    return _row("rebalance", s.workers, float(time), float(time_se), ctx.method(steps))


def _rebalance_quadrature_row(ctx: _Context) -> Row:
    """Above LARGE_N under heterogeneous speeds: per run, E[max_n s_n S_n(m_n)] by
    quadrature over the run's speeds (``prediction.rebalance.rebalance_quadrature``)."""
    s, mean = ctx.scenario, float(ctx.sampled_delay.mean)
    total = s.workers * ctx.m
    found = [rebalance_quadrature(mu / mean, mean, ctx.sum_law, total) for mu in ctx.worker_means()]
    time, time_se = _pooled([(value, 0.0) for value, _, _ in found])
    closed = float(np.mean([c for _, c, _ in found])) + s.comm_mean
    fewest = min(int(shares.min()) for *_, shares in found)
    ctx.notes.append(
        f"rebalance: shares optimal for each worker's mean micro-batch time (the fewest "
        f"{fewest} of M={ctx.m}); closed form T* + E[T^c] = {closed:.4g} s, exact for constant "
        f"times; E[T] by quadrature over each run's {s.workers} speeds ({len(found)} runs)"
    )
    method = f"numerical-integration({len(found)} runs of speeds, seed={s.seed})"
    return _row("rebalance", s.workers, time + s.comm_mean, float(time_se), method)


def _demand_rows(ctx: _Context) -> list[Row]:
    """``rebalance:deal=demand`` (``prediction.rebalance``): the (N M)-th completion of fresh
    draws plus E[T^c]; exact for i.i.d. Exp(rate) micro-batches (memoryless: the cut loses
    nothing in law, as K-batch-sync's Eq. 10), else by Monte Carlo on the shared sample, or
    above LARGE_N (i.i.d. workers or heterogeneous speeds) its N -> infinity limit; none,
    with a note, when the sample's draws cannot show a whole step."""
    s = ctx.scenario
    rate = _exponential_rate(ctx.exact_delay) if s.iid else None
    if rate is not None:  # N superposed Poisson processes: the N M-th arrival at rate N rate
        return [
            _row("rebalance", s.workers, ctx.m / rate + s.comm_mean, 0.0, EXACT, spec=DEMAND_SPEC)
        ]
    if ctx.speeds is not None or (s.iid and s.workers > LARGE_N):
        draw = ctx.sampled_delay.sample
        value, stderr, count, length, exact = demand_mean_field(draw, ctx.speeds, ctx.m, ctx.rng(7))
        if not exact:
            ctx.notes.append(
                f"{DEMAND_SPEC}: some of {count} sequences of {length} micro-batches "
                f"ended before t*, so t* is an upper bound"
            )
        method = f"mean-field(n={count}x{length}, seed={s.seed})"
        return [_row("rebalance", s.workers, value + s.comm_mean, stderr, method, spec=DEMAND_SPEC)]
    sample = ctx.sync_sample()
    found = [
        demand_times(t, comm, mu) for (t, comm), mu in zip(sample, ctx.worker_means(), strict=True)
    ]
    if not all(np.isfinite(mean) for mean, *_ in found):
        ctx.notes.append(
            f"{DEMAND_SPEC}: no row, a worker's draws in the sample cannot hold a step"
        )
        return []
    time, time_se = _pooled([(mean, se) for mean, se, _, _ in found])
    closed = float(np.mean([c for _, _, c, _ in found]))
    steps = sum(
        t.shape[0] * ctx.m // units for (t, _), (*_, units) in zip(sample, found, strict=True)
    )
    ctx.notes.append(
        f"{DEMAND_SPEC}: each micro-batch to whichever worker asks next until "
        f"N M={s.workers * ctx.m} are complete; closed form T* + E[T^c] = {closed:.4g} s, "
        f"exact for constant times; E[T] by Monte Carlo of the (N M)-th completion on fresh draws"
    )
    row = _row(
        "rebalance", s.workers, float(time), float(time_se), ctx.method(steps), spec=DEMAND_SPEC
    )
    return [row]


def _law_method(ctx: _Context, method: str) -> str:
    """``method`` naming how the job law was found when it is numerical (a sum of M)."""
    how = sum_method(ctx.job_law)
    return method if how is None else f"{how}+{method}"


# ---------------------------------------------------------------- helpers


def _jobs(
    ctx: _Context, rng: np.random.Generator, count: int, *, per_job_comm: bool = False
) -> list[NDArray[np.float64]]:
    """``count`` rows of N job times in all (job j of every worker in row j), through the
    pattern, as one array per independent run."""
    blocks = [t.sum(axis=2) for t in ctx.blocks(rng, count)]
    if per_job_comm:
        blocks = [jobs + ctx.comm_times(rng, jobs.shape) for jobs in blocks]
    return blocks


def _pooled(
    estimates: Sequence[tuple[Any, Any]],
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """One run: its own (mean, standard error). Several independent runs: the mean of their
    means and the standard error of that mean from their spread (batch means)."""
    means = np.asarray([np.asarray(mu, dtype=float) for mu, _ in estimates])
    if len(estimates) == 1:
        return means[0], np.asarray(estimates[0][1], dtype=float)
    return means.mean(axis=0), means.std(axis=0, ddof=1) / np.sqrt(len(estimates))


def _exponential_rate(law: DelayModel | None) -> float | None:
    params = None if law is None else exponential_params(law)
    return params[1] if params is not None and params[0] == 0.0 else None


def _row(
    strategy: str,
    k: int,
    time: float,
    stderr: float,
    method: str,
    *,
    threshold: float | None = None,
    drop_rate: float | None = None,
    effective: tuple[float, float] | None = None,
    spec: str | None = None,
) -> Row:
    value, error = effective if effective is not None else (math.nan, math.nan)
    return Row(
        strategy,
        int(k),
        float(time),
        float(stderr),
        math.nan,
        value,
        error,
        method,
        threshold=threshold,
        drop_rate=drop_rate,
        spec=spec,
    )


def _relative(row: Row, sync_time: float, workers: int) -> Row:
    """Fill in E[T_sync]/E[T] and, for the K-family, K E[T_sync] / (N E[T])."""
    if not row.iteration_time > 0:
        raise UsageError(
            f"{row.strategy}'s expected iteration time is {row.iteration_time} s at K = "
            f"{row.k}: give delays with a positive mean in a representable range (e.g. "
            "seconds) and no mass at 0 (then the first K of N finish at once)"
        )
    speedup = sync_time / row.iteration_time
    if row.strategy == "dropcompute":
        return replace(row, speedup_vs_sync=speedup)
    effective = row.k * speedup / workers
    error = effective * row.iteration_time_stderr / row.iteration_time
    return replace(
        row, speedup_vs_sync=speedup, effective_speedup=effective, effective_speedup_stderr=error
    )


def _mark_best(rows: list[Row]) -> list[Row]:
    """DropCompute has one row: its tau* is the best setting (the K-family is marked by
    :func:`_family_rows`)."""
    return [replace(r, best=True) if r.strategy == "dropcompute" else r for r in rows]


def best_k(ks: ArrayLike, effective: ArrayLike, stderr: ArrayLike) -> tuple[int, NDArray[np.bool_]]:
    """The largest K whose effective speedup is within 2 standard errors (or 1e-9) of the
    highest (the module's criterion), vectorised; also the mask of K within that slack."""
    ks, value, error = (np.asarray(a, dtype=float) for a in (ks, effective, stderr))
    # a K whose E[T] is 0 (a law with an atom at 0) has no finite speedup: not a candidate
    usable = np.isfinite(value)
    if not usable.any():
        return int(ks.max()), usable
    top = int(np.argmax(np.where(usable, value, -np.inf)))
    error = np.nan_to_num(error, nan=0.0, posinf=0.0)
    slack = 2 * np.hypot(error[top], error) + 1e-9 * value[top]
    close = usable & (value >= value[top] - slack)
    return int(ks[close].max()), close


def _family_rows(
    ctx: _Context,
    strategy: str,
    ks: ArrayLike,
    mean: ArrayLike,
    stderr: ArrayLike,
    method: str,
) -> list[Row]:
    """Rows of one K-family strategy evaluated at every K in ``ks``: its best K is found on
    all of them (effective speedup K E[T_sync] / (N E[T_K])), but only the listed K and the
    best become rows."""
    ks = np.asarray(ks, dtype=np.int64)
    mean, stderr = np.asarray(mean, dtype=float), np.asarray(stderr, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):  # E[T] = 0 is refused later
        effective = ks * ctx.sync_time / (ctx.scenario.workers * mean)
        error = effective * stderr / mean
    best, _ = best_k(ks, effective, error)
    keep = np.flatnonzero(np.isin(ks, ctx.listed) | (ks == best))
    return [
        replace(_row(strategy, ks[i], mean[i], stderr[i], method), best=bool(ks[i] == best))
        for i in keep
    ]


def _mark_family(ctx: _Context, rows: list[Row]) -> list[Row]:
    """:func:`_family_rows` for rows already built (K-async's per-K simulations)."""
    ks = [r.k for r in rows]
    mean = [r.iteration_time for r in rows]
    stderr = [r.iteration_time_stderr for r in rows]
    method = {r.k: r.method for r in rows}
    found = _family_rows(ctx, rows[0].strategy, ks, mean, stderr, "")
    return [replace(r, method=method[r.k]) for r in found]
