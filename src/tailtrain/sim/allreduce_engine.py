"""The virtual-clock simulator of synchronous allreduce training: DropCompute and Local-SGD.

Every round all N workers start together, compute their units under the plan's threshold
(``sim.allreduce_timing``), then join one allreduce. The strategy answers ``plan`` (tau, M,
H, compensation), ``select`` (each worker's weight) and ``adapt`` (calibration, DropCompute
Algorithm 2); the engine owns the clock, the model (``sim.allreduce_learner``) and the
records. With ``--task none`` it only keeps time, vectorised over workers and micro-batches.

Every worker joins every allreduce (``Plan.k`` is not used); a row's ``k`` counts the workers
that completed at least one unit and ``workers`` those with a non-zero weight (staleness 0).
Rows carry the parameter-server engine's keys (step, time, k, lr, loss, workers, staleness)
plus: threshold, micro_batches (M), local_steps (H), completed (units done per worker),
drop_rate, s_eff (Algorithm 2's S_i on this round's draws), compute_time, comm_time and
sync_time (what the round would have taken without a threshold, T_i + T^c_i).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from tailtrain.delays import DelayProcess, parse_delay, parse_pattern
from tailtrain.delays.comm import parse_comm_time
from tailtrain.sim.allreduce_learner import RoundLearner
from tailtrain.sim.allreduce_timing import RoundClock, Stops, measured, stop_rule
from tailtrain.sim.durations import DelaySource
from tailtrain.sim.engine import Progress
from tailtrain.sim.evaluation import Evaluator
from tailtrain.sim.records import RunRecord
from tailtrain.sim.scenario import Scenario, World
from tailtrain.strategies.base import ArrivalColumns, Plan, Selection, StepStats, Strategy


@dataclass
class _Run:
    """Mutable bookkeeping of one run; lives only inside :func:`simulate_allreduce`."""

    strategy: Strategy
    state: Any
    clock: RoundClock
    learner: RoundLearner | None
    n: int
    micro_batches: int
    now: float = 0.0
    step: int = 0


def simulate_allreduce(
    scenario: Scenario,
    strategy: Strategy,
    seed: int,
    progress: Progress | None = None,
    *,
    task: Any = None,
    delays: DelaySource | None = None,
) -> RunRecord:
    """Run an allreduce ``strategy``; the same inputs give the same record.

    ``task`` and ``delays`` override the scenario's task and delay process (as in ``World``).
    """
    process = delays or build_process(scenario, strategy, seed)
    world = World.build(scenario, seed, task=task, delays=process)
    run = _Run(
        strategy=strategy,
        state=strategy.init(world.context),
        clock=RoundClock(process, parse_comm_time(scenario.comm_time), seed),
        learner=build_learner(world, seed),
        n=scenario.workers,
        micro_batches=scenario.micro_batches or 1,
    )
    record = RunRecord()
    evals = Evaluator(scenario.evaluation, record, run.learner is not None)
    evals.start(lambda: world.task.evaluate(run.learner.theta))
    while not finished(world, run, plan := strategy.plan(run.state)):
        before = None if run.learner is None else run.learner.theta
        one_round(run, plan, record, world)
        evals.after_step(
            run.step,
            run.now,
            partial(world.task.evaluate, before),
            lambda: world.task.evaluate(run.learner.theta),
        )
        if progress is not None:
            progress(run.step, run.now)
    evals.finish(run.step, run.now, lambda: world.task.evaluate(run.learner.theta))
    record.summary = {**world.summarise(strategy, record), **summarise(record)}
    return record


def build_process(scenario: Scenario, strategy: Strategy, seed: int) -> DelayProcess:
    """The seeded delay process, with room for the most micro-batches the strategy may ask."""
    m = strategy.micro_batch_capacity(scenario.micro_batches)
    delay, pattern = parse_delay(scenario.delay), parse_pattern(scenario.pattern)
    return DelayProcess(delay, pattern, seed, scenario.workers, m)


def build_learner(world: World, seed: int) -> RoundLearner | None:
    if world.trainer is None:
        return None
    partition = world.trainer.partition
    return RoundLearner(world.task, partition, world.lr, seed, world.scenario.workers)


def finished(world: World, run: _Run, plan: Plan) -> bool:
    """The scenario's budget; an iteration budget stretched by ``plan.iteration_scale``."""
    iterations = world.scenario.iterations
    if iterations is None:
        return run.now >= world.scenario.time_budget
    return run.step >= math.ceil(iterations * plan.iteration_scale - 1e-9)


def one_round(run: _Run, plan: Plan, record: RunRecord, world: World) -> None:
    m = plan.micro_batches or run.micro_batches
    times = run.clock.take(plan.local_steps, m, run.now)
    stops = stop_rule(times, plan.threshold, plan.preempt)
    comm = run.clock.next_comm()
    arrivals = ArrivalColumns(
        np.arange(run.n),
        np.full(run.n, run.step),
        np.full(run.n, run.now),
        run.now + stops.compute,
        units=stops.done / (plan.local_steps * m),
    )
    selection, scalars = learn(run, plan, arrivals, stops.done, m)
    used = contributors(selection, stops.done)
    stats = StepStats(
        step=run.step,
        version=run.step + 1,
        time=run.now + float(stops.compute.max()) + comm,
        k=plan.k,
        arrivals=arrivals,
        used=tuple(used),
        loss=scalars[0],
        grad_sq_sum=scalars[1],
        mean_grad_sq=scalars[2],
        lr=world.lr * plan.lr_scale,
        micro_batch_times=measured(times, stops.done),
        comm_time=comm,
    )
    run.state = run.strategy.adapt(run.state, stats)
    record.add_step(step_row(plan, stats, stops, used, m, comm))
    run.now = stats.time
    run.step += 1


def contributors(selection: Selection | None, done: np.ndarray) -> list[int]:
    """Workers whose weight is not zero (timing only: those that completed something)."""
    if selection is None:
        return np.flatnonzero(done).tolist()
    return [i for i in range(done.size) if selection.now.get(i, 0.0) != 0]


def learn(
    run: _Run, plan: Plan, arrivals: ArrivalColumns, done: np.ndarray, m: int
) -> tuple[Selection | None, tuple[float, float, float]]:
    """Gradients of the completed micro-batches, the rule's weights and the update."""
    if run.learner is None:
        nan = float("nan")
        return None, (nan, nan, nan)
    batches = run.learner.batches(run.step, plan.local_steps * m)
    work = run.learner.work(batches, done, m, plan.local_steps, plan.lr_scale)
    selection = run.strategy.select(run.state, arrivals)
    run.learner.apply(selection, work, plan.lr_scale)
    if plan.requeue_dropped:
        run.learner.requeue(batches, done)
    return selection, work.stats()


def step_row(
    plan: Plan, stats: StepStats, stops: Stops, used: list[int], m: int, comm: float
) -> dict[str, Any]:
    n, units = stops.done.size, plan.local_steps * m
    share = float(stops.done.sum()) / (n * units)
    compute, sync = float(stops.compute.max()), float(stops.full.max())
    return {
        "step": stats.step,
        "time": stats.time,
        "k": int(np.count_nonzero(stops.done)),
        "lr": stats.lr,
        "loss": stats.loss,
        "workers": used,
        "staleness": [0] * len(used),
        "threshold": plan.threshold,
        "micro_batches": m,
        "local_steps": plan.local_steps,
        "completed": stops.done.tolist(),
        "drop_rate": 1.0 - share,
        # Algorithm 2's S_i: samples per second relative to sync SGD on the same draws
        "s_eff": share * (sync + comm) / (compute + comm) if compute + comm > 0 else 1.0,
        "compute_time": compute,
        "comm_time": comm,
        "sync_time": sync + comm,
    }


def summarise(record: RunRecord) -> dict[str, Any]:
    """Run-level DropCompute figures: threshold in force at the end, drop rate and S_eff.

    ``effective_speedup`` is Eq. (6) over the run: the share of micro-batches computed times
    sum_i (T_i + T^c_i) / sum_i (T~_i + T^c_i), the ratio of throughputs with and without the
    threshold on the same draws (as ``theory.dropcompute.evaluate_threshold`` estimates it).
    """
    if not record.steps:
        return {"threshold": None, "drop_rate": math.nan, "effective_speedup": math.nan}
    possible = np.array(
        [len(r["completed"]) * r["micro_batches"] * r["local_steps"] for r in record.steps]
    )
    done = np.array([sum(r["completed"]) for r in record.steps])
    used = record.column("compute_time") + record.column("comm_time")
    share = done.sum() / possible.sum()
    return {
        "threshold": float(record.steps[-1]["threshold"]),
        "drop_rate": float(1.0 - share),
        "effective_speedup": float(share * record.column("sync_time").sum() / used.sum())
        if used.sum() > 0
        else 1.0,
        "mean_completed": float(done.sum() / sum(len(r["completed"]) for r in record.steps)),
    }
