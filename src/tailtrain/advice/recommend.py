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

Each forecast carries an uncertainty (:func:`uncertainty`), in three parts:

* *the replay and the trace's length*: twice the standard error of its effective speedup, from
  its replay (the simulation's batch means, or predict's Monte Carlo) and from the trace's
  length: the relative standard error of the trace's sync E[T] (batch means over its
  iterations, with the recorded T^c's), applied to the part of the speedup the trace's figures
  make, |s - 1|. Every row replays the same trace, and its speedup is a ratio to sync on it:
  an error that scales the whole trace cancels, and sync's own speedup is 1 by definition;
  what the trace's length leaves uncertain is how much a strategy gains over it.
* *run to run* (:func:`half_forecasts`): the trace cut into :data:`BLOCKS` blocks of
  consecutive iterations, each replayed on its own (its own recorded T^c) and forecast again.
  A block is a run 1/B as long, so the spread of the B forecasts over sqrt(B) is the standard
  error of the whole trace's forecast over identical runs, whatever made them differ
  (stragglers that come and go, the machine's load, T^c): the noise the replay's own figures
  cannot see, since they resample one run. Identical ``train`` runs of ``seq-lstm`` gave
  forecasts 2-4 such replay uncertainties apart (issue 23).
* *the model's own error*: :data:`MODEL_ERROR` times the speedup, the largest miss of
  predicted over realised speed-up that ``bench/bench_advise.py`` measured (the forecast
  cannot tell two strategies apart more finely than it forecasts either); none on sync, whose
  speedup is 1 by definition.

The first two are statistical and add in quadrature (as two standard errors); the model's
error adds in quadrature to them.

"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

import numpy as np
from numpy.typing import NDArray

from tailtrain.advice.cost import Cost, _replicas
from tailtrain.delays.base import DelayModel
from tailtrain.delays.comm import parse_comm_time
from tailtrain.delays.parse import parse_delay
from tailtrain.delays.trace import Trace, TraceDelay, cut_flag, replayed_comm, write_trace_rows
from tailtrain.prediction import DelayScenario, Row, best_k, k_grid, predict
from tailtrain.prediction.families import SIM_MAX_WORKERS, row_spec, simulated_row, with_families
from tailtrain.prediction.rebalance import DEMAND_SPEC  # dealt on demand: train and simulate only

FULL_MAX_WORKERS = SIM_MAX_WORKERS  #: predict + simulation up to this many workers
FRESH = ("sync", "k-sync", "k-batch-sync", "dropcompute", "local-sgd", "rebalance")
#: rebalance's rows (issue 25): its shares alone, and DropCompute's threshold on top
REBALANCE = ("rebalance", "rebalance:then=dropcompute")
REPLAY = "replay(trace, all iterations)"
#: batches of the trace's iterations for the batch-means standard error of its sync E[T]
TRACE_BATCHES = 10
#: blocks of the trace's consecutive iterations forecast each on its own (run-to-run spread)
BLOCKS = 2
#: the least iterations a block needs to be forecast on its own (fewer: no run-to-run term)
BLOCK_MIN_ITERATIONS = 5
#: the forecast's relative error: bench/bench_advise.py measured predicted over realised
#: speed-up of 0.98-1.11 (issue 23), so forecasts closer than this are not told apart
MODEL_ERROR = 0.10


@dataclass(frozen=True)
class Ranked:
    """A strategy at one setting, with its simulated figures when simulated, and the
    uncertainty of its effective speedup (module docstring)."""

    row: Row
    simulated: Row | None
    uncertainty: float = 0.0
    #: the micro-batches per step the row needs where the job has fewer (DropCompute priced
    #: on a per-step trace split in M, ``advice.units``); None: it runs the job's own steps
    micro_batches: int | None = None
    #: per-rank batch shares (rebalance priced per sample for a DDP job, ``advice.units``)
    shares: tuple[int, ...] | None = None

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
        if self.micro_batches is not None:
            out["micro_batches"] = self.micro_batches
        if self.shares is not None:
            out["shares"] = list(self.shares)
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


def uncertainty(
    row: Row, simulated: Row | None, spread: float, blocks: Sequence[float] = ()
) -> float:
    """A row's effective speedup's uncertainty (module docstring): twice the standard error
    from its replay, the trace's length (``spread``, relative, on the gain over sync) and the
    spread of its forecasts on the trace's ``blocks`` (:func:`half_forecasts`), and the
    model's own error :data:`MODEL_ERROR` on it (none on sync)."""
    source = simulated or row
    s = source.effective_speedup
    replay = source.effective_speedup_stderr
    # B blocks, each a run 1/B as long: the spread over sqrt(B) is a whole trace's error
    runs = float(np.std(blocks, ddof=1) / np.sqrt(len(blocks))) if len(blocks) > 1 else 0.0
    stat = 2 * math.hypot(replay, spread * abs(s - 1.0), runs)
    model = 0.0 if row.strategy == "sync" else MODEL_ERROR * s
    return float(math.hypot(stat, model))


def half_forecasts(
    model: TraceDelay,
    specs: Sequence[tuple[str, str, int | None]],
    workers: int,
    micro_batches: int | None,
    seed: int,
    samples: int,
    comm: float | DelayModel | None,
) -> dict[str, list[float]]:
    """Each (spec, strategy, k)'s simulated effective speedup on every one of :data:`BLOCKS`
    blocks of the trace's consecutive iterations, replayed on its own, each round paying
    ``comm`` or (None) the block's own recorded T^c; {} when a block would hold fewer than
    :data:`BLOCK_MIN_ITERATIONS` iterations (module docstring: run to run)."""
    trace = model.trace
    iterations = np.unique(trace.iteration)
    if not specs or iterations.size < BLOCKS * BLOCK_MIN_ITERATIONS:
        return {}
    found: dict[str, list[float]] = {spec: [] for spec, _, _ in specs}
    # the simulator reads a trace from its file: each block is written as one
    with TemporaryDirectory(prefix="tailtrain-advise-") as folder:
        for b, block in enumerate(np.array_split(iterations, BLOCKS)):
            keep = np.isin(trace.iteration, block)
            path = Path(folder) / f"block{b}.csv"
            _write_block(path, trace, keep)
            delay = f"trace:path={path}{cut_flag(model.cuttable)}"  # as recorded
            own = comm if comm is not None else priced_comm(replayed_comm(delay, None))
            scenario = DelayScenario(
                workers,
                parse_delay(delay),
                micro_batches=micro_batches,
                comm=own,
                samples=samples,
                seed=seed,
            )
            for spec, strategy, k in specs:
                found[spec].append(simulated_row(scenario, spec, strategy, k).effective_speedup)
    return found


def rank(
    model: TraceDelay,
    times: NDArray[np.float64],
    workers: int,
    micro_batches: int | None,
    seed: int,
    samples: int,
    comm: float | DelayModel = 0.0,
    spread: float = 0.0,
    recorded: bool = False,
) -> tuple[list[Ranked], list[str]]:
    """Best row per strategy (every Local-SGD period: the period is the choice most often
    within noise), priced with T^c ``comm``, ranked by effective speedup, and notes;
    ``spread`` is the trace's :func:`trace_spread`; ``recorded``: ``comm`` is the trace's
    recorded T^c, so each block of :func:`half_forecasts` pays its own."""
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
    if not model.cuttable:
        best = [checked_between(r) for r in best]
    simulated = [_simulate(scenario, r) for r in best]
    # run to run: only the fresh rows can be recommended, and sync is 1 on every block
    specs = [
        (row_spec(r), r.strategy, r.k)
        for r, sim in zip(best, simulated, strict=True)
        if sim is not None and r.strategy in FRESH and r.strategy != "sync"
    ]
    blocks = half_forecasts(
        model, specs, workers, micro_batches, seed, samples, None if recorded else comm
    )
    ranked = [
        Ranked(r, sim, uncertainty(r, sim, spread, blocks.get(row_spec(r), ())))
        for r, sim in zip(best, simulated, strict=True)
    ]
    note = (
        "recommended: the simplest fresh-gradient row within the forecasts' uncertainty of "
        "the best one (async and eager rows use stale gradients)"
    )
    # a note that opens with a strategy's name ("rebalance: ...") is about that row: none
    # when the ranking has no such row, or the text would quote a figure the table lacks
    unranked = {r.strategy for r in prediction.rows} - {r.strategy for r in best}
    notes = [n for n in prediction.notes if n.partition(":")[0] not in unranked]
    return _sorted(ranked), [*notes, note]


def checked_between(row: Row) -> Row:
    """A DropCompute row for units a threshold cannot cut (``DelayModel.cuttable``): tau
    checked between them (``stop=between``). Its worker leaves as late as preempting such
    units would (the one in flight runs to its end) and counts that unit too; it is what DDP's
    hook and StragglerStep do (``integrate.rounds``), and ``train`` runs it. ``predict``'s
    figures still stop at tau; the simulated ones follow the spec."""
    if row.strategy != "dropcompute":
        return row
    return replace(row, spec=f"{row_spec(row)},stop=between")


def _rebalance_rows(rows: list[Row], micro_batches: int | None) -> list[Row]:
    """predict's rebalance row as each of :data:`REBALANCE`'s specs (the combination's
    predicted figures are the shares' alone; its threshold is simulated) and its
    :data:`DEMAND_SPEC` row, where shares can move: with M > 1 micro-batches (a per-iteration
    trace without --micro-batches has none)."""
    found = [r for r in rows if r.strategy == "rebalance" and r.spec is None]
    if not found or (micro_batches or 1) < 2:
        return []
    demand = [r for r in rows if r.spec == DEMAND_SPEC]
    return [*(replace(found[0], spec=spec) for spec in REBALANCE), *demand]


def simplicity(ranked: Ranked) -> tuple[bool, int, float]:
    """How far a fresh-gradient row is from sync: whether it needs micro-batches the job
    does not have (a remedy that needs none is preferred at equal gain), its strategy's
    place in :data:`FRESH`, then its setting's distance (fewer workers waited for, more work
    dropped, a longer period, a threshold on top of the shares: larger)."""
    row = ranked.row
    if row.strategy == "rebalance":
        distance = float((*REBALANCE, DEMAND_SPEC).index(row_spec(row)))
    elif row.strategy == "local-sgd":
        distance = float(row_spec(row).rpartition("=")[2])
    elif row.strategy == "dropcompute":
        distance = row.drop_rate or 0.0
    else:
        distance = -float(row.k)
    return ranked.micro_batches is not None, FRESH.index(row.strategy), distance


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
    same ranks' work every step, so their data is under-represented in every update). Of
    its rows the simplest comes first, unless ``DEMAND_SPEC`` is faster than it
    (:func:`faster`): dealing on demand needs no shares and no threshold, only ``train``'s
    store. Where sync itself ties (the simplest, first), no remedy is faster than the job as it
    runs beyond the forecasts' uncertainty, and sync stays first: a newcomer's job whose slow
    rank lost 31 ms a step that no share moves was advised rebalance at 1.056x (+-0.106)
    over a tying sync, and ran 0.977x."""
    if not persistent_dominate or tied[0].row.strategy == "sync":
        return tied
    tied = sorted(tied, key=lambda r: r.row.strategy != "rebalance")  # stable: simplest first
    demand = next((r for r in tied if row_spec(r.row) == DEMAND_SPEC), None)
    if demand is None or not faster(demand, tied[0]):
        return tied
    return [demand, *(r for r in tied if r is not demand)]


def faster(one: Ranked, other: Ranked) -> bool:
    """Whether ``one`` applies more gradients per second than ``other`` both as predicted
    and, where both were simulated, as simulated (the combination's predicted figure is its
    shares' alone: the simulation is the like-for-like comparison)."""
    predicted = one.row.effective_speedup > other.row.effective_speedup
    if one.simulated is None or other.simulated is None:
        return predicted
    return predicted and one.simulated.effective_speedup > other.simulated.effective_speedup


def recommend(ranked: list[Ranked], persistent_dominate: bool = False) -> list[Ranked]:
    """The remedies advise offers, best first: the :func:`equivalents` of the top
    fresh-gradient row, simplest first (module docstring), rebalance first where persistent
    stragglers dominate (:func:`rebalanced`), and then rebalance on the job's whole batches
    before a remedy that needs micro-batches the job does not have
    (:func:`whole_batch_rebalance`). The first is the recommendation; identical runs get the
    same advice."""
    tied = rebalanced(equivalents(ranked), persistent_dominate)
    whole = whole_batch_rebalance(ranked) if persistent_dominate else None
    if whole is None or tied[0].micro_batches is None:
        return tied
    return [whole, *(r for r in tied if r is not whole)]


def whole_batch_rebalance(ranked: list[Ranked]) -> Ranked | None:
    """Rebalance's best row that needs no micro-batches and beats sync beyond its
    uncertainty, or None. Where persistent stragglers dominate it is preferred to a remedy
    that would split the job's batch in micro-batches it does not have: that forecast
    leaves out the cost of each extra micro-batch, which a trace of whole steps cannot show
    (measured about 1 ms a micro-batch on a CPU, ``bench/bench_loop.py``), while
    rebalance's step is the job's own."""
    rows = [
        r
        for r in ranked
        if r.row.strategy == "rebalance"
        and r.micro_batches is None
        and r.effective_speedup - r.uncertainty > 1.0
    ]
    return max(rows, key=lambda r: r.effective_speedup, default=None)


def reason(
    choice: Ranked,
    cost: Cost,
    excluded: Cost | None,
    persistent: list[int],
    unit: str = "gradients",
) -> str:
    """One sentence on why, and on the persistent stragglers when there are any; ``unit``:
    what the job applies (``samples`` where the trace counts them, ``advice.units``)."""
    source = choice.simulated or choice.row
    split = "" if choice.micro_batches is None else f" at M={choice.micro_batches} micro-batches"
    text = (
        f"{row_spec(choice.row)}{split} applies {choice.effective_speedup:.2f}x "
        f"(+-{choice.uncertainty:.2f}) the {unit} per "
        f"second of sync ({source.iteration_time:.4g} s per update, {source.method}); "
        f"sync waits {cost.overhead:.4g} s per step for its slowest worker "
        f"({cost.overhead_share:.0%} of sync's {cost.iteration_time:.4g} s per step)."
    )
    if excluded is None:
        return text
    saving = cost.iteration_time - excluded.iteration_time
    who = ", ".join(str(w) for w in persistent)
    lead = "Persistent stragglers dominate: " if dominate(cost, excluded) else ""
    # the step is shorter without them, but their samples go with them: say both, or the
    # saving reads as a gain beside a job without them that applies fewer samples
    found = (
        f"{lead or 'Persistent stragglers: '}sync's step without worker(s) {who} is "
        f"{saving:.4g} s shorter ({cost.iteration_time:.4g} -> {excluded.iteration_time:.4g} s, "
        f"{saving / cost.iteration_time:.0%} of its time), their samples gone with them; "
    )
    if choice.row.strategy == "rebalance":
        simulated = (
            ""
            if choice.simulated is None
            else (f", simulated {choice.simulated.effective_speedup:.2f}x")
        )
        spec = row_spec(choice.row)
        # the combination drops what its threshold cuts (unless defer=true carries it)
        cuts = "then=dropcompute" in spec and "defer=true" not in spec
        what = (
            "deals the shares and cuts only the noise on top at DropCompute's threshold "
            "(predicted for the shares alone"
            if cuts
            else "drops no sample (predicted"
        )
        how = "give each rank the share of the global batch it can finish"
        shares = "" if choice.shares is None else f" with shares {list(choice.shares)}"
        if spec == DEMAND_SPEC:
            how = "deal the global batch on demand, each micro-batch to whichever rank asks next"
            what = "keeps every rank busy and drops no sample (predicted"
        return (
            f"{found}rather than fix or replace them, {how}: {spec}{shares} {what} "
            f"{choice.row.effective_speedup:.2f}x the {unit} per second of sync{simulated}). "
            f"{text}"
        )
    return f"{found}fix or replace them. Meanwhile: {text}"


def _write_block(path: Path, trace: Trace, keep: NDArray[np.bool_]) -> None:
    """The rows ``keep`` of ``trace`` (censored rows already completed) as a trace file."""
    columns = [trace.iteration[keep], trace.worker[keep]]
    if trace.micro_batch is not None:
        columns.append(trace.micro_batch[keep])
    columns.append(trace.seconds[keep])
    if trace.noncompute is not None:
        columns.append(trace.noncompute[keep])
    table = np.column_stack(columns).astype(np.float64)
    charged = trace.noncompute is not None
    write_trace_rows(path, table, trace.micro_batch is not None, noncompute=charged)


def priced_comm(spec: str | None) -> float | DelayModel:
    """T^c as ``predict`` takes it from a ``--comm-time`` spec: seconds when constant, else
    the model; 0 for none."""
    model = parse_comm_time(spec)
    if model is None:
        return 0.0
    return float(model.mean) if model.var == 0 else model


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
