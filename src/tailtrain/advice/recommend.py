"""What to do: every strategy at its best setting, by theory and by a timing-only simulation
replaying the trace, ranked, and one recommendation with its reason.

Rows come from ``predict`` (the trace replayed per worker: Monte Carlo on its iterations) and
``prediction.families`` (Local-SGD, eager-SGD, DBW) up to :data:`FULL_MAX_WORKERS` workers; each
best row is then replayed by ``tailtrain.sim.run.simulate`` (``task=none``) and ranked by the
simulated effective speedup (gradients applied per second relative to sync). Above that size
the rows are exact on the replayed trace for K-sync (k-th smallest of the replicas) and
K-batch-async / async (renewal rate K / sum_n 1/E[X_n], slow-and-stale Lemma 5).

Every row is priced with the trace's communication: the rounds' recorded noncompute seconds
(``delays.trace``, ``of=noncompute``) or ``--comm-time``, once per update (Local-SGD pays it
once per H local steps), so a strategy that communicates less is credited for it.

Each forecast carries an uncertainty (:func:`uncertainty`): twice the standard error of its
effective speedup, from its replay (the simulation's batch means, or predict's Monte Carlo)
and from the trace's length: the relative standard error of the trace's sync E[T] (batch
means over its iterations, with the recorded T^c's), applied to the part of the speedup the
trace's figures make, |s - 1|. Every row replays the same trace, and its speedup is a ratio
to sync on it: an error that scales the whole trace cancels, and sync's own speedup is 1 by
definition; what the trace's length leaves uncertain is how much a strategy gains over it.

The recommendation (:func:`recommend`) is stable under that noise: among the strategies whose
updates use fresh gradients only (:data:`FRESH`; the asynchronous and eager rows buy throughput
with stale gradients, which slow-and-stale Theorem 3 charges in convergence, so a rate alone
cannot rank them fairly), every row whose effective speedup is within the uncertainty of the
difference (hypot of the two) of the top fresh row's is *equivalent* to it, and of those the
simplest is chosen (:func:`simplicity`): first in :data:`FRESH` order (sync, K-sync,
K-batch-sync, DropCompute, Local-SGD), then the setting nearest sync (the larger K, the lower
drop rate, the shorter period). Identical runs whose traces differ by noise thus get the same
advice unless one strategy is better beyond the forecasts' uncertainty.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from numpy.typing import NDArray

from tailtrain.advice.cost import Cost, _replicas
from tailtrain.delays.base import DelayModel
from tailtrain.delays.trace import TraceDelay
from tailtrain.prediction import DelayScenario, Row, best_k, k_grid, predict
from tailtrain.prediction.families import SIM_MAX_WORKERS, row_spec, simulated_row, with_families

FULL_MAX_WORKERS = SIM_MAX_WORKERS  #: predict + simulation up to this many workers
FRESH = ("sync", "k-sync", "k-batch-sync", "dropcompute", "local-sgd", "rebalance")
#: rebalance's rows (issue 25): its shares alone, and DropCompute's threshold on top
REBALANCE = ("rebalance", "rebalance:then=dropcompute")
REPLAY = "replay(trace, all iterations)"
#: batches of the trace's iterations for the batch-means standard error of its sync E[T]
TRACE_BATCHES = 10


@dataclass(frozen=True)
class Ranked:
    """A strategy at one setting, with its simulated figures when simulated, and the
    uncertainty of its effective speedup (module docstring)."""

    row: Row
    simulated: Row | None
    uncertainty: float = 0.0

    @property
    def effective_speedup(self) -> float:
        source = self.simulated or self.row
        return source.effective_speedup

    @property
    def iteration_time(self) -> float:
        return (self.simulated or self.row).iteration_time

    def as_dict(self) -> dict[str, Any]:
        out = {**self.row.as_dict(), "spec": row_spec(self.row)}
        if self.simulated is not None:
            out["simulated_iteration_time"] = self.simulated.iteration_time
            out["simulated_effective_speedup"] = self.simulated.effective_speedup
            out["simulated_method"] = self.simulated.method
        out["effective_speedup_uncertainty"] = self.uncertainty
        return out


def trace_spread(times: NDArray[np.float64], comm: NDArray[np.float64]) -> float:
    """Relative standard error of the trace's sync E[T] from its length: batch means (its
    iterations are dependent) of max_n t[i, n], and the recorded T^c's own (``comm``, none
    when T^c is not from the trace)."""
    slowest = times.max(axis=1)
    batches = [b.mean() for b in np.array_split(slowest, min(TRACE_BATCHES, slowest.size))]
    compute = np.std(batches, ddof=1) / np.sqrt(len(batches)) if len(batches) > 1 else 0.0
    rounds = np.std(comm, ddof=1) / np.sqrt(comm.size) if comm.size > 1 else 0.0
    total = slowest.mean() + (comm.mean() if comm.size else 0.0)
    return float(np.hypot(compute, rounds) / total) if total > 0 else 0.0


def uncertainty(row: Row, simulated: Row | None, spread: float) -> float:
    """Twice the standard error of a row's effective speedup: its replay's and the trace's
    length's (``spread``, relative, on the gain over sync: module docstring) together."""
    source = simulated or row
    replay = source.effective_speedup_stderr
    return float(2 * np.hypot(replay, spread * abs(source.effective_speedup - 1.0)))


def rank(
    model: TraceDelay,
    times: NDArray[np.float64],
    workers: int,
    micro_batches: int | None,
    seed: int,
    samples: int,
    comm: float | DelayModel = 0.0,
    spread: float = 0.0,
) -> tuple[list[Ranked], list[str]]:
    """Best row per strategy (every Local-SGD period: the period is the choice most often
    within noise), priced with T^c ``comm``, ranked by effective speedup, and notes;
    ``spread`` is the trace's :func:`trace_spread`."""
    comm_mean = comm if isinstance(comm, (int, float)) else comm.mean
    if workers > FULL_MAX_WORKERS:
        rows = _replica_rows(times, model.replay.ids.size, workers, comm_mean)
        note = (
            f"N={workers} > {FULL_MAX_WORKERS}: rows are exact on the replayed trace for the "
            "K-sync and async families only (no Monte Carlo or simulation at this size)"
        )
        ranked = [Ranked(r, None, uncertainty(r, None, spread)) for r in rows]
        return _sorted(ranked), [note]
    scenario = DelayScenario(
        workers, model, micro_batches=micro_batches, comm=comm, samples=samples, seed=seed
    )
    prediction = with_families(predict(scenario))
    best = [r for r in prediction.rows if r.best or r.strategy in ("sync", "async", "local-sgd")]
    best += _rebalance_rows(prediction.rows, micro_batches)
    ranked = []
    for r in best:
        simulated = _simulate(scenario, r)
        ranked.append(Ranked(r, simulated, uncertainty(r, simulated, spread)))
    note = (
        "recommended: the simplest fresh-gradient row within the forecasts' uncertainty of "
        "the best one (async and eager rows use stale gradients)"
    )
    # a note that opens with a strategy's name ("rebalance: ...") is about that row: none
    # when the ranking has no such row, or the text would quote a figure the table lacks
    unranked = {r.strategy for r in prediction.rows} - {r.strategy for r in best}
    notes = [n for n in prediction.notes if n.partition(":")[0] not in unranked]
    return _sorted(ranked), [*notes, note]


def _rebalance_rows(rows: list[Row], micro_batches: int | None) -> list[Row]:
    """predict's rebalance row as each of :data:`REBALANCE`'s specs (the combination's
    predicted figures are the shares' alone; its threshold is simulated), where shares can
    move: with M > 1 micro-batches (a per-iteration trace without --micro-batches has none)."""
    found = [r for r in rows if r.strategy == "rebalance"]
    if not found or (micro_batches or 1) < 2:
        return []
    return [replace(found[0], spec=spec) for spec in REBALANCE]


def simplicity(ranked: Ranked) -> tuple[int, float]:
    """How far a fresh-gradient row is from sync: its strategy's place in :data:`FRESH`,
    then its setting's distance (fewer workers waited for, more work dropped, a longer
    period, a threshold on top of the shares: larger)."""
    row = ranked.row
    if row.strategy == "rebalance":
        distance = float(REBALANCE.index(row_spec(row)))
    elif row.strategy == "local-sgd":
        distance = float(row_spec(row).rpartition("=")[2])
    elif row.strategy == "dropcompute":
        distance = row.drop_rate or 0.0
    else:
        distance = -float(row.k)
    return FRESH.index(row.strategy), distance


def equivalents(ranked: list[Ranked]) -> list[Ranked]:
    """The fresh-gradient rows whose effective speedup is within the uncertainty of the
    difference of the top fresh row's (the top one included), simplest first."""
    fresh = [r for r in ranked if r.row.strategy in FRESH]
    top = max(fresh, key=lambda r: r.effective_speedup)

    def tied(r: Ranked) -> bool:
        gap = top.effective_speedup - r.effective_speedup
        return gap <= np.hypot(top.uncertainty, r.uncertainty) + 1e-12 * top.effective_speedup

    return sorted((r for r in fresh if tied(r)), key=simplicity)


def dominate(cost: Cost, excluded: Cost | None) -> bool:
    """Whether persistent stragglers dominate sync's wait: excluding them saves at least half
    of it (``excluded``: sync's cost without them; None: there are none)."""
    return excluded is not None and (
        cost.iteration_time - excluded.iteration_time >= 0.5 * cost.overhead
    )


def rebalanced(tied: list[Ranked], persistent_dominate: bool) -> list[Ranked]:
    """The :func:`equivalents`, rebalance's rows first where persistent stragglers dominate:
    of the remedies that tie, it alone keeps every sample (DropCompute and K-sync drop the
    same ranks' work every step, so their data is under-represented in every update)."""
    if not persistent_dominate:
        return tied
    return sorted(tied, key=lambda r: r.row.strategy != "rebalance")  # stable: simplest first


def recommend(ranked: list[Ranked]) -> Ranked:
    """The simplest of the :func:`equivalents` of the top fresh-gradient row (module
    docstring): identical runs get the same advice."""
    return equivalents(ranked)[0]


def reason(choice: Ranked, cost: Cost, excluded: Cost | None, persistent: list[int]) -> str:
    """One sentence on why, and on the persistent stragglers when there are any."""
    source = choice.simulated or choice.row
    text = (
        f"{row_spec(choice.row)} applies {source.effective_speedup:.2f}x "
        f"(+-{choice.uncertainty:.2f}) the gradients per "
        f"second of sync ({source.iteration_time:.4g} s per update, {source.method}); "
        f"sync waits {cost.overhead:.4g} s per step for its slowest worker "
        f"({cost.overhead_share:.0%} of sync's {cost.iteration_time:.4g} s per step)."
    )
    if excluded is None:
        return text
    saving = cost.iteration_time - excluded.iteration_time
    who = ", ".join(str(w) for w in persistent)
    lead = "Persistent stragglers dominate: " if dominate(cost, excluded) else ""
    found = (
        f"{lead or 'Persistent stragglers: '}excluding worker(s) {who} saves {saving:.4g} s per "
        f"step ({cost.iteration_time:.4g} -> {excluded.iteration_time:.4g} s, "
        f"{saving / cost.iteration_time:.0%} of sync's time per step); "
    )
    if choice.row.strategy == "rebalance":
        simulated = (
            ""
            if choice.simulated is None
            else (f", simulated {choice.simulated.effective_speedup:.2f}x")
        )
        return (
            f"{found}rather than fix or replace them, give each rank the share of the global "
            f"batch it can finish: {row_spec(choice.row)} drops no sample (predicted "
            f"{choice.row.effective_speedup:.2f}x the gradients per second of sync{simulated}). "
            f"{text}"
        )
    return f"{found}fix or replace them. Meanwhile: {text}"


def _simulate(scenario: DelayScenario, row: Row) -> Row | None:
    if row.method.startswith("simulated"):
        return row
    if row.strategy == "dbw":
        return None  # a timing-only run cannot play DBW's rule
    return simulated_row(scenario, row_spec(row), row.strategy, row.k)


def _sorted(ranked: list[Ranked]) -> list[Ranked]:
    return sorted(ranked, key=lambda r: -r.effective_speedup)


def _replica_rows(
    times: NDArray[np.float64], trace_workers: int, workers: int, comm: float = 0.0
) -> list[Row]:
    """sync, K-sync at its best K and async from the replayed trace, vectorised over K; an
    update pays ``comm`` seconds of T^c on top of its K-th arrival (async: per job)."""
    replicas = _replicas(trace_workers, workers)
    order = np.argsort(times, axis=1)
    ordered = np.take_along_axis(times, order, axis=1)
    rank_of = np.cumsum(replicas[order], axis=1)  # scenario workers done by each trace worker
    block = np.cumsum(replicas)
    ks = np.unique(np.concatenate([k_grid(workers), block, block[:-1] + 1]).clip(1, workers))
    column = np.stack([(rank_of < k).sum(axis=1) for k in ks], axis=1)
    kth = np.take_along_axis(ordered, column, axis=1)
    mean = kth.mean(axis=0) + comm
    stderr = kth.std(axis=0, ddof=1) / np.sqrt(kth.shape[0])
    sync = float(mean[-1])
    effective = ks * sync / (workers * mean)
    best, _ = best_k(ks, effective, effective * stderr / mean)
    i = int(np.flatnonzero(ks == best)[0])
    rate = float((replicas / (times.mean(axis=0) + comm)).sum())  # Lemma 5, per-worker means

    def row(strategy: str, k: int, time: float, se: float) -> Row:
        return Row(strategy, k, time, se, sync / time, k * sync / (workers * time), 0.0, REPLAY)

    return [
        row("sync", workers, sync, float(stderr[-1])),
        replace(row("k-sync", int(best), float(mean[i]), float(stderr[i])), best=True),
        replace(row("k-batch-async", workers, workers / rate, 0.0), best=True),
        row("async", 1, 1 / rate, 0.0),
    ]
