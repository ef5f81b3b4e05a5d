"""``tailtrain advise``: who is slow in a trace, what it costs, and what to do.

* :mod:`~tailtrain.advice.stragglers` — robust per-worker scores and verdicts
* :mod:`~tailtrain.advice.cost` — sync E[T] on the replayed trace against the mean worker time
* :mod:`~tailtrain.advice.recommend` — every strategy at its best setting, ranked, and one pick
* :mod:`~tailtrain.advice.adopt` — what a job can run (``--for``) and the lines that adopt it
* :mod:`~tailtrain.advice.heatmap` — the trace as an iterations x workers picture
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from tailtrain.advice.adopt import Adoption, adoption, check_setup, runnable
from tailtrain.advice.cost import Cost, sync_cost
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
from tailtrain.delays.parse import parse_delay
from tailtrain.delays.trace import TraceDelay, comm_note, replayed_comm
from tailtrain.errors import UsageError
from tailtrain.persistence import Slowness
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
            "results": [r.as_dict() for r in self.ranked],
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
) -> Advice:
    """Score the workers of the trace at ``path``, cost them, and rank the strategies for
    ``workers`` workers (default: the trace's), worker n replaying trace worker n mod W, each
    round paying T^c: ``comm_time`` (``--comm-time``: seconds or a delay spec) or else the
    trace's recorded noncompute seconds (``delays.trace``), or none; ``setup``
    (``advice.adopt``) keeps to the strategies that job can run."""
    check_setup(setup)
    if workers is not None and workers < 1:
        raise UsageError(f"--workers must be >= 1, got {workers}")
    path = trace_file(path)  # a probe's folder too
    delay = f"trace:path={path}"
    comm_spec = replayed_comm(delay, comm_time)
    comm = priced_comm(comm_spec)
    model = parse_delay(delay)
    assert isinstance(model, TraceDelay)
    replay = model.replay
    n = int(replay.ids.size) if workers is None else workers
    m = micro_batches or (int(replay.counts.max()) if model.per_micro_batch else None)
    times, notes = iteration_times(replay)
    scores = score_workers(times, replay.ids)
    notes += _trust_notes(times, scores, n)
    comm_mean = comm if isinstance(comm, float) else comm.mean
    cost = sync_cost(times, replay.ids, n, comm=comm_mean)
    persistent = [s.worker for s in scores if s.verdict == "persistent"]
    without = (
        sync_cost(times, replay.ids, n, exclude=persistent, comm=comm_mean) if persistent else None
    )
    recorded = model.trace.round_comm() if comm_time is None else np.empty(0)
    spread = trace_spread(times, recorded)
    ranked, more = rank(model, times, n, m, seed, samples, comm, spread, recorded.size > 0)
    demand = next((r for r in ranked if row_spec(r.row) == DEMAND_SPEC), None)
    ranked, more = _runnable(ranked, setup, more)
    cost = _as_in_the_table(cost, ranked)
    tied = recommend(ranked, dominate(cost, without))
    choice = tied[0]
    text = reason(choice, cost, without, persistent) + _tie_text(tied)
    text += _train_only_text(choice, demand, setup)
    if (note := comm_note(delay, comm_spec)) is not None:
        more.append(note)
    adopt = adoption(row_spec(choice.row), choice.row.strategy, setup)
    found = (str(path), n, times, scores, cost, without, ranked, choice, text, notes + more)
    return Advice(*found, setup=setup, adopt=adopt, equivalent=tied)


def _runnable(ranked: list[Ranked], setup: str, notes: list[str]) -> tuple[list[Ranked], list[str]]:
    """The rows a ``setup`` job can run, and a note on those left out."""
    kept = [r for r in ranked if runnable(r.row.strategy, setup, row_spec(r.row))]
    families = {r.row.strategy for r in kept}
    left = sorted({r.row.strategy for r in ranked} - families)
    left += sorted(row_spec(r.row) for r in ranked if r not in kept and r.row.strategy in families)
    if left:
        notes = [*notes, f"--for {setup}: left out {', '.join(left)} (a {setup} job cannot run "
                 "them; --for any shows every row)"]  # fmt: skip
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
        f"per second of sync{also}), but a {setup} job cannot run it: StragglerStep refuses it, as "
        "a user's own loop has no store to deal micro-batches from on demand (tailtrain train "
        "runs it)."
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
