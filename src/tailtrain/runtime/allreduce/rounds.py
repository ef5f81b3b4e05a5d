"""The allreduce topology of `tailtrain train`: sync, DropCompute, Local-SGD and rebalance on
real ranks.

Rank n runs round r exactly like worker n of ``sim.allreduce.engine``, with wall time for the
virtual clock and the same rule object deciding (``runtime.control``):

1. ``plan``: tau, M, H and, for rebalance, the per-rank shares (identical on every rank:
   same state). A plan of shares has rank n compute ``shares[n]`` micro-batches of sync's
   global batch, dealt as the simulator deals it (:func:`dealt`); the gathered rows are as
   wide as the largest share, so every rank's measured times reach every rank's rule. A plan
   that carries its cut (``rebalance:then=dropcompute,defer=true``) deals the micro-batches
   the threshold cut first in the next round (``RoundData.dealt``): every rank reads every
   rank's count from the gathered rows (3.) and keeps the same queue. A plan dealt on demand
   (``rebalance:deal=demand``) has the run's store hand each micro-batch to whichever rank
   asks next until N M are complete (``runtime.allreduce.demand``); the gathered rows add
   the units' dealt indices, so every rank carries the same cut units (``RoundData.on_demand``).
2. Compute (``runtime.units``: DropCompute Algorithm 1, Local-SGD App. B.3): the
   micro-batches of ``tasks.stream.job_batches`` keyed by (seed, n, r), as in the
   simulator, one at a time with the task's flat-parameter gradients, each unit then sleeping
   its injected seconds; tau is checked *between* micro-batches. Parity runs use
   ``stop=between``, the simulator's convention exactly; with ``stop=preempt`` (the default)
   a rank may leave after tau by up to one micro-batch, whose real compute cannot be cut.
3. One weighted allreduce (``runtime.reduce``) of [w_n G_n, w_n, loss sum, units,
   ||G_n||^2, ..., rows] with G_n = H A_n / C_n (``topology.allreduce.worker_grad``). Its
   rows are the round's [C_n, T~_n, injected seconds, t_n^(1..U)] of every rank (laid out
   block-diagonally: an all-gather for free), each rank's [allreduce, round seconds] of the
   *previous* round and whether its gradient was screened out (NaN or inf: it joins with
   weight 0 and leaves the round's used arrivals on every rank). w_n depends on rank n's own
   counts only (``runtime.control``), so it is known before the allreduce; afterwards every
   rank builds identical arrivals from the rows, the rule's ``select`` over all of them checks
   the weights (and gives the divisor), and every rank applies
   theta <- theta - lr * lr_scale * sum_n w_n G_n / denominator. With w_n = (C_n/(H M))/N
   this is the average of the local models. That is the round's only collective, as DDP's.
4. ``adapt`` with the gathered unit times (Algorithm 2 for threshold=auto: every rank sees
   the same t_n^(u), so every rank computes the same tau*) and the latest agreed T^c, the
   previous round's (a round's own T^c is known only when the next allreduce brings it;
   round 0 has none, and Algorithm 2 counts the window's mean for it).
   A static rule (``Strategy.keeps_state``: sync) plans every round alike, so nothing waits
   for 3.'s selection and 4.: the update goes ahead with the divisor the rule gave this rank's
   arrival alone, and the selection, its checks and ``adapt`` are made with the round's record
   row (5.), in order. A rule that breaks the one-allreduce protocol is then refused up to
   ``ROWS_AT_ONCE`` + 1 rounds late (the error names the round), but the round's Python
   after a compute, whose code runs cold, shrinks to the update and the clock
   (``bench/bench_runtime.py``).
5. The round's record row waits for its timings: T^c = the smallest allreduce seconds over
   the ranks (the last rank to arrive waits for nobody: the collective's own time, injected
   ``--comm-time`` included) and the round's wall time = the slowest rank's. Until then the
   agreed clock counts the round as max_n T~_n + the latest T^c (the same on every rank, it
   drives the time budget, the evaluation schedule and time-scheduled delay patterns); the
   row enters the record with its measured time. After the last round one small all-gather
   settles it. Round 0 starts after a barrier, on every rank together. Rows are made
   ``ROWS_AT_ONCE`` at a time while an allreduce runs (a run folder's snapshot, taken every
   round, makes them at once): the round's Python is most of what the runtime adds to a
   DDP step (``bench/bench_runtime.py``), and its code runs cold after each compute.

``time`` is the sum of the rounds' wall seconds (evaluation and bookkeeping excluded, as the
simulator excludes them from virtual time).

Checkpoints (``runtime.keep``, with ``--out``): a round ends with the weighted allreduce, so
after it every rank holds the same parameters, rule state, delay clock, data queues and
evaluation schedule (Local-SGD's local copies live only inside a round, whose end is its
synchronisation). Any rank's state after a round is thus the run's: rank 0 writes it every
``--checkpoint-every`` rounds, and after a failure the surviving rank that completed the most
rounds writes it. The data position is the round index (``job_batches`` is keyed by it) plus
the re-queued micro-batches or the carried cut (``RoundData.carry``).
``StepStats.mean_grad_sq`` would need a second D-vector in the allreduce and no allreduce rule
reads it, so it is NaN here.
"""

from __future__ import annotations

import contextlib
import datetime
import math
import os
import time
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import torch

from tailtrain.core import checkpoint
from tailtrain.core.evaluation import Evaluator
from tailtrain.core.records import RunRecord
from tailtrain.core.scenario import World, budget_spent
from tailtrain.core.session import RunKeeper, check_entry
from tailtrain.core.update import (
    GradientStats,
    WeightedUpdate,
    closed_step_stats,
    key_workers,
    screen_own,
)
from tailtrain.errors import TailtrainError
from tailtrain.runtime.allreduce.demand import Dealer, compute_on_demand
from tailtrain.runtime.allreduce.handover import (
    drawn_now,
    lost_timings,
    sync_from_lead,
)
from tailtrain.runtime.config import RankResult, TrainConfig, build_world
from tailtrain.runtime.control import (
    RankWeighting,
    RuleDriver,
    check_agreement,
    check_divisor,
    check_own_weight,
    round_times,
    screened_out,
)
from tailtrain.runtime.elastic.group import Broken
from tailtrain.runtime.elastic.handover import follow_live
from tailtrain.runtime.elastic.shrink import OnRankLoss, Refused, Shrinker
from tailtrain.runtime.grads import ModuleGrads
from tailtrain.runtime.inject import Injector, sleep
from tailtrain.runtime.interrupt import (
    Stopped,
    hold_sigterm,
    interrupt_requested,
    stop_on_sigterm,
)
from tailtrain.runtime.keep import Keeper, reopen_records
from tailtrain.runtime.rank import Updates, drive_rank
from tailtrain.runtime.reduce import Collectives, PeerFailure, SumBuffer, WeightedSum
from tailtrain.runtime.telemetry import (
    RankLog,
    Settled,
    TraceRows,
    allreduce_row,
    attach,
    close_record,
    phase,
    run_record,
    split_round,
    time_means,
    write_traces,
)
from tailtrain.runtime.units import RankWork, compute
from tailtrain.strategies.base import AllreducePlan as Plan
from tailtrain.strategies.base import StepStats
from tailtrain.topology.allreduce import (
    RoundData,
    own_arrival,
    round_arrivals,
    summarise,
)

#: column of the first unit time in a gathered row [C_n, T~_n, injected, t_n^(1..U)]
TIMES = 3
#: the allreduce's extras: [loss sum, units, ||G_n||^2, non-finite, weight withheld, Ctrl-C,
#: a rank asks to join (``runtime.elastic.shrink``)]
EXTRAS = 7
#: settled rounds whose record rows are made together (:func:`flush`), a static rule's
#: accounted with them: one a round costs ~50-90 us (~150 accounted) with its code cold from
#: the compute, a batch a fraction of that
ROWS_AT_ONCE = 32


class Exchange(NamedTuple):  # a tuple: made on every round's critical path
    """A round as its allreduce left it, for :func:`account`: its index, the agreed clock at
    its start, the plan and M, the gathered rows [C_n, T~_n, injected, t_n^(1..U)], the
    reduced [loss sum, units, sum ||G_n||^2, non-finite gradients, weight withheld], the
    gathered screened-out flags (> 0: that rank's gradient was), the weight this rank reduced
    with, the reduced sum of the weights with what screened ranks withheld, the agreed clock at
    the round's end, the latest agreed T^c, and the divisor the rule gave this rank's arrival
    alone (a static rule's update uses it)."""

    step: int
    start: float
    plan: Plan
    m: int
    rows: np.ndarray
    extras: np.ndarray
    screened: np.ndarray
    weight: float
    total: float
    time: float
    comm_time: float
    divisor: float | None
    #: on demand: the micro-batches each rank was dealt (its cut one included)
    dealt: np.ndarray | None = None


@dataclass
class Unsettled:
    """A round on its way to the record: its exchange, and its statistics once it is
    accounted (:func:`account`); its row is made once its timings have come (:func:`settle`,
    :func:`flush`). A rule that adapts is accounted at once, as its next plan needs the
    statistics; a static rule's rounds are accounted with their rows (module docstring, 4.)."""

    ex: Exchange
    stats: StepStats | None = None
    #: under ``--on-rank-loss shrink``: the original ranks of the round's generation, in
    #: their order (its arrival n is rank ``live[n]``'s), and the ranks lost just before it
    live: tuple[int, ...] | None = None
    dead: tuple[int, ...] = ()
    rejoined: tuple[int, ...] = ()
    #: under shrink: the index in its generation of the rank that made the exchange, and the
    #: rule as started for that generation's world
    index: int | None = None
    rule: RuleDriver | None = None
    #: under shrink: the wall clock (Unix seconds) when this rank applied the round's update
    committed: float = math.nan


@dataclass
class _Rank:
    """Mutable state of one rank's run; lives only inside :func:`train_allreduce`."""

    config: TrainConfig
    world: World
    rule: RuleDriver
    learner: RoundData
    injector: Injector
    comm: Collectives
    log: RankLog
    trace: TraceRows
    record: RunRecord
    evals: Evaluator
    update: WeightedUpdate
    grads: ModuleGrads
    keeper: Keeper
    #: this rank's original rank (its data shard and delays), whatever its generation's
    rank: int = 0
    #: the agreed clock: settled rounds' wall seconds plus the latest round's estimate
    now: float = 0.0
    #: wall seconds of the settled rounds
    settled: float = 0.0
    #: the latest agreed T^c (NaN before any round settled)
    comm_time: float = math.nan
    step: int = 0
    #: this rank's [allreduce, round seconds] of the latest round, sent with the next one
    timing: tuple[float, float] = (math.nan, math.nan)
    unsettled: Unsettled | None = None
    #: settled rounds, with their gathered timings, whose record rows are still to be made
    #: (:func:`settle`, :func:`flush`)
    settling: list[tuple[Unsettled, Settled, np.ndarray]] = field(default_factory=list)
    #: the reduce buffer, kept while the rounds' layout stays (:func:`sum_buffer`)
    sums: SumBuffer | None = None
    #: the store's counters of rounds dealt on demand (``runtime.allreduce.demand``)
    dealer: Dealer | None = None
    #: a rank asked to stop (Ctrl-C) in the latest round's allreduce: every rank stops there
    interrupted: bool = False
    #: ``--on-rank-loss shrink``'s protocol (``runtime.elastic.shrink``; None: stop)
    shrinker: Shrinker | None = None
    #: under shrink: the delay draws as they stood before the round in flight drew its own
    drawn: dict[str, Any] | None = None
    #: under shrink: the ranks lost and taken in again since the latest round, for its row
    lost: tuple[int, ...] = ()
    joined: tuple[int, ...] = ()
    #: under shrink: this rank (the lowest member) saw a rank ask to join; the latest round's
    #: allreduce said some rank did, so every member takes it in after the round
    joins_waiting: bool = False
    grow: bool = False

    # ---- the topology's contract (``runtime.rank.RankRun``) ----------------------------------
    def updates(self) -> Updates:
        return rounds(self)

    def failed(self, exc: BaseException) -> BaseException:
        if isinstance(exc, Refused):  # the survivors went on without it: nothing to keep
            self.log.warning("%s", exc)
            return exc
        return failed(self, exc)

    def finish(self) -> RankResult:
        return finish(self)


def train_allreduce(config: TrainConfig, comm: Collectives) -> RankResult:
    """Run ``config`` as rank ``comm.rank`` of ``comm.world_size``; returns this rank's result.

    Evaluations follow the simulator's schedule (``core.evaluation``) on the wall clock of the
    rounds; rank 0 scores (every rank holds the same parameters) while the others wait. Every
    rank follows the schedule (the others into a record of their own, without scoring), so
    all know when rank 0 scored and wait for it at a barrier only then.

    When the group fails (a peer died or hung, or the launcher stops it), this rank takes
    part in the survivors' census and checkpoint (``runtime.keep.Keeper.failed``). Ctrl-C
    reaches the ranks as a request (``runtime.interrupt``) that a rank adds to its next round's
    allreduce; after that round every rank stops, rank 0 keeps the run (partial) and the
    checkpoint of that round (``Keeper.interrupted``).
    """
    stop_on_sigterm()
    return drive_rank(start(config, comm), comm.drill)


def failed(run: _Rank, exc: BaseException) -> BaseException:
    """The group failed: the rows so far, the census and checkpoint; the exception to end
    with. A rank the launcher stopped leaves at once."""
    hold_sigterm()  # the row, census and checkpoint below run to their end (runtime.keep)
    pending = rows_so_far(run)
    if pending is not None:  # a completed round's row is on disk, as its checkpoint has it
        run.record.add_step(pending)
    end = run.keeper.failed(run.step, exc, run.config.timeout)
    close_record(run.record)  # flush steps.jsonl and TensorBoard before leaving
    if isinstance(exc, Stopped):  # the launcher is stopping the group: leave at once
        os._exit(143)
    return end


def rounds(run: _Rank) -> Updates:
    """The rounds until the budget is spent, each followed by its evaluations and snapshot;
    each round's index is yielded as its work starts (``runtime.rank``: the drills)."""
    scenario, keeper = run.world.scenario, run.keeper.run
    keeper.begin(run.evals, scorer(run), resumed=run.keeper.saved is not None)
    if run.shrinker is not None and run.shrinker.rejoining:  # started again: join the others
        shrink(run, join=True)
    else:
        run.comm.barrier()  # round 0 starts together, as the simulator's workers all start at 0
    while not run.interrupted and not budget_spent(
        scenario, run.step, run.now, (plan := run.rule.plan()).iteration_scale
    ):
        before = scorer(run)
        yield run.step
        if run.shrinker is None:
            one_round(run, plan)
            if keeper.stepped(run.evals, run.step, run.now, before, scorer(run)):
                run.comm.barrier()
        else:
            try:
                shrinkable_round(run, plan, before)
                if run.grow:  # a rank asked to join: every member takes it in now
                    shrink(run, grow=True)
            except (Broken, PeerFailure) as exc:
                run.log.warning("%s", exc)
                shrink(run)
                continue
        run.keeper.completed(run.step, lambda: state_of(run))
    if run.shrinker is not None:
        run.shrinker.finished()
    settle_last(run)
    keeper.end(run.evals, run.step, run.now, scorer(run), interrupted=run.interrupted)


def shrinkable_round(run: _Rank, plan: Plan, before: Any) -> None:
    """One round under ``--on-rank-loss shrink``: the delay draws kept before it draws its own
    (a round in flight is computed again after a shrink), the barrier after rank 0's
    evaluation bounded by --timeout rather than the deadline."""
    assert run.shrinker is not None
    run.drawn = drawn_now(run)
    watch = run.comm.watch
    # rank 0 wrote a checkpoint after the last round (runtime.keep): the others wait for the
    # write in this round's allreduce up to --timeout, not the deadline
    watch.patient = run.keeper.run.due(run.step)
    try:
        one_round(run, plan)
    finally:
        watch.patient = False
    run.drawn = drawn_now(run)  # completed: a break in the barrier below redoes no round
    if run.keeper.run.stepped(run.evals, run.step, run.now, before, scorer(run)):
        watch = run.comm.watch
        watch.patient = True
        try:
            run.comm.barrier()
        finally:
            watch.patient = False


def shrink(run: _Rank, grow: bool = False, join: bool = False) -> None:
    """The survivors' census (``grow``: the members' step boundary that takes joiners in),
    their new generation and its sync from the lead member (``runtime.elastic.shrink``);
    this rank goes on from the round the lead completed."""
    shrinker = run.shrinker
    assert shrinker is not None
    run.grow = run.joins_waiting = False
    if grow:  # at a step boundary the draws are the next round's
        run.drawn = drawn_now(run)
    flush(run)
    rows = len(run.record.steps)
    sync = lambda new, found: sync_from_lead(run, new, found)  # noqa: E731
    comm, found = shrinker.regroup(run.comm, run.step, rows, sync, grow=grow, join=join)
    run.comm, run.sums = comm, None
    run.rule, _ = follow_live(run.rule, run.world.context, found.members)
    run.lost = tuple(sorted({*run.lost, *found.dead}))
    run.joined = tuple(sorted({*run.joined, *found.joined}))


def scorer(run: _Rank):
    """Scores of today's parameters when called (rank 0 logs them; the others score none)."""
    theta = run.learner.theta
    if run.comm.rank != 0:
        return dict

    def scores() -> dict:
        values = run.world.task.evaluate(theta)
        run.log.info("train loss %.4f at %.3fs", values["train_loss"], run.now)
        return values

    return scores


def start(config: TrainConfig, comm: Collectives) -> _Rank:
    world, strategy = build_world(config)
    check_entry(world, comm.world_size)
    scenario = world.scenario
    learner = RoundData(world.task, world.partition, world.lr, config.seed, scenario.workers)
    grads = ModuleGrads(world.task)
    grads(learner.theta, learner.batches(0, 1)[comm.rank, 0])  # warm-up, out of round 0's time
    keeper = Keeper.of(config, world, strategy, comm.rank, comm.world_size)
    run = _Rank(
        config=config,
        world=world,
        rule=RuleDriver(strategy, world.context),
        learner=learner,
        injector=Injector(world, comm.rank, config.inject),
        comm=comm,
        log=RankLog(),
        trace=TraceRows(comm.rank, scenario.micro_batches is not None, charged=True),
        record=(record := run_record(config, world, comm.rank == 0)),
        evals=Evaluator(scenario.evaluation, record if comm.rank == 0 else RunRecord(), True),
        update=WeightedUpdate(world.lr, config.on_nonfinite),
        grads=grads,
        keeper=keeper,
        rank=comm.rank,
    )
    if config.on_rank_loss == OnRankLoss.SHRINK:
        run.shrinker = Shrinker.start(comm, config.timeout)
    if "demand" in strategy.needs:
        run.dealer = Dealer.open(datetime.timedelta(seconds=config.timeout), comm.rank == 0)
    if keeper.saved is not None and (run.shrinker is None or not run.shrinker.rejoining):
        resume(run, keeper.saved)  # a rank started again takes a live peer's state instead
    elif config.out is not None and comm.rank == 0:
        attach(run.record, reopen_records(config.out, None, None)[0])
    return run


def state_of(run: _Rank) -> dict[str, Any]:
    """This rank's state after a round: the run's, as every rank holds the same (module
    docstring). The parameters by reference (an update replaces them), the rest copied."""
    flush(run)
    steps, evals = run.record.steps, run.evals.record.evals
    pending = estimated_row(run)
    return {
        "now": float(run.now),
        "settled": float(run.settled),
        "comm_time": float(run.comm_time),
        "pending": None if pending is None else checkpoint.pack(pending),
        "learner": checkpoint.capture(run.learner, checkpoint.MODEL_STATIC),
        "update": run.update.state_dict(),
        "rule": run.rule.state_dict(),
        "clock": checkpoint.with_comm(run.injector.clock, ("process",)),
        "delays": checkpoint.delay_state(run.world.process),
        "evaluator": RunKeeper.evaluator_state(run.evals),
        "rows": {"steps": len(steps), "evals": len(evals)},
        "last_step": checkpoint.pack(steps[-1]) if steps else None,
        "last_eval": checkpoint.pack(evals[-1]) if evals else None,
        "torch_rng": torch.get_rng_state(),
    }


def resume(run: _Rank, saved: dict[str, Any]) -> None:
    """Go on from a checkpoint :func:`state_of` made. Rank 0 continues the record in the
    folder; the others keep only the number of rows before it and the last of them."""
    run.step, run.now = int(saved["step"]), float(saved["now"])
    checkpoint.restore(run.learner, saved["learner"])
    run.update.load_state_dict(saved["update"])
    run.rule.load_state_dict(saved["rule"])
    # a checkpoint taken after a shrink holds the rule for the smaller world; this run is whole
    followed = run.rule.followed(run.world.context)
    if followed is not None:
        run.rule = followed
    checkpoint.restore_with_comm(run.injector.clock, saved["clock"])
    checkpoint.restore(run.world.process, saved["delays"])
    checkpoint.restore(run.evals, saved["evaluator"])
    torch.set_rng_state(saved["torch_rng"])
    last_step, counts = checkpoint.unpack(saved["last_step"]), dict(saved["rows"])
    if run.comm.rank == 0:
        sink, rows = reopen_records(run.config.out, counts, last_step)
        attach(run.record, sink)
        run.record.steps, run.record.evals = rows["steps"], rows["evals"]
    else:
        run.record.steps = [last_step] * counts["steps"]
        run.evals.record.evals = [checkpoint.unpack(saved["last_eval"])] * counts["evals"]
    pending = saved["pending"]
    run.settled, run.comm_time = float(saved["settled"]), float(saved["comm_time"])
    if pending is not None:  # its timings were to come with the next round: keep the estimate
        run.record.add_step(checkpoint.unpack(pending))
        run.settled = run.now
    run.keeper.completed(run.step, lambda: state_of(run), save=False)


def rows_so_far(run: _Rank) -> dict[str, Any] | None:
    """After a failure: record the completed rounds' rows, and return (rank 0) the unsettled
    one's estimate. A static rule's rounds are accounted here, running the rule: the rows end
    at a round whose accounting fails, and the failure path goes on."""
    try:
        flush(run)
        return estimated_row(run) if run.comm.rank == 0 else None
    except Exception as err:  # the census and checkpoint must still run
        run.log.warning("the rows end at a round whose accounting failed: %s", err)
        return None


def estimated_row(run: _Rank) -> dict[str, Any] | None:
    """The unsettled round's row as this rank knows it before its timings come: its time the
    agreed estimate, its allreduce seconds unknown. A checkpoint keeps it in that form."""
    done = run.unsettled
    if done is None:
        return None
    return row_of(run, done, Settled(done.ex.time, done.ex.comm_time), None)


def row_of(
    run: _Rank, done: Unsettled, settled: Settled, timing: np.ndarray | None
) -> dict[str, Any]:
    """``done``'s record row at ``settled`` with each rank's [allreduce, round seconds] (None:
    unknown yet), accounting it first if it is not yet (``telemetry.split_round``)."""
    if done.stats is None:
        account(run, done)
    stats, rows = done.stats, done.ex.rows
    assert stats is not None
    times = split_round(rows, timing)
    # rank n's round is arrival n (round_arrivals), so the used ranks are the used keys' own
    used = sorted(key_workers(stats.used).tolist())
    if done.live is not None:  # arrival n is the generation's n-th member (original rank)
        used = [done.live[n] for n in used]
    row = allreduce_row(done.ex.plan, stats, times, used, done.ex.m, settled, done.ex.dealt)
    if done.live is not None:
        row |= shrink_columns(run, done)
    return RunKeeper.note_nonfinite(row, int(done.ex.extras[3]))


def shrink_columns(run: _Rank, done: Unsettled) -> dict[str, Any]:
    """A shrinking run's row columns (``runtime.elastic.shrink``): the ranks that stepped,
    those lost just before the round, the samples of the lost shards it did without, and
    when (Unix seconds) the round's update was applied here: the time from a fault to the
    next committed step is read off it and ``drills.jsonl``'s ``at``."""
    n = run.world.scenario.workers
    units = done.ex.plan.local_steps * done.ex.m
    skipped = (n - len(done.live)) * units * run.world.task.batch_size
    columns = {"live": list(done.live), "dead": list(done.dead), "skipped": int(skipped)}
    columns["rejoined"] = list(done.rejoined)
    return columns | {"committed_at": done.committed}


def one_round(run: _Rank, plan: Plan) -> None:
    m = plan.micro_batches or run.world.scenario.micro_batches or 1
    units = plan.local_steps * m
    run.log.step = run.step
    indices: list[int] | None = None
    if plan.shares is None:
        batches = run.learner.batches(run.step, units)
        # this rank's own shard, whatever its index in a shrunk generation
        mine, width = batches[run.rank], units
        injected = run.injector.unit_times(plan.local_steps, m, run.now)
    elif plan.on_demand:
        batches, injected, width = demand_pool(run, plan, m)
    else:
        batches, mine, injected, width = dealt(run, plan, m)
    started = time.perf_counter()
    lr = run.world.lr * plan.lr_scale
    sums = sum_buffer(run, width, plan.on_demand)
    with phase("compute"):
        # the gradient goes straight into the reduce buffer when both are on the CPU
        into = sums.grad if sums.host is not None else None
        if plan.on_demand:
            assert run.dealer is not None
            deal = run.dealer.round(run.step, int(sum(plan.shares)))
            work, indices = compute_on_demand(
                run.grads, run.learner.theta, deal, batches.__getitem__, injected, into
            )
        else:
            work = compute(run.grads, run.learner.theta, plan, mine, injected, m, lr, into)
    if len(work.times) < width:  # a share below the largest: the gathered rows align
        work = work._replace(times=work.times + [math.nan] * (width - len(work.times)))
    if work.done:
        run.comm.drill.poison(run.step, work.grad)
    rank, step, now = run.comm.rank, run.step, run.now
    own = run.rule.own_weight(
        work.done, lambda: own_arrival(step, now, rank, work.done, work.compute, units)
    )
    with phase("reduce") as reducing:
        reduced, excluded = reduce(run, work, own.weight, sums, indices)
    rows, timing, screened = reduced.rows[:3]
    dealt_counts = None
    run.interrupted = reduced.extras[5] > 0
    run.grow = reduced.extras[6] > 0
    if plan.requeue_dropped:
        done_units = rows[:, 0].astype(np.int64)
        if run.shrinker is not None:  # the gathered rows are the live ranks', in order
            done_units = np.full(len(batches), batches.shape[1], dtype=np.int64)
            done_units[run.shrinker.members] = rows[:, 0]
        run.learner.requeue(batches, done_units)
    if plan.on_demand:  # every rank carries every rank's cut unit, as the simulator does
        index = reduced.rows[3].astype(np.int64)
        run.learner.on_demand(index, rows[:, 0].astype(np.int64), m)
        dealt_counts = np.count_nonzero(index >= 0, axis=1)
    elif plan.carry_cut:  # every rank keeps what every rank left undone, as the simulator does
        shares = np.asarray(plan.shares, dtype=np.int64)
        run.learner.carry_cut(batches, shares, rows[:, 0].astype(np.int64))
    if run.unsettled is not None:
        settle(run, timing)
    # the agreed clock (module docstring, 5.): the slowest compute and the latest T^c
    estimate = max(rows[:, 1].tolist()) + (0.0 if math.isnan(run.comm_time) else run.comm_time)
    end = run.settled + estimate
    ex = Exchange(
        step,
        now,
        plan,
        m,
        rows,
        reduced.extras,
        screened,
        own.weight,
        reduced.total + excluded,
        end,
        run.comm_time,
        own.divisor,
        dealt_counts,
    )
    done = Unsettled(ex)
    if run.shrinker is not None:
        done.live, done.dead, run.lost = tuple(run.shrinker.members), run.lost, ()
        done.rejoined, run.joined, done.index = run.joined, (), run.comm.rank
        done.rule = run.rule
    # a static rule's next plan owes nothing to this round's statistics: they wait for its row
    divisor = own.divisor if run.rule.keeps_state else account(run, done).divisor
    apply(run, reduced, divisor, plan.lr_scale)
    if run.shrinker is not None:
        done.committed = time.time()
    run.unsettled, run.now = done, end
    cap = plan.threshold if plan.preempt else math.inf  # telemetry.TraceRows.add
    # a round of shares is one delay iteration of M units in the trace (telemetry.TraceRows)
    traced = work.times if plan.shares is None else (work.times + [math.nan] * m)[:m]
    run.trace.add(run.step, m, plan.local_steps, traced, work.cut, cap)
    run.step += 1
    run.timing = (reducing.seconds, time.perf_counter() - started)


def dealt(run: _Rank, plan: Plan, m: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """A round of per-rank shares (``strategies.rebalance``), as the simulator plays it
    (``sim.allreduce.engine``): sync's global batch (N, M, B; under shrink the live ranks'
    (L, M, B), ``Rebalance.follow_world``) dealt by the shares, a carried cut first
    (``RoundData.dealt``, shared with the simulator), this rank's ``shares[n]`` micro-batches
    of it, their injected seconds (the rank's delay draws run on into the next iteration's,
    one delay iteration per M units, so equal shares draw what sync does) and the gathered
    rows' width, the largest share. Returns (the dealt global batch, this rank's
    micro-batches, their seconds, width)."""
    shares = np.asarray(plan.shares, dtype=np.int64)
    if plan.local_steps != 1 or plan.requeue_dropped or shares.size != run.comm.world_size:
        raise TailtrainError(f"a plan of shares needs one local step per rank: {plan!r}")
    share, width = int(shares[run.comm.rank]), int(shares.max())
    members = None if run.shrinker is None else run.shrinker.members
    batches = run.learner.dealt(run.step, m, shares, plan.carry_cut, members)
    mine = batches[run.comm.rank, :share]
    injected = run.injector.unit_times(-(-width // m), m, run.now)[:share]
    return batches, mine, injected, width


def demand_pool(run: _Rank, plan: Plan, m: int) -> tuple[np.ndarray, np.ndarray, int]:
    """A round dealt on demand (``runtime.allreduce.demand``): the micro-batches it may deal,
    (N M + N, B), the carried ones first (``tasks.stream.CarryOver.peek``: each rank takes at
    most one past those counted), this rank's injected seconds for up to N M units (its delay
    draws of N M / M iterations, as the simulator draws them) and the gathered rows' width."""
    pool = int(sum(plan.shares))
    if plan.local_steps != 1 or run.shrinker is not None:
        raise TailtrainError(f"a round dealt on demand needs one local step, whole: {plan!r}")
    n = run.comm.world_size
    batches = run.learner.carry.peek(run.learner.drawn, n, m, pool + n)
    injected = run.injector.unit_times(-(-pool // m), m, run.now)[:pool]
    return batches, injected, pool


def sum_buffer(run: _Rank, units: int, indices: bool = False) -> SumBuffer:
    """The round's reduce buffer: the last one while the layout of the rows stays. A round
    dealt on demand adds a block of the units' dealt indices."""
    # the gathered row, [allreduce, round seconds], screened (and the dealt indices)
    widths = [TIMES + units, 2, 1] + ([units] if indices else [])
    if run.sums is None or run.sums.widths != widths:
        dim, dtype = run.learner.theta.numel(), run.learner.theta.dtype
        run.sums = SumBuffer(run.comm, dim, EXTRAS, widths, dtype)
    return run.sums


def reduce(
    run: _Rank, work: RankWork, weight: float, sums: SumBuffer, indices: list[int] | None = None
) -> tuple[WeightedSum, float]:
    """The round's one allreduce (module docstring, 3.) and the injected T^c; returns it and
    the weight this rank withheld. A rank whose gradient holds a NaN or an infinity joins with
    weight 0 and a zero gradient, as the simulator's update path screens it
    (``tailtrain.core.update``), and flags itself in a gathered column of its own, so that every
    rank leaves it out of the round's used arrivals. While the collective runs, this rank
    makes the record rows of the rounds settled since the last batch (:func:`flush`, every
    ``ROWS_AT_ONCE`` rounds), which need nothing from it."""
    grad, loss_sum, bad, sq_norm = screen_own(
        work.grad, work.loss_sum, run.update.on_nonfinite, run.comm.rank, run.step
    )
    done, excluded = work.done, 0.0
    if bad:
        run.log.warning("non-finite gradient: this rank joins the round with weight 0")
        loss_sum, done, excluded, weight = 0.0, 0, weight, 0.0
    gsq = sq_norm if done > 0 else 0.0
    joins = float(run.joins_waiting)
    extras = (loss_sum, done, gsq, float(bad), excluded, float(interrupt_requested()), joins)
    # lists, not arrays: the buffer takes them in one write (SumBuffer.fill)
    row = [work.done, work.compute, work.injected, *work.times]
    rows: tuple = (row, run.timing, (float(bad),))
    if indices is not None:  # on demand: the micro-batch of each unit, -1 past them
        rows += (indices + [-1] * (len(work.times) - len(indices)),)
    pending = run.comm.start(sums, weight, extras, rows, None if grad is sums.grad else grad)
    if run.shrinker is not None and run.comm.rank == 0:  # in the collective's shadow
        run.joins_waiting = run.shrinker.joins_waiting()
    if len(run.settling) >= ROWS_AT_ONCE:  # in the collective's shadow
        try:
            flush(run)
        except Exception:  # the collective ends (bounded) before the error leaves the round
            with contextlib.suppress(Exception):
                pending.wait()
            raise
    reduced = pending.wait()
    sleep(run.injector.comm_time())
    return reduced, float(reduced.extras[4])


def apply(run: _Rank, reduced: WeightedSum, divisor: float | None, lr_scale: float) -> None:
    """theta <- theta - lr * lr_scale * sum_n w_n G_n / denominator, the denominator the
    rule's ``divisor`` or (None) the reduced sum of the weights."""
    divisor = reduced.total if divisor is None else divisor
    # nobody computed anything: every weight and the weighted sum are 0, and so is the step
    divisor = divisor if divisor != 0 else 1.0
    theta = run.learner.theta
    numerator = reduced.numerator.to(theta.device)  # a GPU buffer's sum (nccl, gloo on CUDA)
    run.learner.theta = run.update.apply_reduced(theta, numerator, divisor, lr_scale)


def account(run: _Rank, done: Unsettled) -> RankWeighting:
    """The rule's selection over every rank's arrival, checked against what the round
    reduced (and, where the update went ahead of it, the divisor it used); ``adapt`` with the
    latest agreed T^c at the round's end. Fills ``done.stats``."""
    ex = done.ex
    plan, step = ex.plan, ex.step
    arrivals = round_arrivals(step, ex.start, ex.rows[:, 0], ex.rows[:, 1], plan.local_steps * ex.m)
    # the rank whose weight the exchange holds, in its round's generation (a shrink may hand
    # this rank another member's round: ``runtime.elastic.shrink``, SYNCING)
    index = run.comm.rank if done.index is None else done.index
    rule = run.rule if done.rule is None else done.rule  # the rule of the round's world
    weighting = rule.weights(arrivals, index)
    try:
        check_own_weight(ex.weight, weighting.weight)
        check_agreement(weighting.total, ex.total)
        if rule.keeps_state:  # its update went ahead with ex.divisor
            check_divisor(ex.divisor, weighting.divisor)
    except TailtrainError as err:  # a static rule's is checked rounds later: say which
        raise TailtrainError(f"round {step}: {err}") from None
    loss_sum, units_done, gsq = ex.extras[:3].tolist()  # Python floats, not numpy's
    scalars = GradientStats(
        loss=loss_sum / units_done if units_done > 0 else math.nan,
        grad_sq_sum=gsq if units_done > 0 else math.nan,
    )
    used = screened_out(weighting.used, arrivals, ex.screened[:, 0] > 0)
    lr = run.world.lr * plan.lr_scale
    times = ex.rows[:, TIMES:]
    done.stats = closed_step_stats(
        step, plan.k, ex.time, arrivals, used, scalars, lr, times, ex.comm_time
    )
    rule.adapt(done.stats)
    return weighting


def settle(run: _Rank, timing: np.ndarray) -> None:
    """Settle the unsettled round with its gathered [allreduce, round seconds] (N, 2): the
    agreed clock at once, its record row later (:func:`flush`)."""
    done, run.unsettled = run.unsettled, None
    # every entry is a measured time: a round is settled by the one after it
    run.comm_time, elapsed = round_times(timing)
    # the deadline is learned from the settled rounds; a round after rank 0 wrote a
    # checkpoint holds the write, which is no round time (and is waited for: shrinkable_round)
    if run.shrinker is not None and not run.keeper.run.due(done.ex.step):
        run.shrinker.deadline.seen(elapsed)
    run.settled += elapsed
    run.now = run.settled
    run.trace.charge(done.ex.step, elapsed)
    # identities, not counts: a heal that also lost a member keeps the count, not the ranks
    if (
        run.shrinker is not None
        and done.live is not None
        and tuple(done.live) != tuple(run.shrinker.members)
    ):
        timing = lost_timings(done.live, run.shrinker.members, timing)
    run.settling.append((done, Settled(run.settled, run.comm_time), timing))


def flush(run: _Rank) -> None:
    """Record the settled rounds' rows, in order: every ``ROWS_AT_ONCE`` rounds in an
    allreduce's shadow, and before a snapshot, after a failure and at the end."""
    while run.settling:  # each leaves once recorded: a failure here records nothing twice
        done, settled, timing = run.settling[0]
        row = row_of(run, done, settled, timing)
        del run.settling[0]
        run.record.add_step(row)


def settle_last(run: _Rank) -> None:
    """The last round's timings, by a small all-gather (no next allreduce brings them)."""
    if run.unsettled is not None:
        settle(run, run.comm.gather(run.timing))
    flush(run)


def finish(run: _Rank) -> RankResult:
    """Gather the traces on rank 0, write the outputs, summarise (partial after Ctrl-C)."""
    if run.dealer is not None:  # every rank is past the last round (``settle_last``)
        run.dealer.close()
    if run.comm.rank == 0:
        topology = {**summarise(run.record), **time_means(run.record.steps)}
        if run.shrinker is not None:
            # each regroup: [generation, the round in flight, the ranks lost, taken in, seconds]
            topology["generations"] = [list(h) for h in run.shrinker.history]
            topology |= run.shrinker.deadline_summary()
        run.record.summary = run.keeper.run.summary(
            run.world, run.rule.strategy, run.record, topology
        )
    if run.config.out is not None:
        write_traces(run.config.out, run.trace, run.comm)
        if run.comm.rank == 0 and not run.interrupted:
            run.keeper.finish(run.record)
    if run.interrupted:
        run.keeper.interrupted(run.record, run.step)
    return RankResult(run.rank, run.record, run.learner.theta.numpy().copy())
