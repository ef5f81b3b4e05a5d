"""The partial-collective topology of `tailtrain train`: eager-SGD (solo, majority, quorum) and
dbw-quorum on real ranks, over :class:`~tailtrain.runtime.partial.PartialCollective`.

Rank p runs eager-SGD's Algorithm 2 as process p of ``sim.partial.engine`` does, with wall time
for the virtual clock:

1. its j-th gradient: the mini-batch ``sim.data_stream.job_batches`` keyed by (seed, p, j), at
   its own model; with ``--delay`` it then sleeps the seconds the simulator charges worker p's
   j-th job (``World.durations``, the same seeded draws);
2. ``call`` of its step's round (late, waiting or active: ``runtime.partial``);
3. it adopts the latest result, theta <- theta - lr * lr_scale * sum_i w g_i / divisor, through
   ``tailtrain.update.WeightedUpdate`` (a late rank skips the rounds it missed, eager-SGD §5),
   and after a round with ``average_models`` averages the models of all ranks (§5's periodic
   synchronisation; the staleness bound's synchronous rounds need no averaging).

The rule (``plan`` / ``select`` / ``adapt``) runs on every rank's reducer thread after each
round, on the round's arrivals as every rank received them, so every rank plans the same next
round. A round sums the contributions before anyone knows who contributed, so the rule must
weigh them equally (eager-SGD Alg. 2 line 6 and dbw-quorum do: weight 1, divisor P or the
count); a rule that does not is refused. ``StepStats`` hold the contributions as arrivals and
the fresh gradients' loss, sum of ||g||^2 and ||mean g||^2 (DBW Eqs. 10-11, for dbw-quorum).
Late gradients reach the rule in the round that carries them (the simulator lists them in the
round they finished in), so DBW's time estimator sees them one round later.

Evaluations: rank 0 scores the initial model, and the final one after a last average of the
models; scoring in between would stall rank 0 and make it the straggler. ``time`` is the
round's close on the run's clock (``RoundResult.closed``).
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np
import torch

from tailtrain.errors import TailtrainError, UsageError
from tailtrain.runtime.allreduce import RankResult
from tailtrain.runtime.config import TrainConfig, build_world
from tailtrain.runtime.inject import FaultDrill
from tailtrain.runtime.partial import PartialCollective, RoundResult, row
from tailtrain.runtime.reduce import Collectives
from tailtrain.runtime.telemetry import stream_to_board
from tailtrain.sim.data_stream import job_batches
from tailtrain.sim.evaluation import Evaluator
from tailtrain.sim.partial.collectives import CommTimes
from tailtrain.sim.partial.engine import summarise as partial_summary
from tailtrain.sim.records import RunRecord, prepare_folder
from tailtrain.sim.scenario import World
from tailtrain.strategies.base import Selection, StepStats, Strategy
from tailtrain.strategies.eager import RoundPlan
from tailtrain.update import NonFiniteGradient, WeightedUpdate

#: rounds whose step a rank can still adopt (a rank that slept through more adopts a later one)
KEEP = 64


class Rule:
    """The strategy and its state, driven on the reducer thread (same inputs on every rank)."""

    def __init__(self, world: World, strategy: Strategy, rank: int, record: bool) -> None:
        self.world, self.strategy, self.rank = world, strategy, rank
        self.state: Any = strategy.init(world.context)
        self.comm = CommTimes(world.scenario.comm_time, world.seed)
        self.steps: dict[int, tuple[torch.Tensor, float, float]] = {}
        self.averages: list[int] = []
        self.record = RunRecord() if record else None
        self.now = 0.0

    def first(self) -> RoundPlan:
        return self.strategy.plan(self.state)

    def after_round(self, result: RoundResult) -> RoundPlan | None:
        """select -> the round's step, StepStats -> adapt; the next plan (None: done)."""
        arrivals, plan, r = result.arrivals(), result.plan, result.index
        weight, divisor = uniform(self.strategy.select(self.state, arrivals), arrivals.keys)
        self.steps[r] = (weight * result.total, divisor, plan.lr_scale)
        self.steps.pop(r - KEEP, None)
        if plan.average_models:
            self.averages.append(r)
        stats = self.stats(result, arrivals)
        self.state = self.strategy.adapt(self.state, stats)
        time.sleep(self.comm.next() * (2 if plan.average_models else 1))
        self.now = result.closed
        if self.record is not None:
            self.record.add_step(round_row(result, stats))
        if self.world.finished(r + 1, self.now):
            return None
        return self.strategy.plan(self.state)

    def stats(self, result: RoundResult, arrivals) -> StepStats:
        rows, r = result.rows, result.index
        fresh = rows[rows[:, 2] == r]
        nap = len(fresh)
        mean = result.fresh / max(nap, 1)
        fresh = fresh[np.isfinite(fresh[:, 5])]  # a screened-out gradient joined with nothing
        return StepStats(
            step=r,
            version=r + 1,
            time=result.closed,
            k=result.plan.k,
            arrivals=arrivals,
            used=arrivals.keys,
            loss=float(fresh[:, 5].mean()) if len(fresh) else math.nan,
            grad_sq_sum=float(fresh[:, 6].sum()) if len(fresh) else math.nan,
            mean_grad_sq=float(mean @ mean) if nap else math.nan,
            lr=self.world.lr * result.plan.lr_scale,
        )


def uniform(selection: Selection, keys: np.ndarray) -> tuple[float, float]:
    """The one weight every contribution gets, and the divisor; a partial collective sums the
    contributions before the arrivals are known, so unequal weights cannot be applied."""
    if len(selection.later):
        raise TailtrainError("the partial-collective topology applies no deferred weights")
    weights = selection.now.over(keys) * selection.now.divisor
    if len(keys) and not np.allclose(weights, weights[0]):
        raise TailtrainError("a partial collective can only weigh its contributions equally")
    return (float(weights[0]) if len(keys) else 0.0), selection.now.divisor or 1.0


def round_row(result: RoundResult, stats: StepStats) -> dict[str, Any]:
    """The simulator's partial-collective row (``sim.partial.engine``), measured."""
    rows, r, plan = result.rows, result.index, result.plan
    active = result.active
    initiators = result.initiators
    nonfinite = int(np.count_nonzero(~np.isfinite(rows[:, 5])))  # screened out (run_rounds)
    extra = {"nonfinite": nonfinite} if nonfinite else {}
    if plan.synchronous:  # everyone activates itself; the last call completes it (the sim's)
        initiators = np.array([int(np.argmax(result.slots[:, 1]))])
    return {
        "step": r,
        "time": result.closed,
        "k": int(active.size),
        "lr": stats.lr,
        "loss": stats.loss,
        "workers": rows[:, 0].astype(int).tolist(),
        "staleness": (r - rows[:, 2]).astype(int).tolist(),
        "nap": int(active.size),
        "quorum": plan.k,
        "collective": plan.collective.value,
        "initiator": int(initiators[0]) if initiators.size else -1,
        "initiators": initiators.tolist(),
        "active": active.tolist(),
        "model_sync": plan.average_models,
        "arrivals": len(stats.arrivals),
        "reach": result.reach - result.activation,
        **extra,
    }


def train_partial(config: TrainConfig, comm: Collectives) -> RankResult:
    """Run ``config`` as rank ``comm.rank`` under a partial-collective rule (module docstring)."""
    world, strategy = build_world(config)
    scenario, rank, n = world.scenario, comm.rank, comm.world_size
    if n != scenario.workers:
        raise UsageError(f"--workers {scenario.workers} but the job has {n} ranks")
    if world.partition is None:
        raise UsageError(f"task {scenario.task!r} has no model to train; choose e.g. logreg")
    task = world.task
    theta = task.init_params(world.seed)
    task.grads(theta, batch(world, rank, 0))  # build torch.func machinery before the clock
    rule = Rule(world, strategy, rank, record=rank == 0)
    record = stream_to_board(rule.record or RunRecord(), config, world, rank == 0)
    evals = Evaluator(scenario.evaluation, record, enabled=rank == 0)
    evals.start(lambda: task.evaluate(theta))
    coll = PartialCollective(
        rank,
        n,
        int(task.dim),
        rule.first(),
        rule.after_round,
        backend=config.backend,
        device=comm.device,
        timeout=config.timeout,
    )
    theta, step = run_rounds(config, world, coll, rule, comm, theta)
    coll.close()
    theta = comm.weighted_sum(theta, 1.0 / n).numerator  # the final synchronisation
    final = evaluate_once(task, theta)
    if not scenario.evaluation.on_time_grid:  # the every-U-updates schedule's last point
        evals.after_step(step, rule.now, final, final)
    evals.finish(step, rule.now, final)
    if rank == 0:
        summary = {**world.summarise(strategy, record), **partial_summary(record)}
        summary["nonfinite"] = int(sum(r.get("nonfinite", 0) for r in record.steps))
        record.summary = {
            ("wall_time" if k == "virtual_time" else k): v for k, v in summary.items()
        }
        if config.out is not None:
            record.write(prepare_folder(config.out))
    return RankResult(rank, record, theta.numpy().copy())


def evaluate_once(task, theta: torch.Tensor):
    """Scores of ``theta``, computed at most once however often they are asked for."""
    cache: list[dict] = []

    def scores() -> dict:
        if not cache:
            cache.append(task.evaluate(theta))
        return cache[0]

    return scores


def batch(world: World, rank: int, job: int) -> np.ndarray:
    """The mini-batch of this rank's ``job``-th gradient, as the simulator draws it."""
    b = job_batches(world.partition, world.seed, world.task.batch_size, [rank], [job])
    return b[:, 0]


def run_rounds(config, world, coll, rule: Rule, comm: Collectives, theta):
    """The main thread: compute, (sleep the injected delay), call, adopt; until the plan ends."""
    rank, n = comm.rank, comm.world_size
    durations = world.durations(round_trips=False)
    me = np.array([rank])
    update = WeightedUpdate(world.lr)
    step, job, averaged = 0, 0, 0
    drill = FaultDrill(config.faults, rank, config.out)  # a kill fires once, not after a restart
    while coll.plan(step) is not None:
        drill.before(step)
        start = coll.now()
        loss, grad = world.task.grads(theta, batch(world, rank, job))
        loss, grad = float(loss[0]), grad[0]
        if config.inject:
            seconds = float(durations.peek(me, np.array([start]))[0])
            durations.advance(me)
            time.sleep(seconds)
        drill.poison(step, grad)
        if not (torch.isfinite(grad).all() and math.isfinite(loss)):
            if config.on_nonfinite == "raise":
                raise NonFiniteGradient([rank], step)
            grad, loss = torch.zeros_like(grad), math.nan  # joins with nothing (update.py)
        out = coll.call(step, grad, row(job, step, start, coll.now(), loss, float(grad @ grad)))
        done = out.result.index
        total, divisor, lr_scale = rule.steps[done]
        theta = update.apply_reduced(theta, total.to(theta.dtype), divisor, lr_scale)
        while averaged < len(rule.averages) and rule.averages[averaged] <= done:
            theta = comm.weighted_sum(theta, 1.0 / n).numerator
            averaged += 1
        step, job = done + 1, job + 1
    return theta, step
