"""``tailtrain advise``: who is slow in a trace, what it costs, and what to do.

* :mod:`~tailtrain.advice.stragglers` — robust per-worker scores and verdicts
* :mod:`~tailtrain.advice.cost` — sync E[T] on the replayed trace against the mean worker time
* :mod:`~tailtrain.advice.recommend` — every strategy at its best setting, ranked, and one pick
* :mod:`~tailtrain.advice.adopt` — what a job can run (``--for``) and the lines that adopt it
* :mod:`~tailtrain.advice.heatmap` — the trace as an iterations x workers picture
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

import numpy as np

from tailtrain.advice.adopt import SHARES, Adoption, adoption, check_setup, runnable
from tailtrain.advice.cost import Cost, sync_cost
from tailtrain.advice.job_rows import SPLIT_NOTE, in_job_units
from tailtrain.advice.recommend import (
    DEMAND_SPEC,
    Ranked,
    dominate,
    faster,
    priced_comm,
    rank,
    reason,
    recommend,
    simplicity,
    trace_spread,
)
from tailtrain.advice.source import trace_file
from tailtrain.advice.stragglers import MIN_ITERATIONS, iteration_times, score_workers
from tailtrain.advice.units import (
    TIME_TO_TARGET,
    InUnits,
    JobShape,
    RunReport,
    in_units,
    job_of,
    measured_rate,
    run_reports,
    split_trace,
    verdict_times,
)
from tailtrain.core.machine import contention_note, read_machine
from tailtrain.delays.groups import check_grouping, groups_note, write_group_trace
from tailtrain.delays.parse import parse_delay
from tailtrain.delays.trace import (
    Trace,
    TraceDelay,
    comm_note,
    cut_option,
    read_trace,
    replayed_comm,
)
from tailtrain.errors import UsageError
from tailtrain.persistence import Slowness
from tailtrain.prediction import Row
from tailtrain.prediction.families import row_spec


@dataclass(frozen=True)
class Advice:
    """Everything ``advise`` found; ``to_json`` is the ``--json`` contract."""

    trace: str
    workers: int
    times: np.ndarray  # t[i, w] of the trace workers
    stragglers: list[Slowness]
    cost: Cost
    without_persistent: Cost | None
    ranked: list[Ranked]
    choice: Ranked
    reason: str
    notes: list[str] = field(default_factory=list)
    setup: str = "any"
    adopt: Adoption | None = None
    #: the fresh-gradient rows equivalent to the best one, simplest (the choice) first
    equivalent: list[Ranked] = field(default_factory=list)
    #: the job's structure as its trace's last run recorded it (``advice.units``)
    job: JobShape | None = None
    #: the last run's samples (or, without them, steps) per second as measured
    measured: float | None = None
    #: every run of the file, measured and judged, when it holds more than one
    runs: list[RunReport] = field(default_factory=list)

    @property
    def unit(self) -> str:
        """What the figures count: samples where the trace has them, else steps/gradients."""
        return "samples" if self.job is not None and self.job.samples is not None else "steps"

    def units(self, r: Ranked) -> InUnits:
        """``r``'s forecast in the job's units."""
        return in_units(
            r.row.strategy,
            r.row.k,
            self.workers,
            r.row.drop_rate,
            r.effective_speedup,
            self.job,
            self.measured,
        )

    @property
    def exclusion(self) -> dict[str, Any] | None:
        """The job without its persistent stragglers, N - P ranks at their pace, per-rank
        batches unchanged, in the same units as the rows; ``replaced_ratio``: the job with each
        replaced by a rank at the others' pace (every sample kept, sync's step without them:
        optimistic by the max over P more healthy ranks)."""
        if self.without_persistent is None:
            return None
        kept = self.without_persistent
        share = kept.kept_workers / self.workers  # of the global batch, without samples
        if (
            self.job is not None
            and self.job.samples is not None
            and self.job.workers == self.workers
        ):
            keep = [w not in self.persistent for w in range(self.job.workers)]
            share = float(self.job.samples[keep].sum() / self.job.samples.sum())
        ratio = share * self.cost.iteration_time / kept.iteration_time
        found = self.units(
            Ranked(
                Row(
                    "sync",
                    kept.kept_workers,
                    kept.iteration_time,
                    0.0,
                    math.nan,
                    ratio,
                    0.0,
                    "replay without them",
                ),
                None,
            )
        )
        return {
            "excluded": self.persistent,
            "iteration_time": kept.iteration_time,
            "replaced_ratio": self.cost.iteration_time / kept.iteration_time,
            **found.as_dict(self.unit),
        }

    def before_after(self) -> dict[str, Any] | None:
        """The last run against each earlier one, as measured (``advice.units``)."""
        if len(self.runs) < 2:
            return None
        last = self.runs[-1]
        return {
            "unit": self.unit,
            "runs": [r.as_dict(self.unit) for r in self.runs],
            "last_over": {str(r.run): last.rate / r.rate for r in self.runs[:-1]},
        }

    @property
    def persistent(self) -> list[int]:
        return [s.worker for s in self.stragglers if s.verdict == "persistent"]

    @property
    def recommendation(self) -> str:
        return row_spec(self.choice.row)

    def to_json(self) -> dict[str, Any]:
        iterations, trace_workers = self.times.shape
        return {
            "trace": self.trace,
            "workers": self.workers,
            "trace_workers": trace_workers,
            "iterations": iterations,
            "recommendation": self.recommendation,
            "recommendation_uncertainty": self.choice.uncertainty,
            "equivalent": [row_spec(r.row) for r in self.equivalent],
            "reason": self.reason,
            "stragglers": [s.as_dict() for s in self.stragglers],
            "cost": self.cost.as_dict(),
            "cost_without_persistent": (
                None if self.without_persistent is None else self.without_persistent.as_dict()
            ),
            "results": [{**r.as_dict(), **self.units(r).as_dict(self.unit)} for r in self.ranked],
            "job": None if self.job is None else self.job.as_dict(),
            f"measured_{self.unit}_per_second": self.measured,
            "time_to_target": TIME_TO_TARGET,
            "exclusion": self.exclusion,
            "before_after": self.before_after(),
            "notes": self.notes,
            "for": self.setup,
            "adopt": None if self.adopt is None else self.adopt.as_dict(),
        }


def advise(
    path: str | Path,
    *,
    workers: int | None = None,
    micro_batches: int | None = None,
    seed: int = 0,
    samples: int = 2000,
    setup: str = "any",
    comm_time: str | None = None,
    group_size: int = 1,
    group_cost: float = 0.0,
) -> Advice:
    """Score the workers of the trace at ``path`` (its last run), cost them, and rank the
    strategies for ``workers`` workers (default: the trace's), worker n replaying trace worker
    n mod W, each round paying T^c: ``comm_time`` (``--comm-time``: seconds or a delay spec)
    or else the trace's recorded noncompute seconds (``delays.trace``), or none; ``setup``
    (``advice.adopt``) keeps to the strategies that job can run. Rows are ranked by samples
    applied per second where the trace counts samples (``advice.units``); ``micro_batches``
    on a per-step trace splits its steps (``advice.units.split_trace``). ``group_size`` G
    > 1 reads the trace's ranks as replica groups of G (a hybrid-sharded job, in id order),
    each group's unit the max over its ranks + ``group_cost`` (``delays.groups.group_trace``):
    every figure, verdict and row is then the same rule read at group level, ``workers``
    counting groups."""
    check_setup(setup)
    if workers is not None and workers < 1:
        raise UsageError(f"--workers must be >= 1, got {workers}")
    if micro_batches is not None and micro_batches < 1:
        raise UsageError(f"--micro-batches must be >= 1, got {micro_batches}")
    path = trace_file(path)  # a probe's folder too
    whole = read_trace(path)
    if group_size != 1 or group_cost != 0:
        check_grouping(np.unique(whole.worker).size, group_size, group_cost)
    if micro_batches == 1 and whole.micro_batch is None:
        micro_batches = None  # one batch a step: what a per-step trace records
    with TemporaryDirectory(prefix="tailtrain-advise-") as folder:
        replayed, split = path, None
        if group_size != 1 or group_cost != 0:  # the trace of the groups, replayed as any
            replayed = Path(folder) / "groups.csv"
            whole = write_group_trace(replayed, whole, group_size, group_cost)
        last = whole.of_run(whole.runs[-1])
        job = job_of(last)
        machine = read_machine(path.parent, int(whole.runs[-1])) or {}
        ran = machine.get("remedy")
        if ran is not None and last.micro_batch is None:  # a probe's run under a hook or step
            job = replace(job, micro_batches=int(ran["micro_batches"]), remedy=str(ran["spec"]))
        if last.micro_batch is None:  # a step of several loader batches: shares deal one
            job = replace(job, accumulation=int(machine.get("accumulates", 1) or 1))
        if micro_batches is not None and last.micro_batch is None and micro_batches > 1:
            split = split_trace(last, micro_batches, Path(folder) / "split.csv", seed)
            replayed = split
        found = _advise(
            path,
            replayed,
            whole,
            job,
            workers,
            micro_batches,
            seed,
            samples,
            setup,
            comm_time,
            Path(folder),
            cut_option(path, whole),
        )
    if split is not None:
        found.notes.append(f"--micro-batches {micro_batches} on a per-step trace: {SPLIT_NOTE}")
    if job.remedy_name not in (None, "sync"):
        found = _under_remedy(found, job, int(whole.runs[-1]))
    if group_size != 1 or group_cost != 0:
        ranks = group_size * int(found.times.shape[1])
        found.notes.append(
            f"--group-size {group_size}: the trace's workers are replica groups, "
            f"{groups_note(ranks, group_size, group_cost)}"
        )
    return found


def _advise(
    path: Path,
    replayed: Path,
    whole: Trace,
    job: JobShape,
    workers: int | None,
    micro_batches: int | None,
    seed: int,
    samples: int,
    setup: str,
    comm_time: str | None,
    folder: Path,
    cut: str = "",
) -> Advice:
    delay = f"trace:path={replayed}{cut}"  # ``cut``: the recorded trace's, wherever replayed
    comm_spec = replayed_comm(delay, comm_time)
    comm = priced_comm(comm_spec)
    model = parse_delay(delay)
    assert isinstance(model, TraceDelay)
    replay = model.replay
    n = int(replay.ids.size) if workers is None else workers
    m = micro_batches or (int(replay.counts.max()) if model.per_micro_batch else None)
    times, notes = iteration_times(replay)
    last = whole.of_run(whole.runs[-1])
    scores = score_workers(verdict_times(last)[: times.shape[0]], replay.ids)
    notes += _trust_notes(times, scores, n)
    contention = contention_note(read_machine(path.parent, int(whole.runs[-1])))
    notes += [contention] if contention is not None else []
    comm_mean = comm if isinstance(comm, float) else comm.mean
    cost = sync_cost(times, replay.ids, n, comm=comm_mean)
    persistent = [s.worker for s in scores if s.verdict == "persistent"]
    without = (
        sync_cost(times, replay.ids, n, exclude=persistent, comm=comm_mean) if persistent else None
    )
    recorded = model.trace.round_comm() if comm_time is None else np.empty(0)
    spread = trace_spread(times, recorded)
    ranked, more = rank(model, times, n, m, seed, samples, comm, spread, recorded.size > 0)
    if n == job.workers:
        ranked, more = in_job_units(
            ranked, more, last, job, m, setup, comm, spread, seed, samples, folder, cut
        )
    demand = next((r for r in ranked if row_spec(r.row) == DEMAND_SPEC), None)
    ranked, more = _runnable(ranked, setup, more)
    cost = _as_in_the_table(cost, ranked)
    tied = recommend(ranked, dominate(cost, without))
    choice = tied[0]
    unit = "samples" if job.samples is not None else "gradients"
    text = reason(choice, cost, without, persistent, unit) + _tie_text(tied)
    text += _train_only_text(choice, demand, setup)
    if (note := comm_note(delay, comm_spec)) is not None:
        more.append(note.replace(str(replayed), str(path)))
    adopt = adoption(
        row_spec(choice.row),
        choice.row.strategy,
        setup,
        choice.micro_batches,
        choice.shares,
        job.accumulation,
        dealt=job.dealt,
    )
    found = (str(path), n, times, scores, cost, without, ranked, choice, text, notes + more)
    advice = Advice(*found, setup=setup, adopt=adopt, equivalent=tied)
    measured = measured_rate(last)[0]
    runs = run_reports(whole) if len(whole.runs) > 1 else []
    return replace(advice, job=job, measured=measured, runs=runs)


def _under_remedy(found: Advice, job: JobShape, run: int) -> Advice:
    """Advice on a run the probe saw under a remedy (``JobShape.remedy``): it says so first,
    and a recommendation of the rule in force says that it is (issue 34: the loop's second
    pass reads the adopted job, not one batch a step)."""
    assert job.remedy is not None
    note = (
        f"run {run} ran under {job.remedy} at M={job.micro_batches} (the probe watched its hook "
        "or step): the job as measured, sync's row, is that job as it ran, its samples those "
        "the ranks computed; each row prices its rule over it, and the runs above say what the "
        "remedy changed"
    )
    reason = found.reason
    if found.choice.row.strategy == job.remedy_name:
        reason += (
            f" ({found.choice.row.strategy} is in force in run {run}, at M={job.micro_batches}: "
            "this row prices it again over the run it already shaped, so trust the runs' "
            "measured ratio above over it)"
        )
    return replace(found, notes=[note, *found.notes], reason=reason)


def _runnable(ranked: list[Ranked], setup: str, notes: list[str]) -> tuple[list[Ranked], list[str]]:
    """The rows a ``setup`` job can run, and a note on those left out."""
    kept = [r for r in ranked if runnable(r.row.strategy, setup, row_spec(r.row))]
    # a DDP job (or a trainer's) rebalances per-rank batches: only the row priced with
    # per-sample shares
    fixed = setup in SHARES and setup != "any"
    kept = [r for r in kept if not fixed or r.row.strategy != "rebalance" or r.shares]
    families = {r.row.strategy for r in kept}
    left = sorted({r.row.strategy for r in ranked} - families)
    left += sorted(row_spec(r.row) for r in ranked if r not in kept and r.row.strategy in families)
    if left:
        notes = [
            *notes,
            f"--for {setup}: left out {', '.join(left)} (a {setup} job cannot run "
            "them; --for any shows every row)",
        ]
    return kept, notes


def _as_in_the_table(cost: Cost, ranked: list[Ranked]) -> Cost:
    """The cost with sync's E[T] taken from the table's sync row, so that text and table quote
    one figure (the row replays the same trace rows; the direct mean over them can differ by
    the replay's cycling)."""
    sync = next((r for r in ranked if r.row.strategy == "sync"), None)
    return cost if sync is None else replace(cost, iteration_time=sync.row.iteration_time)


def _tie_text(tied: list[Ranked]) -> str:
    if len(tied) < 2:
        return ""
    choice = tied[0]
    split = [
        r
        for r in tied[1:]
        if r.micro_batches is not None and r.effective_speedup > choice.effective_speedup
    ]
    if choice.row.strategy == "rebalance" and choice.micro_batches is None and split:
        best = max(split, key=lambda r: r.effective_speedup)
        return (
            f" {row_spec(best.row)} forecasts more ({best.effective_speedup:.2f}x at "
            f"M={best.micro_batches}), but splits each batch in micro-batches the job does not "
            "have, whose cost a trace of whole steps cannot show; rebalance keeps the job's "
            "own batches (persistent stragglers dominate)."
        )
    others = ", ".join(row_spec(r.row) for r in tied[1:])
    rule = "fresh gradients first, then the simpler spec"
    if tied[0].row.strategy == "rebalance" and tied[0] is not min(tied, key=simplicity):
        rule = "rebalance first (persistent stragglers dominate: shares keep their work)"
        if row_spec(tied[0].row) == DEMAND_SPEC:
            rule = (
                "rebalance first, dealt on demand where that is faster than its shares "
                "(persistent stragglers dominate: rebalance keeps their work)"
            )
    return f" Equivalent within the forecasts' uncertainty: {others}; chosen by the rule {rule}."


def _train_only_text(choice: Ranked, demand: Ranked | None, setup: str) -> str:
    """Why a rebalance choice is not :data:`DEMAND_SPEC` when a ``setup`` job cannot run it and
    it would be faster (``advice.recommend.faster``)."""
    if demand is None or choice.row.strategy != "rebalance" or choice is demand:
        return ""
    if runnable(demand.row.strategy, setup, DEMAND_SPEC) or not faster(demand, choice):
        return ""
    simulated = demand.simulated
    also = "" if simulated is None else f", simulated {simulated.effective_speedup:.2f}x"
    return (
        f" {DEMAND_SPEC} is faster (predicted {demand.row.effective_speedup:.2f}x the gradients "
        f"per second of sync{also}), but a {setup} job cannot run it: a loader's batches give "
        "it no stream to deal micro-batches from on demand (an own loop's StragglerStep, "
        "ShardedStep and tailtrain train run it)."
    )


def _trust_notes(times: np.ndarray, scores: list[Slowness], workers: int) -> list[str]:
    iterations, trace_workers = times.shape
    notes = []
    if iterations < MIN_ITERATIONS:
        notes.append(
            f"trace too short to trust: {iterations} iterations per worker (< {MIN_ITERATIONS}); "
            "record more before acting on the verdicts"
        )
    weak = [s.worker for s in scores if s.verdict == "persistent" and s.slower_share < 0.95]
    if weak:
        notes.append(f"low confidence in the persistent verdict of worker(s) {weak}")
    if workers > trace_workers:
        notes.append(
            f"extrapolated from {trace_workers} trace workers to {workers}: worker n replays "
            f"trace worker n mod {trace_workers}, so each trace worker's slowness is copied"
        )
    return notes
