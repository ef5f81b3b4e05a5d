"""Advice in the user's units: samples applied per second, drop rate, time to a target loss.

The job's structure is read from its trace (the last run, as a replay reads it): B_n, rank
n's samples per step (the ``samples`` column summed over a step's micro-batches, median over
steps) and M, the micro-batches a step has (1 without a ``micro_batch`` column). A trace
without ``samples`` is priced per step (a rank's gradient), as before the column existed.

* **Samples applied per second**, as a ratio to the job as measured (its sync replay): for
  a row of ``predict``'s table its effective speedup (simulated where simulated), which
  counts the share of each rank's batch that enters an update (DropCompute Eq. 6: C_n / M;
  K-sync: K of N batches), so with equal B_n it is the ratio of samples applied per
  second; absolute, that ratio times the run's measured sum of samples / its wall seconds
  (:func:`measured_rate`: the longest rank's sum of seconds + noncompute over its steps).
* **Drop rate**: the share of the step's samples that never enter an update: DropCompute's
  cut, 1 - K/N for the K-sync family, 0 where every sample enters (stale ones too).
* **Time to a target loss**, as a ratio to the job as measured, only for rules that apply
  fresh gradients (sync, K-sync, DropCompute, rebalance): samples needed / samples applied
  per second, i.e. 1 / the samples ratio, *assuming each applied sample makes the same
  progress as under sync at the same global batch* (the linear-scaling regime below the
  critical batch size; the dropped samples are the slow ranks' every step, which
  under-represents their data: not priced). Rules that apply stale gradients or average
  models (async, K-async, eager, Local-SGD) get no forecast: their progress per sample
  depends on staleness that a timing trace cannot measure.

Two rows are priced here from the per-step trace, with the project's rules:

* **rebalance for a DDP job** (:func:`rebalance_shares`): rank n's step as a_n + c_n b
  seconds for b samples (:func:`step_costs`: a_n, the seconds no share changes, fitted where
  the trace holds steps of another count, such as each epoch's short last batch; 0
  otherwise, the step then proportional to its samples), shares b_n =
  ``strategies.rebalance.optimal_shares(c, N B, 1, fixed=a)``, the one rule; each recorded
  step i after the run's first :data:`WARMUP_STEPS` replayed with the shares, max_n T_{i,n}
  (a_n + c_n b_n) / (a_n + c_n B_{i,n}) (the step's recorded time scaled to the new count:
  the ranks' common slow steps kept together), plus T^c, the mean of the steps' recorded
  T^c. Scaling a rank's whole step by its samples overstated a fast rank that is dealt more:
  on the bench's tutorial job (``bench/bench_loop.py``, scenario b) the forecast was 0.80x
  the realised; keeping the warm-up, whose second step times rank 0's wait for the slow rank
  as compute, 0.87-0.92x.
* **DropCompute at M micro-batches from a per-step trace** (:func:`split_trace`): the hook
  checks its threshold between micro-batches, so a step of one batch has nothing to cut.
  Each recorded step of rank n is split into M parts as M i.i.d. Gamma parts conditioned on
  their sum (a symmetric Dirichlet split of the recorded seconds), the Gamma fitted to the
  rank's step law (mean mu_n, variance s_n^2: shape mu_n^2 / (M s_n^2)); so every step's
  total, sync's replay and the persistent differences stay as recorded, and only how a step
  divides is assumed. A rank's seconds per step that no sample count changes (a_n, fitted
  as rebalance's, where the trace allows) are not split: they stay whole in the step's first
  micro-batch, which always runs, so DropCompute is never priced as cutting a per-step lump
  (a sleep or a fetch once a step) that splitting the batch leaves whole. No per-micro-batch
  overhead is assumed (smaller micro-batches can run slower per sample on an accelerator:
  measure at the M chosen).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from tailtrain.delays.trace import Trace, write_trace_rows
from tailtrain.errors import UsageError
from tailtrain.persistence import Slowness, per_sample_times
from tailtrain.spec import parse_spec

#: micro-batch counts DropCompute is priced at on a per-step trace (those dividing B)
CANDIDATE_M = (2, 4, 8)
#: rules whose gradients are fresh and whose time to target scales as 1 / samples applied
FRESH_PROGRESS = ("sync", "k-sync", "k-batch-sync", "dropcompute", "rebalance", "dbw")
#: Gamma shape cap: a step law with no spread is split into equal parts
_MAX_SHAPE = 1e6
#: batches of the replayed steps for the standard error of a replayed mean step time
_BATCHES = 10
#: steps a rank needs at a second count before its fixed seconds per step are fitted
MIN_FIT_STEPS = 3
#: a run's first steps left out of the per-sample fit and replay, as the probe leaves them out
#: of its verdicts: DDP's first forward and its bucket rebuild in the second, where rank 0
#: waits for its peers inside what the probe times as compute (a wait the shares would scale)
WARMUP_STEPS = 2


@dataclass(frozen=True)
class JobShape:
    """The job's structure as its trace recorded it (module docstring)."""

    workers: int
    micro_batches: int  #: M per step (1: the trace has no micro_batch column)
    samples: NDArray[np.int64] | None  #: B_n per rank per step; None: no samples column
    #: the rule the run ran under, as the probe saw its hook or step (``machine.jsonl``'s
    #: ``remedy``; None: none seen): its samples are those the ranks computed
    remedy: str | None = None
    #: loader batches a step accumulates under DDP's ``no_sync`` (the probe's
    #: ``accumulates`` in ``machine.jsonl``): a rank's batch per step is this many of the
    #: loader's, and rebalance's shares deal one loader batch
    accumulation: int = 1

    @property
    def remedy_name(self) -> str | None:
        """The rule in force's name (``dropcompute`` of ``dropcompute:threshold=...``)."""
        return None if self.remedy is None else parse_spec(self.remedy, what="remedy").name

    @property
    def cut(self) -> bool:
        """Whether a rule that cuts micro-batches (DropCompute) left the ranks' computed
        samples unequal: they are then its cut, not the batches dealt (a threshold that cut
        nothing leaves them as dealt)."""
        return self.remedy_name == "dropcompute" and not self.equal

    @property
    def unit(self) -> str:
        return "samples" if self.samples is not None else "steps"

    @property
    def per_step(self) -> int | None:
        """Samples per step of the whole job, sum_n B_n (None: unknown)."""
        return None if self.samples is None else int(self.samples.sum())

    @property
    def equal(self) -> bool:
        return self.samples is None or bool(np.all(self.samples == self.samples[0]))

    @property
    def dealt(self) -> tuple[int, ...] | None:
        """The unequal shares the ranks are dealt (adopted before; not a cut), per loader
        batch as rebalance's shares are (a step's samples over the batches it accumulates;
        per step where they do not divide), which sync's row, the job as measured, keeps;
        None: equal, cut or unknown."""
        if self.samples is None or self.equal or self.cut:
            return None
        k = self.accumulation if np.all(self.samples % self.accumulation == 0) else 1
        return tuple(int(b) // k for b in self.samples)

    def as_dict(self) -> dict[str, object]:
        return {
            "workers": self.workers,
            "micro_batches": self.micro_batches,
            "samples_per_rank": None if self.samples is None else self.samples.tolist(),
            "samples_per_step": self.per_step,
            "unit": self.unit,
            "remedy": self.remedy,
            "accumulation": self.accumulation,
            "dealt": None if self.dealt is None else list(self.dealt),
        }


def step_table(trace: Trace) -> tuple[NDArray, NDArray, NDArray, NDArray | None]:
    """Per (step, rank) over the steps every rank recorded: seconds (micro-batches summed),
    noncompute (0 where none recorded), samples (None without the column), and the ranks."""
    ranks, w = np.unique(trace.worker, return_inverse=True)
    steps, i = np.unique(trace.iteration, return_inverse=True)
    shape = (steps.size, ranks.size)
    seconds = np.zeros(shape)
    np.add.at(seconds, (i, w), trace.seconds)
    seen = np.zeros(shape, dtype=bool)
    seen[i, w] = True
    full = seen.all(axis=1)  # steps every rank recorded
    noncompute = np.zeros(shape)
    if trace.noncompute is not None:
        known = ~np.isnan(trace.noncompute)
        np.add.at(noncompute, (i[known], w[known]), trace.noncompute[known])
    samples = None
    if trace.samples is not None:
        samples = np.zeros(shape, dtype=np.int64)
        np.add.at(samples, (i, w), trace.samples)
        samples = samples[full]
    return seconds[full], noncompute[full], ranks, samples


def job_of(trace: Trace) -> JobShape:
    """B_n (median over steps) and M of the trace's job."""
    _, _, ranks, samples = step_table(trace)
    m = 1
    if trace.micro_batch is not None:
        m = int(
            np.unique(np.column_stack([trace.iteration, trace.worker]), axis=0, return_counts=True)[
                1
            ].max()
        )
    per_rank = None if samples is None else np.median(samples, axis=0).round().astype(np.int64)
    return JobShape(int(ranks.size), m, per_rank)


def measured_rate(trace: Trace) -> tuple[float, float, int]:
    """The run (one) as measured over its :func:`steady` steps (the rebalance replay's, and
    what ``bench/bench_loop.py`` measures: the warm-up left out): (units per second, step
    wall seconds mean, steps); units are samples (sum of samples / the run's wall seconds)
    or, without ``samples``, steps. A rank's steps (seconds + noncompute, its step less its
    compute) tile its time, so the run's wall is a rank's sum of them, the longest (a trace
    without ``noncompute``: the sum of each step's slowest rank, as a synchronous step waits
    for it); a sum of each step's longest rank would count a wait twice where the ranks meet
    only every few steps (a DDP loop that accumulates under ``no_sync`` and times each
    micro-batch as a step: the fast rank's wait at the reduction covers the slow rank's
    earlier micro-batches, already counted)."""
    seconds, noncompute, _, samples = step_table(steady(trace))
    recorded = trace.noncompute is not None and not np.isnan(trace.noncompute).all()
    if recorded:
        total = float((seconds + noncompute).sum(axis=0).max()) if seconds.size else 0.0
    else:  # no wait recorded: a rank's rows do not tile its time; each step waits its slowest
        total = float(seconds.max(axis=1).sum()) if seconds.size else 0.0
    steps = int(seconds.shape[0])
    done = float(samples.sum()) if samples is not None else float(steps)
    rate = done / total if total > 0 else float("inf")
    return rate, (total / steps if steps else 0.0), steps


def verdict_times(trace: Trace) -> NDArray[np.float64]:
    """t[i, n] that verdicts judge: seconds per sample where the ranks' samples differ (a
    rebalanced job: its slow rank computes fewer samples in the same time and stays slow),
    else each step's seconds; by ``persistence.per_sample_times``, the rule the probe's live
    verdicts apply."""
    seconds, _, _, samples = step_table(trace)
    return per_sample_times(seconds, samples)[0]


@dataclass(frozen=True)
class StepCosts:
    """Rank n's step as ``fixed[n] + per_sample[n] * b`` seconds for b samples."""

    fixed: NDArray[np.float64]  #: a_n: seconds per step no share changes
    per_sample: NDArray[np.float64]  #: c_n
    fitted: NDArray[np.bool_]  #: whether a_n was fitted (the trace held another count)

    def at(self, samples: NDArray) -> NDArray[np.float64]:
        return self.fixed + self.per_sample * samples


def step_costs(seconds: NDArray, samples: NDArray) -> StepCosts:
    """a_n and c_n from (steps, ranks) seconds and samples (counts > 0). Rank n's most
    frequent count b* and its median time T* anchor the line; each other count seen in at
    least :data:`MIN_FIT_STEPS` steps gives a point (its median time), and the slope is their
    least squares through the anchor, weighted by steps; a_n is clipped at 0. A rank whose
    trace holds one count gets a_n = 0: one count cannot tell the two parts apart; nor can
    counts whose steps ran no faster for fewer samples (a slope <= 0: the short step paid
    for something else), which keep a_n = 0 too."""
    ranks = seconds.shape[1]
    fixed, per_sample, fitted = np.zeros(ranks), np.zeros(ranks), np.zeros(ranks, dtype=bool)
    for n in range(ranks):
        values, seen = np.unique(samples[:, n], return_counts=True)
        anchor = values[seen.argmax()]
        usual = float(np.median(seconds[samples[:, n] == anchor, n]))
        others = [(v, k) for v, k in zip(values, seen, strict=True) if v != anchor]
        points = [(float(v), float(np.median(seconds[samples[:, n] == v, n])), float(k))
                  for v, k in others if k >= MIN_FIT_STEPS]  # fmt: skip
        per_sample[n] = usual / anchor
        if not points:
            continue
        b, t, w = (np.array(column) for column in zip(*points, strict=True))
        slope = float((w * (b - anchor) * (t - usual)).sum() / (w * (b - anchor) ** 2).sum())
        if slope <= 0:  # the other counts ran no faster (an eval, a loader reset): no line
            continue
        fixed[n] = max(usual - slope * anchor, 0.0)  # < usual, as the slope is positive
        per_sample[n] = (usual - fixed[n]) / anchor
        fitted[n] = True
    return StepCosts(fixed, per_sample, fitted)


@dataclass(frozen=True)
class Rebalanced:
    """Per-sample shares for a DDP job and their replayed step (module docstring)."""

    shares: NDArray[np.int64]  #: samples of each loader batch (``rebalance_loader``'s)
    iteration_time: float  #: E[max_n T_{i,n} scaled to b_n] + E[T^c], replayed
    stderr: float
    costs: StepCosts
    #: loader batches a step accumulates: rank n computes ``batches`` x ``shares[n]`` a step
    batches: int = 1

    @property
    def per_step(self) -> NDArray[np.int64]:
        """Each rank's samples per step under the shares."""
        return self.shares * self.batches

    @property
    def rate(self) -> float:
        """Samples per second: every replayed step deals the whole global batch (an epoch's
        short step too, scaled up), so the ratio to the job as measured, which counts the
        short steps' fewer samples, is taken in samples, not steps."""
        return float(self.per_step.sum()) / self.iteration_time


def rebalance_shares(trace: Trace, comm: float, batches: int = 1) -> Rebalanced | None:
    """Shares by ``optimal_shares`` on the ranks' step costs and their replayed step time with
    ``comm`` seconds of T^c per step, over the :func:`counted_steps` (after the warm-up,
    every rank's count known); None without ``samples`` or two such steps. ``batches``:
    loader batches a step accumulates, so the shares deal one loader batch (the global one
    over ``batches``) and rank n computes ``batches`` of its share a step, at ``batches``
    times the seconds per sample of one."""
    from tailtrain.strategies.rebalance import optimal_shares

    counted = counted_steps(trace)
    if counted is None:
        return None
    seconds, samples, _ = counted
    costs = step_costs(seconds, samples)
    total = int(np.median(samples.sum(axis=1)))
    dealt = max(round(total / batches), samples.shape[1])
    shares = optimal_shares(costs.per_sample * batches, dealt, 1, fixed=costs.fixed)
    # each recorded step, its ranks' times scaled from their counts to the shares
    steps = (seconds * costs.at(shares * batches) / costs.at(samples)).max(axis=1)
    blocks = [b.mean() for b in np.array_split(steps, min(_BATCHES, steps.size))]
    stderr = float(np.std(blocks, ddof=1) / np.sqrt(len(blocks))) if len(blocks) > 1 else 0.0
    return Rebalanced(shares, float(steps.mean()) + comm, stderr, costs, batches)


def candidate_ms(job: JobShape) -> list[int]:
    """The M DropCompute is priced at on a per-step trace: :data:`CANDIDATE_M` dividing every
    rank's batch (all of them without ``samples``)."""
    if job.samples is None:
        return list(CANDIDATE_M)
    return [m for m in CANDIDATE_M if all(b % m == 0 and b >= m for b in job.samples)]


def steady(trace: Trace) -> Trace:
    """``trace`` (one run) without its first :data:`WARMUP_STEPS` iterations, where two
    remain: the run as the steps after its warm-up price it."""
    steps = np.unique(trace.iteration)
    if steps.size < WARMUP_STEPS + 2:
        return trace
    return trace.where(trace.iteration >= steps[WARMUP_STEPS])


def counted_steps(trace: Trace) -> tuple[NDArray, NDArray, NDArray] | None:
    """(seconds, samples, ranks) of the :func:`steady` steps where every rank's count is
    known (> 0, as ``persistence.per_sample_times`` keeps them); None without ``samples`` or
    two such steps."""
    seconds, _, ranks, samples = step_table(steady(trace))
    if samples is None:
        return None
    kept = (samples > 0).all(axis=1)
    if kept.sum() < 2:
        return None
    return seconds[kept], samples[kept], ranks


def fixed_seconds(trace: Trace) -> dict[int, float]:
    """Each rank's fitted seconds per step that no sample count changes (:func:`step_costs`'s
    a_n, where the trace allows the fit), by worker id; empty without ``samples``."""
    counted = counted_steps(trace)
    if counted is None:
        return {}
    seconds, samples, ranks = counted
    costs = step_costs(seconds, samples)
    return {int(w): float(a) for w, a, fit in zip(ranks, costs.fixed, costs.fitted, strict=True)
            if fit}  # fmt: skip


def split_trace(trace: Trace, m: int, path: Path, seed: int = 0) -> Path:
    """Write ``trace`` (per step) split into ``m`` micro-batches per step at ``path``: a
    symmetric Dirichlet split of each step's seconds past the rank's fixed part, its shape
    from that remainder's law, the fixed part whole in the first micro-batch (module
    docstring); ``samples`` divided evenly, noncompute on the step's last part."""
    if trace.micro_batch is not None:
        raise UsageError("the trace already has a micro_batch column: advise at its own M")
    rng = np.random.default_rng(seed)
    fixed = fixed_seconds(trace)
    parts = np.empty((trace.seconds.size, m))
    for worker in np.unique(trace.worker):
        rows = trace.worker == worker
        # a part no sample count changes runs once a step, uncut: the first micro-batch
        # always starts, so DropCompute cannot cut it (a lump split M ways could be)
        lump = np.minimum(trace.seconds[rows], fixed.get(int(worker), 0.0))
        x = trace.seconds[rows] - lump
        var = float(x.var())
        shape = _MAX_SHAPE if var <= 0 else min(_MAX_SHAPE, float(x.mean()) ** 2 / (m * var))
        g = rng.gamma(shape, 1.0, (x.size, m))
        parts[rows] = x[:, None] * g / g.sum(axis=1, keepdims=True)
        parts[rows, 0] += lump
    n = trace.seconds.size
    columns = [
        np.repeat(trace.iteration, m),
        np.repeat(trace.worker, m),
        np.tile(np.arange(m), n),
        parts.ravel(),
    ]
    if trace.noncompute is not None:
        nc = np.full((n, m), np.nan)
        nc[:, -1] = trace.noncompute
        columns.append(nc.ravel())
    if trace.samples is not None:
        share = np.repeat(trace.samples // m, m).reshape(n, m)
        share[:, -1] += trace.samples % m
        columns.append(share.ravel())
    write_trace_rows(
        path,
        np.column_stack(columns).astype(np.float64),
        True,
        noncompute=trace.noncompute is not None,
        samples=trace.samples is not None,
    )
    return path


@dataclass(frozen=True)
class RunReport:
    """One run of the file as measured: units per second and each rank's verdict."""

    run: int
    rate: float
    step_time: float
    steps: int
    verdicts: list[Slowness]
    #: each rank's samples per step (median), which tells a run with shares from one
    #: without; None: the trace has no samples column
    samples: tuple[int, ...] | None = None

    def as_dict(self, unit: str) -> dict[str, object]:
        return {
            "run": self.run,
            f"{unit}_per_second": self.rate,
            "step_time": self.step_time,
            "steps": self.steps,
            "samples_per_rank": None if self.samples is None else list(self.samples),
            "verdicts": [
                {"worker": s.worker, "verdict": s.verdict, "score": s.score} for s in self.verdicts
            ],
        }


def run_reports(whole: Trace) -> list[RunReport]:
    """Every run of the file, measured and judged (verdicts by :func:`verdict_times` under
    the one persistence rule; none for a run too short to score)."""
    from tailtrain.persistence import classify_workers

    found = []
    for run in whole.runs:
        trace = whole.of_run(run)
        rate, step, steps = measured_rate(trace)
        times = verdict_times(trace)
        ranks = np.unique(trace.worker)
        verdicts = classify_workers(times, ranks) if min(times.shape) >= 2 else []
        per_rank = job_of(trace).samples
        samples = None if per_rank is None else tuple(int(b) for b in per_rank)
        found.append(RunReport(run, rate, step, steps, verdicts, samples))
    return found


#: the assumption behind the time-to-target ratio (module docstring)
TIME_TO_TARGET = (
    "time to a target loss = samples needed / samples applied per second, assuming each "
    "applied sample makes the progress it makes under sync at the same global batch; none "
    "for stale or model-averaging rules"
)


@dataclass(frozen=True)
class InUnits:
    """One row's forecast in the job's units (module docstring)."""

    ratio: float  #: samples (or gradients) applied per second, x the job as measured
    per_second: float | None  #: absolute, where the trace counts samples
    drop_rate: float
    time_to_target: float | None  #: x the job as measured; None: no forecast

    def as_dict(self, unit: str) -> dict[str, object]:
        return {
            f"{unit}_applied_ratio": self.ratio,
            f"{unit}_applied_per_second": self.per_second,
            "samples_dropped": self.drop_rate,
            "time_to_target_ratio": self.time_to_target,
        }


def in_units(
    strategy: str,
    k: int,
    workers: int,
    drop_rate: float | None,
    ratio: float,
    job: JobShape | None,
    measured: float | None,
) -> InUnits:
    """A row of ``strategy`` (K = ``k`` of ``workers``) applying ``ratio`` x the job's
    samples per second, in the job's units (module docstring)."""
    if strategy == "dropcompute":
        dropped = float(drop_rate or 0.0)
    elif strategy in ("k-sync", "k-batch-sync", "dbw"):
        dropped = 1.0 - k / workers
    else:
        dropped = 0.0
    absolute = None
    if job is not None and job.samples is not None and measured is not None:
        absolute = ratio * measured
    target = 1.0 / ratio if strategy in FRESH_PROGRESS and ratio > 0 else None
    return InUnits(ratio, absolute, dropped, target)
