"""The virtual-clock parameter-server simulator: drives a strategy's rule over simulated workers.

The engine owns the clock (``ServerTimeline``), the model versions (``Trainer``) and the
records; the strategy only answers ``plan`` / ``select`` / ``adapt``. Which gradients count is
decided by virtual arrival order, so the optimisation dynamics match the real system (DBW §4:
"the virtual time has an effect on the optimization dynamics").
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from tailtrain.sim.durations import DelaySource
from tailtrain.sim.evaluation import Evaluator
from tailtrain.sim.records import RunRecord
from tailtrain.sim.scenario import Scenario, World
from tailtrain.sim.timeline import IDLE, ServerTimeline, StepArrivals
from tailtrain.sim.trainer import Trainer
from tailtrain.strategies.base import ArrivalColumns, Plan, Selection, StepStats, Strategy

log = logging.getLogger(__name__)

Progress = Callable[[int, float], None]


@dataclass
class _Run:
    """Mutable bookkeeping of one run; lives only inside :func:`simulate`."""

    strategy: Strategy
    state: Any
    timeline: ServerTimeline
    trainer: Trainer | None
    version: int = 0
    step: int = 0


def simulate_parameter_server(
    scenario: Scenario,
    strategy: Strategy,
    seed: int,
    progress: Progress | None = None,
    *,
    task: Any = None,
    delays: DelaySource | None = None,
) -> RunRecord:
    """Run a parameter-server ``strategy``; the same inputs give the same record.

    ``task`` and ``delays`` override the scenario's task and delay process (see ``World``).
    Each job is a round trip, compute + T^c (``--comm-time``), see ``JobDurations``.
    """
    world = World.build(scenario, seed, task=task, delays=delays, round_trips=True)
    run = _Run(
        strategy=strategy,
        state=strategy.init(world.context),
        timeline=ServerTimeline(world.durations, scenario.workers),
        trainer=world.trainer,
    )
    record = RunRecord()
    evals = Evaluator(scenario.evaluation, record, run.trainer is not None)
    evals.start(lambda: scores(world, current_model(run)))
    while not world.finished(run.step, run.timeline.now):
        before = current_model(run)
        one_step(run, record, world)
        evals.after_step(
            run.step,
            run.timeline.now,
            partial(scores, world, before),
            lambda: scores(world, current_model(run)),
        )
        if progress is not None:
            progress(run.step, run.timeline.now)
    evals.finish(run.step, run.timeline.now, lambda: scores(world, current_model(run)))
    record.summary = world.summarise(strategy, record)
    return record


def one_step(run: _Run, record: RunRecord, world: World) -> None:
    plan = run.strategy.plan(run.state)
    run.timeline.begin(run.version, plan.mode, plan.accept_stale)
    got = run.timeline.collect(
        plan.k, run.version, plan.mode, plan.accept_stale, drain=plan.complete_stragglers
    )
    candidates, jobs, positions = gather(run, plan, got)
    selection = run.strategy.select(run.state, candidates)
    stats = update(run, plan, selection, candidates, jobs)
    chosen = used_indices(selection)
    used = tuple(positions[chosen].tolist())
    everything = ArrivalColumns.concat(
        [got.arrivals, candidates.take(np.flatnonzero(candidates.partial))]
    )
    run.version += 1
    step_stats = StepStats(
        step=run.step,
        version=run.version,
        time=got.close,
        k=plan.k,
        arrivals=everything,
        used=used,
        loss=stats[0],
        grad_sq_sum=stats[1],
        mean_grad_sq=stats[2],
        lr=world.lr * plan.lr_scale,
    )
    run.state = run.strategy.adapt(run.state, step_stats)
    record.add_step(step_row(plan, candidates, chosen, step_stats))
    run.step += 1
    if run.trainer is not None:
        run.trainer.retain(referenced_versions(run.timeline, run.version))


def gather(
    run: _Run, plan: Plan, got: StepArrivals
) -> tuple[ArrivalColumns, np.ndarray, np.ndarray]:
    """The step's candidates: usable arrivals, then stragglers' partial work (LGC Alg. 1)."""
    usable = np.flatnonzero(got.usable)
    fresh = got.arrivals.take(usable)
    if plan.partial_blocks <= 0:
        return fresh, got.jobs[usable], usable
    tl = run.timeline
    workers, blocks = tl.partial_work(run.version, plan.partial_blocks)
    if plan.complete_stragglers:
        blocks = np.full(workers.size, plan.partial_blocks)
    keep = blocks > 0
    workers, blocks = workers[keep], blocks[keep]
    partial = ArrivalColumns(
        workers,
        np.full(workers.size, run.version),
        tl.start[workers],
        np.minimum(tl.finish[workers], tl.now)
        if not plan.complete_stragglers
        else tl.finish[workers],
        units=blocks / plan.partial_blocks,
        partial=np.ones(workers.size, dtype=bool),
    )
    positions = np.concatenate([usable, len(got.arrivals) + np.arange(workers.size)])
    jobs = np.concatenate([got.jobs[usable], tl.job[workers]])
    return ArrivalColumns.concat([fresh, partial]), jobs, positions


def update(
    run: _Run, plan: Plan, selection: Selection, candidates: ArrivalColumns, jobs: np.ndarray
) -> tuple[float, float, float]:
    if run.trainer is None:
        nan = float("nan")
        return nan, nan, nan
    s = run.trainer.apply(run.version + 1, run.version, selection, candidates, jobs, plan.lr_scale)
    return s.loss, s.grad_sq_sum, s.mean_grad_sq


def referenced_versions(timeline: ServerTimeline, current: int) -> set[int]:
    busy = timeline.version[timeline.version != IDLE]
    return {current, *np.unique(busy).tolist()}


def used_indices(selection: Selection) -> np.ndarray:
    """Sorted indices of the candidates with a non-zero weight in this update."""
    keys = np.fromiter(selection.now.keys(), dtype=np.int64, count=len(selection.now))
    weights = np.fromiter(selection.now.values(), dtype=float, count=len(selection.now))
    return np.sort(keys[weights != 0])


def step_row(
    plan: Plan, candidates: ArrivalColumns, idx: np.ndarray, stats: StepStats
) -> dict[str, Any]:
    return {
        "step": stats.step,
        "time": stats.time,
        "k": plan.k,
        "lr": stats.lr,
        "loss": stats.loss,
        "workers": candidates.worker[idx].tolist(),
        "staleness": (stats.version - 1 - candidates.version[idx]).tolist(),
        "partial_workers": candidates.worker[candidates.partial].tolist(),
        "arrivals": len(stats.arrivals),
    }


def current_model(run: _Run) -> Any:
    """The parameters of the newest version (None when timing only)."""
    return None if run.trainer is None else run.trainer.versions[run.version]


def scores(world: World, theta: Any) -> dict[str, Any]:
    return world.task.evaluate(theta)
