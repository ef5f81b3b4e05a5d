"""What to do: every strategy at its best setting, by theory and by a timing-only simulation
replaying the trace, ranked, and one recommendation with its reason.

Rows come from ``predict`` (the trace replayed per worker: Monte Carlo on its iterations) and
``prediction.families`` (Local-SGD, eager-SGD, DBW) up to :data:`FULL_MAX_WORKERS` workers; each
best row is then replayed by ``tailtrain.sim.run.simulate`` (``task=none``) and ranked by the
simulated effective speedup (gradients applied per second relative to sync). Above that size
the rows are exact on the replayed trace for K-sync (k-th smallest of the replicas) and
K-batch-async / async (renewal rate K / sum_n 1/E[X_n], slow-and-stale Lemma 5).

The recommendation is the top row among strategies whose updates use fresh gradients only
(:data:`FRESH`): the asynchronous and eager rows buy throughput with stale gradients, which
slow-and-stale Theorem 3 charges in convergence, so a rate alone cannot rank them fairly.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from numpy.typing import NDArray

from tailtrain.advice.cost import Cost, _replicas
from tailtrain.delays.trace import TraceDelay
from tailtrain.prediction import DelayScenario, Row, best_k, k_grid, predict
from tailtrain.prediction.families import SIM_MAX_WORKERS, row_spec, simulated_row, with_families

FULL_MAX_WORKERS = SIM_MAX_WORKERS  #: predict + simulation up to this many workers
FRESH = ("sync", "k-sync", "k-batch-sync", "dropcompute", "local-sgd")
REPLAY = "replay(trace, all iterations)"


@dataclass(frozen=True)
class Ranked:
    """A strategy at its best setting, with its simulated figures when simulated."""

    row: Row
    simulated: Row | None

    @property
    def effective_speedup(self) -> float:
        source = self.simulated or self.row
        return source.effective_speedup

    def as_dict(self) -> dict[str, Any]:
        out = {**self.row.as_dict(), "spec": row_spec(self.row)}
        if self.simulated is not None:
            out["simulated_iteration_time"] = self.simulated.iteration_time
            out["simulated_effective_speedup"] = self.simulated.effective_speedup
            out["simulated_method"] = self.simulated.method
        return out


def rank(
    model: TraceDelay,
    times: NDArray[np.float64],
    workers: int,
    micro_batches: int | None,
    seed: int,
    samples: int,
) -> tuple[list[Ranked], list[str]]:
    """Best row per strategy, ranked by effective speedup, and notes."""
    if workers > FULL_MAX_WORKERS:
        rows = _replica_rows(times, model.replay.ids.size, workers)
        note = (
            f"N={workers} > {FULL_MAX_WORKERS}: rows are exact on the replayed trace for the "
            "K-sync and async families only (no Monte Carlo or simulation at this size)"
        )
        return _sorted([Ranked(r, None) for r in rows]), [note]
    scenario = DelayScenario(
        workers, model, micro_batches=micro_batches, samples=samples, seed=seed
    )
    prediction = with_families(predict(scenario))
    best = [r for r in prediction.rows if r.best or r.strategy in ("sync", "async")]
    ranked = [Ranked(r, _simulate(scenario, r)) for r in best]
    note = "recommended: the best fresh-gradient row (async and eager rows use stale gradients)"
    return _sorted(ranked), [*prediction.notes, note]


def recommend(ranked: list[Ranked]) -> Ranked:
    """The top row among fresh-gradient strategies (see the module docstring)."""
    return next(r for r in ranked if r.row.strategy in FRESH)


def reason(choice: Ranked, cost: Cost, excluded: Cost | None, persistent: list[int]) -> str:
    """One sentence on why, and on the persistent stragglers when there are any."""
    source = choice.simulated or choice.row
    text = (
        f"{row_spec(choice.row)} applies {source.effective_speedup:.2f}x the gradients per "
        f"second of sync ({source.iteration_time:.4g} s per update, {source.method}); "
        f"sync waits {cost.overhead:.4g} s per step for its slowest worker "
        f"({cost.overhead_share:.0%} of sync's {cost.iteration_time:.4g} s per step)."
    )
    if excluded is None:
        return text
    saving = cost.iteration_time - excluded.iteration_time
    who = ", ".join(str(w) for w in persistent)
    lead = "Persistent stragglers dominate: " if saving >= 0.5 * cost.overhead else ""
    return (
        f"{lead or 'Persistent stragglers: '}excluding worker(s) {who} saves {saving:.4g} s per "
        f"step ({cost.iteration_time:.4g} -> {excluded.iteration_time:.4g} s, "
        f"{saving / cost.iteration_time:.0%} of sync's time per step); fix or replace them. "
        f"Meanwhile: {text}"
    )


def _simulate(scenario: DelayScenario, row: Row) -> Row | None:
    if row.method.startswith("simulated"):
        return row
    if row.strategy == "dbw":
        return None  # a timing-only run cannot play DBW's rule
    return simulated_row(scenario, row_spec(row), row.strategy, row.k)


def _sorted(ranked: list[Ranked]) -> list[Ranked]:
    return sorted(ranked, key=lambda r: -r.effective_speedup)


def _replica_rows(times: NDArray[np.float64], trace_workers: int, workers: int) -> list[Row]:
    """sync, K-sync at its best K and async from the replayed trace, vectorised over K."""
    replicas = _replicas(trace_workers, workers)
    order = np.argsort(times, axis=1)
    ordered = np.take_along_axis(times, order, axis=1)
    rank_of = np.cumsum(replicas[order], axis=1)  # scenario workers done by each trace worker
    block = np.cumsum(replicas)
    ks = np.unique(np.concatenate([k_grid(workers), block, block[:-1] + 1]).clip(1, workers))
    column = np.stack([(rank_of < k).sum(axis=1) for k in ks], axis=1)
    kth = np.take_along_axis(ordered, column, axis=1)
    mean = kth.mean(axis=0)
    stderr = kth.std(axis=0, ddof=1) / np.sqrt(kth.shape[0])
    sync = float(mean[-1])
    effective = ks * sync / (workers * mean)
    best, _ = best_k(ks, effective, effective * stderr / mean)
    i = int(np.flatnonzero(ks == best)[0])
    rate = float((replicas / times.mean(axis=0)).sum())  # Lemma 5 with per-worker means

    def row(strategy: str, k: int, time: float, se: float) -> Row:
        return Row(strategy, k, time, se, sync / time, k * sync / (workers * time), 0.0, REPLAY)

    return [
        row("sync", workers, sync, float(stderr[-1])),
        replace(row("k-sync", int(best), float(mean[i]), float(stderr[i])), best=True),
        replace(row("k-batch-async", workers, workers / rate, 0.0), best=True),
        row("async", 1, 1 / rate, 0.0),
    ]
