"""The virtual-clock eager-SGD simulator: partial allreduce rounds over P processes.

One round is one collective (eager-SGD §5, Fig. 7; §6.1's ADS(t) objects):

1. Each process calls the round's collective when its gradient is done. A process whose
   step is behind (a round completed while it computed) is late: it puts its gradient in its
   send buffer, adopts the latest result only (a process more than one round behind misses
   the others, §5) and starts its next gradient at once; that next gradient's call is its
   call of this round.
2. :func:`~tailtrain.sim.collectives.resolve_round` gives the activation (solo, majority,
   quorum, or the synchronous allreduce), its reach after ⌈log2 P⌉ hops and the completion.
3. Processes that called before the activation reached them are active: they contribute
   their fresh gradient plus their buffer and wait for the result. The others contribute the
   buffer the activation finds (stale gradients, or nothing). A process that calls after the
   activation but before completion waits too; its gradient goes to its buffer.
4. The rule weighs the contributions (``select``); everyone who waited adopts the result,
   ``w <- w - lr * sum_i weight_i g_i``, and starts its next gradient.

Gradients are computed only when a collective delivers them, grouped by model copy.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import torch

from tailtrain.network import NetworkModel, parse_network
from tailtrain.sim.collectives import CommTimes, Network, RoundTiming, resolve_round
from tailtrain.sim.durations import DelaySource
from tailtrain.sim.eager_models import Gradients, ModelStore
from tailtrain.sim.eager_processes import Processes, SendBuffers, Work
from tailtrain.sim.engine import Progress
from tailtrain.sim.evaluation import Evaluator
from tailtrain.sim.records import RunRecord
from tailtrain.sim.scenario import Scenario, World
from tailtrain.strategies.base import ArrivalColumns, Selection, StepStats, Strategy
from tailtrain.strategies.eager import RoundPlan

log = logging.getLogger(__name__)


@dataclass
class _Run:
    """Mutable bookkeeping of one run; lives only inside :func:`simulate_eager`."""

    world: World
    strategy: Strategy
    state: Any
    procs: Processes
    buffers: SendBuffers
    models: ModelStore | None
    comm: CommTimes
    network: NetworkModel
    round: int = 0
    now: float = 0.0
    last_update: torch.Tensor | None = None  # the latest result, what a late process adopts
    last_scale: float = 0.0


@dataclass(frozen=True)
class _Round:
    """What one round did, for the rule's statistics and the record."""

    plan: RoundPlan
    timing: RoundTiming
    contributions: Work  # fresh gradients of the active processes first, then buffers
    calls: Work  # every call of this round, each gradient once: active, late, waiting
    used: tuple[int, ...]  # the calls whose gradient entered this round's update
    selection: Selection
    grads: Gradients | None
    nap: int


def simulate_eager(
    scenario: Scenario,
    strategy: Strategy,
    seed: int,
    progress: Progress | None = None,
    *,
    task: Any = None,
    delays: DelaySource | None = None,
) -> RunRecord:
    """Run an eager-SGD ``strategy``; the same inputs give the same record.

    ``task`` and ``delays`` override the scenario's task and delay process (see ``World``).
    """
    world = World.build(scenario, seed, task=task, delays=delays)
    run = _start(world, strategy, seed)
    record = RunRecord()
    evals = Evaluator(scenario.evaluation, record, run.models is not None)
    evals.start(lambda: _scores(run, _average_model(run)))
    while not world.finished(run.round, run.now):
        before = _average_model(run)
        _one_round(run, record)
        evals.after_step(
            run.round,
            run.now,
            partial(_scores, run, before),
            lambda: _scores(run, _average_model(run)),
        )
        if progress is not None:
            progress(run.round, run.now)
    evals.finish(run.round, run.now, lambda: _scores(run, _average_model(run)))
    record.summary = {**world.summarise(strategy, record), **_summary(record)}
    return record


def _start(world: World, strategy: Strategy, seed: int) -> _Run:
    n = world.scenario.workers
    procs = Processes(world.durations, n)
    procs.launch(np.arange(n), np.zeros(n))
    return _Run(
        world=world,
        strategy=strategy,
        state=strategy.init(world.context),
        procs=procs,
        buffers=SendBuffers(),
        models=None if world.trainer is None else ModelStore(world.trainer),
        comm=CommTimes(world.scenario.comm_time, seed),
        network=parse_network(world.scenario.network),
    )


def _one_round(run: _Run, record: RunRecord) -> None:
    plan: RoundPlan = run.strategy.plan(run.state)
    done = _play(run, plan)
    stats = _stats(run, done)
    run.state = run.strategy.adapt(run.state, stats)
    record.add_step(_row(run, done, stats))
    run.now = float(done.timing.complete)
    run.round += 1
    if run.models is not None:
        run.models.retain(np.concatenate([run.procs.model, run.buffers.models()]))


def _play(run: _Run, plan: RoundPlan) -> _Round:
    """Resolve the round's calls, deliver the contributions and let the waiting adopt."""
    procs, r = run.procs, run.round
    behind = np.flatnonzero(procs.step < r)
    took = procs.next_durations(behind, procs.ready[behind])
    calls = procs.ready.copy()
    calls[behind] += took
    comm = run.comm.next() * (2 if plan.average_models else 1)  # a model sync is a 2nd allreduce
    network = Network(run.network.hop, comm + run.network.overhead)
    timing = resolve_round(calls, plan.collective, network, k=plan.k, initiator=plan.initiator)
    complete, reach = float(timing.complete), float(timing.reach)
    late = _arrive_late(run, behind, took, complete)
    on_time = procs.step == r
    active = np.flatnonzero(on_time & timing.active)
    waiting = np.flatnonzero(on_time & ~timing.active & (procs.ready <= complete))
    fresh = procs.in_flight(active)
    contributions = Work.concat([fresh, run.buffers.pop_until(reach)])
    selection = run.strategy.select(run.state, _arrivals(contributions))
    grads = _deliver(run, plan, contributions, selection)
    parked = procs.in_flight(waiting)
    run.buffers.put(parked, procs.ready[waiting])
    _adopt(run, np.concatenate([active, waiting]), complete, plan)
    calls = Work.concat([fresh, late, parked])
    used = (*range(active.size), *(active.size + np.flatnonzero(late.finish <= reach)).tolist())
    return _Round(plan, timing, contributions, calls, used, selection, grads, int(active.size))


def _arrive_late(run: _Run, behind: np.ndarray, took: np.ndarray, complete: float) -> Work:
    """Processes that find a newer result than their step: buffer, adopt it, restart."""
    procs = run.procs
    late = procs.ready[behind] < complete
    who = behind[late]
    work = procs.in_flight(who)
    run.buffers.put(work, procs.ready[who])
    if run.models is not None and run.last_update is not None:
        procs.model[who] = run.models.adopt(procs.model[who], run.last_update, run.last_scale)
    procs.step[who] = run.round
    procs.launch(who, procs.ready[who].copy(), took[late])
    return work


def _deliver(run: _Run, plan: RoundPlan, work: Work, selection: Selection) -> Gradients | None:
    """Compute the delivered gradients and the round's result ``sum_i weight_i g_i``."""
    run.last_scale = run.world.lr * plan.lr_scale
    if run.models is None:
        return None
    grads = run.models.gradients(work)
    weights = np.zeros(len(work))
    weights[list(selection.now)] = list(selection.now.values())
    run.last_update = torch.as_tensor(weights, dtype=grads.grads.dtype) @ grads.grads
    return grads


def _adopt(run: _Run, who: np.ndarray, complete: float, plan: RoundPlan) -> None:
    """Everyone who waited takes the result at ``complete`` and starts the next gradient."""
    procs = run.procs
    if run.models is not None:
        procs.model[who] = run.models.adopt(procs.model[who], run.last_update, run.last_scale)
        if plan.average_models:
            procs.model[:] = run.models.average(procs.model)
    procs.step[who] = run.round + 1
    procs.launch(who, np.full(who.size, complete))


def _arrivals(work: Work) -> ArrivalColumns:
    """Contributions as the rule sees them: ``version`` is the step a gradient was made at."""
    return ArrivalColumns(work.worker, work.step, work.start, work.finish)


def _stats(run: _Run, done: _Round) -> StepStats:
    """The round's calls (each gradient once, for DBW's round-trip samples) and scalars over
    its fresh gradients (DBW's gain estimator)."""
    loss = grad_sq_sum = mean_grad_sq = math.nan
    if done.grads is not None and done.nap > 0:
        fresh = done.grads.grads[: done.nap]
        loss = float(done.grads.losses[: done.nap].mean())
        grad_sq_sum = float((fresh * fresh).sum())
        mean_grad_sq = float(fresh.mean(0).square().sum())
    return StepStats(
        step=run.round,
        version=run.round + 1,
        time=float(done.timing.complete),
        k=done.plan.k,
        arrivals=_arrivals(done.calls),
        used=done.used,
        loss=loss,
        grad_sq_sum=grad_sq_sum,
        mean_grad_sq=mean_grad_sq,
        lr=run.last_scale,
    )


def _row(run: _Run, done: _Round, stats: StepStats) -> dict[str, Any]:
    work = done.contributions
    return {
        "step": stats.step,
        "time": stats.time,
        "k": done.nap,
        "lr": stats.lr,
        "loss": stats.loss,
        "workers": work.worker.tolist(),
        "staleness": (run.round - work.step).tolist(),
        "nap": done.nap,
        "quorum": done.plan.k,
        "collective": done.plan.collective.value,
        "initiator": int(done.timing.initiator),
        "model_sync": done.plan.average_models,
        "models": 1 if run.models is None else run.models.distinct(run.procs.model),
        "arrivals": len(stats.arrivals),
    }


def _average_model(run: _Run) -> Callable[[], torch.Tensor] | None:
    """The processes' average model (what a synchronisation would give), on demand."""
    return None if run.models is None else run.models.mean_later(run.procs.model)


def _scores(run: _Run, model: Callable[[], torch.Tensor] | None) -> dict[str, Any]:
    assert model is not None
    return run.world.task.evaluate(model())


def _summary(record: RunRecord) -> dict[str, float]:
    if not record.steps:
        return {}
    stale = [s for row in record.steps for s in row["staleness"]]
    return {
        "mean_nap": float(record.column("nap").mean()),
        "mean_staleness": float(np.mean(stale)) if stale else 0.0,
        "max_staleness": int(max(stale, default=0)),
    }
