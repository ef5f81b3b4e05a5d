"""The allreduce topology of `tailtrain train`: sync, DropCompute, Local-SGD and rebalance on
real ranks.

Rank n runs round r exactly like worker n of ``sim.allreduce.engine``, with wall time for the
virtual clock and the same rule object deciding (``runtime.control``):

1. ``plan``: tau, M, H and, for rebalance, the per-rank shares (identical on every rank:
   same state). A plan of shares has rank n compute ``shares[n]`` micro-batches of sync's
   global batch, dealt as the simulator deals it (``deal.Shares``); the gathered rows are as
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

This module is the rank loop and the round (:func:`one_round`); the round's variants and its
books live beside it, each working on the rank's state (``allreduce.state``: the run, its
agreed clock and its membership under shrink):

* ``allreduce.deal``: 1., the deal of a plan (its own shard, per-rank shares, on demand):
  batches, injected seconds, the rows' width and what every rank keeps after the allreduce;
* ``allreduce.accounts``: 4. and 5., the selection and its checks, settling and record rows;
* ``allreduce.keep``: the checkpoint's state and resuming from it;
* ``allreduce.handover``: the state a regroup hands over under ``--on-rank-loss shrink``.
"""

from __future__ import annotations

import contextlib
import datetime
import math
import os
import time
from typing import Any

import numpy as np

from tailtrain.core.evaluation import Evaluator
from tailtrain.core.records import RunRecord
from tailtrain.core.scenario import budget_spent
from tailtrain.core.session import check_entry
from tailtrain.core.update import WeightedUpdate, screen_own
from tailtrain.runtime.allreduce.accounts import (
    ROWS_AT_ONCE,
    account,
    flush,
    settle,
    settle_last,
)
from tailtrain.runtime.allreduce.deal import Deal, deal_for
from tailtrain.runtime.allreduce.handover import drawn_now, sync_from_lead
from tailtrain.runtime.allreduce.keep import resume_round, rows_so_far, state_of
from tailtrain.runtime.allreduce.state import TIMES, AllreduceRank, Exchange, Unsettled
from tailtrain.runtime.config import RankResult, TrainConfig, build_world
from tailtrain.runtime.control import RankWeighting, RuleDriver
from tailtrain.runtime.dealer import Dealer
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
from tailtrain.runtime.reduce import (
    Collectives,
    PeerFailure,
    SumBuffer,
    WeightedSum,
    contribute,
)
from tailtrain.runtime.telemetry import (
    RankLog,
    TraceRows,
    attach,
    close_record,
    phase,
    run_record,
    time_means,
    write_traces,
)
from tailtrain.runtime.units import RankWork
from tailtrain.strategies.base import AllreducePlan as Plan
from tailtrain.topology.allreduce import RoundData, own_arrival, summarise

#: the allreduce's extras: [loss sum, units, ||G_n||^2, non-finite, weight withheld, Ctrl-C,
#: a rank asks to join (``runtime.elastic.shrink``)]
EXTRAS = 7


class _Rank(AllreduceRank):
    """One rank's run (``allreduce.state.AllreduceRank``) as the topology's contract
    (``runtime.rank.RankRun``) drives it."""

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


def failed(run: AllreduceRank, exc: BaseException) -> BaseException:
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


def rounds(run: AllreduceRank) -> Updates:
    """The rounds until the budget is spent, each followed by its evaluations and snapshot;
    each round's index is yielded as its work starts (``runtime.rank``: the drills)."""
    scenario, keeper, members = run.world.scenario, run.keeper.run, run.membership
    keeper.begin(run.evals, scorer(run), resumed=run.keeper.saved is not None)
    if members.shrinker is not None and members.shrinker.rejoining:  # started again: join
        shrink(run, join=True)
    else:
        run.comm.barrier()  # round 0 starts together, as the simulator's workers all start at 0
    while not run.interrupted and not budget_spent(
        scenario, run.step, run.clock.now, (plan := run.rule.plan()).iteration_scale
    ):
        before = scorer(run)
        yield run.step
        if members.shrinker is None:
            one_round(run, plan)
            if keeper.stepped(run.evals, run.step, run.clock.now, before, scorer(run)):
                run.comm.barrier()
        else:
            try:
                shrinkable_round(run, plan, before)
                if members.grow:  # a rank asked to join: every member takes it in now
                    shrink(run, grow=True)
            except (Broken, PeerFailure) as exc:
                run.log.warning("%s", exc)
                if run.dealer is not None:  # before the census: no waiter on a stale round
                    run.dealer.broke(members.shrinker.generation, run.step)
                shrink(run)
                continue
        run.keeper.completed(run.step, lambda: state_of(run))
    if members.shrinker is not None:
        members.shrinker.finished()
    settle_last(run)
    keeper.end(run.evals, run.step, run.clock.now, scorer(run), interrupted=run.interrupted)


def shrinkable_round(run: AllreduceRank, plan: Plan, before: Any) -> None:
    """One round under ``--on-rank-loss shrink``: the delay draws kept before it draws its own
    (a round in flight is computed again after a shrink), the barrier after rank 0's
    evaluation bounded by --timeout rather than the deadline."""
    assert run.membership.shrinker is not None
    run.membership.drawn = drawn_now(run)
    watch = run.comm.watch
    # rank 0 wrote a checkpoint after the last round (runtime.keep): the others wait for the
    # write in this round's allreduce up to --timeout, not the deadline
    watch.patient = run.keeper.run.due(run.step)
    try:
        one_round(run, plan)
    finally:
        watch.patient = False
    run.membership.drawn = drawn_now(run)  # completed: a break in the barrier redoes no round
    if run.keeper.run.stepped(run.evals, run.step, run.clock.now, before, scorer(run)):
        watch = run.comm.watch
        watch.patient = True
        try:
            run.comm.barrier()
        finally:
            watch.patient = False


def shrink(run: AllreduceRank, grow: bool = False, join: bool = False) -> None:
    """The survivors' census (``grow``: the members' step boundary that takes joiners in),
    their new generation and its sync from the lead member (``runtime.elastic.shrink``);
    this rank goes on from the round the lead completed."""
    members = run.membership
    shrinker = members.shrinker
    assert shrinker is not None
    members.grow = members.joins_waiting = False
    if grow:  # at a step boundary the draws are the next round's
        members.drawn = drawn_now(run)
    flush(run)
    rows = len(run.record.steps)
    sync = lambda new, found: sync_from_lead(run, new, found)  # noqa: E731
    broken = shrinker.generation
    comm, found = shrinker.regroup(run.comm, run.step, rows, sync, grow=grow, join=join)
    if run.dealer is not None and not join:
        # what the round in flight had dealt, dealt again now (a grow is at a step boundary)
        run.dealer.regrouped(broken, run.step, in_flight=not grow)
    run.comm, run.sums = comm, None
    run.rule, _ = follow_live(run.rule, run.world.context, found.members)
    members.lost = tuple(sorted({*members.lost, *found.dead}))
    members.joined = tuple(sorted({*members.joined, *found.joined}))


def scorer(run: AllreduceRank):
    """Scores of today's parameters when called (rank 0 logs them; the others score none)."""
    theta = run.learner.theta
    if run.comm.rank != 0:
        return dict

    def scores() -> dict:
        values = run.world.task.evaluate(theta)
        run.log.info("train loss %.4f at %.3fs", values["train_loss"], run.clock.now)
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
        trace=TraceRows(
            comm.rank,
            scenario.micro_batches is not None,
            charged=True,
            cuttable=getattr(world.process, "cuttable", True),
        ),
        record=(record := run_record(config, world, comm.rank == 0)),
        evals=Evaluator(scenario.evaluation, record if comm.rank == 0 else RunRecord(), True),
        update=WeightedUpdate(world.lr, config.on_nonfinite),
        grads=grads,
        keeper=keeper,
        rank=comm.rank,
    )
    shrinker = None
    if config.on_rank_loss == OnRankLoss.SHRINK:
        shrinker = run.membership.shrinker = Shrinker.start(comm, config.timeout)
    if "demand" in strategy.needs:
        run.dealer = Dealer.open(datetime.timedelta(seconds=config.timeout), comm.rank == 0)
    if keeper.saved is not None and (shrinker is None or not shrinker.rejoining):
        resume_round(run, keeper.saved)  # a rank started again takes a live peer's state instead
    elif config.out is not None and comm.rank == 0:
        attach(run.record, reopen_records(config.out, None, None)[0])
    return run


def one_round(run: AllreduceRank, plan: Plan) -> None:
    """One round of this rank (module docstring, 1.-5.): the deal's micro-batches computed
    into the reduce buffer, the one weighted allreduce, what every rank keeps of the round's
    data, the previous round settled by the timings it brought, the rule's selection (now, or
    with the row for a static rule), the update, and the round's trace."""
    m = plan.micro_batches or run.world.scenario.micro_batches or 1
    run.log.step = run.step
    dealt = deal_for(run, plan, m)
    started = time.perf_counter()
    sums = sum_buffer(run, dealt.width, dealt.indexed)
    with phase("compute"):
        # the gradient goes straight into the reduce buffer when both are on the CPU
        work = dealt.work(run, sums.grad if sums.host is not None else None)
    if work.done:
        run.comm.drill.poison(run.step, work.grad)
    rank, step, now, units = run.comm.rank, run.step, run.clock.now, plan.local_steps * m
    own = run.rule.own_weight(
        work.done, units, lambda: own_arrival(step, now, rank, work.done, work.compute, units)
    )
    with phase("reduce") as reducing:
        reduced, excluded = reduce(run, work, own.weight, sums, dealt.indices())
    run.interrupted = reduced.extras[5] > 0
    run.membership.grow = reduced.extras[6] > 0
    dealt_counts = dealt.keep(run, reduced.rows)
    if run.unsettled is not None:
        settle(run, reduced.rows[1])
    done = unsettled(run, dealt, now, reduced, own, excluded, dealt_counts)
    # a static rule's next plan owes nothing to this round's statistics: they wait for its row
    divisor = own.divisor if run.rule.keeps_state else account(run, done).divisor
    apply(run, reduced, divisor, plan.lr_scale)
    if run.membership.shrinker is not None:
        done.committed = time.time()
    run.unsettled, run.clock.now = done, done.ex.time
    traced = dealt.traced(work.times)
    run.trace.add(
        run.step, m, plan.local_steps, traced, work.cut, work.cut_whole, work.injected, work.compute
    )
    run.step += 1
    run.clock.timing = (reducing.seconds, time.perf_counter() - started)


def unsettled(
    run: AllreduceRank,
    dealt: Deal,
    now: float,
    reduced: WeightedSum,
    own: RankWeighting,
    excluded: float,
    dealt_counts: np.ndarray | None,
) -> Unsettled:
    """The round that started at ``now`` as its allreduce left it, on its way to the record,
    with the agreed clock at its end (module docstring, 5.): the settled rounds plus the
    slowest compute and the latest T^c; under shrink, the generation it ran in and the ranks
    lost and taken in just before it."""
    rows, _, screened = reduced.rows[:3]
    clock, members = run.clock, run.membership
    estimate = max(rows[:, 1].tolist()) + (0.0 if math.isnan(clock.comm_time) else clock.comm_time)
    ex = Exchange(
        run.step,
        now,
        dealt.plan,
        dealt.m,
        rows,
        reduced.extras,
        screened,
        own.weight,
        reduced.total + excluded,
        clock.settled + estimate,
        clock.comm_time,
        own.divisor,
        dealt_counts,
    )
    done = Unsettled(ex)
    if members.shrinker is not None:
        done.live, done.dead, members.lost = tuple(members.shrinker.members), members.lost, ()
        done.rejoined, members.joined, done.index = members.joined, (), run.comm.rank
        done.rule = run.rule
    return done


def sum_buffer(run: AllreduceRank, units: int, indices: bool = False) -> SumBuffer:
    """The round's reduce buffer: the last one while the layout of the rows stays. A round
    dealt on demand adds a block of the units' dealt indices."""
    # the gathered row, [allreduce, round seconds], screened (and the dealt indices)
    widths = [TIMES + units, 2, 1] + ([units] if indices else [])
    if run.sums is None or run.sums.widths != widths:
        dim, dtype = run.learner.theta.numel(), run.learner.theta.dtype
        run.sums = SumBuffer(run.comm, dim, EXTRAS, widths, dtype)
    return run.sums


def reduce(
    run: AllreduceRank,
    work: RankWork,
    weight: float,
    sums: SumBuffer,
    indices: list[int] | None = None,
) -> tuple[WeightedSum, float]:
    """The round's one allreduce (module docstring, 3.) and the injected T^c; returns it and
    the weight this rank withheld. A rank whose gradient holds a NaN or an infinity joins with
    weight 0 and a zero gradient, as the simulator's update path screens it
    (``tailtrain.core.update``), and flags itself in a gathered column of its own, so that every
    rank leaves it out of the round's used arrivals. While the collective runs, this rank
    makes the record rows of the rounds settled since the last batch (``accounts.flush``, every
    ``ROWS_AT_ONCE`` rounds), which need nothing from it."""
    _, loss_sum, bad, sq_norm = screen_own(
        work.grad, work.loss_sum, run.update.on_nonfinite, run.comm.rank, run.step
    )
    mine, done = contribute(work.grad, weight, bad=bad), work.done
    if bad:
        run.log.warning("non-finite gradient: this rank joins the round with weight 0")
        loss_sum, done = 0.0, 0
    gsq = sq_norm if done > 0 else 0.0
    members = run.membership
    joins = float(members.joins_waiting)
    extras = (loss_sum, done, gsq, float(bad), mine.withheld, float(interrupt_requested()), joins)
    # lists, not arrays: the buffer takes them in one write (SumBuffer.fill)
    row = [work.done, work.compute, work.injected, *work.times]
    rows: tuple = (row, run.clock.timing, (float(bad),))
    if indices is not None:  # on demand: the micro-batch of each unit, -1 past them
        rows += (indices + [-1] * (len(work.times) - len(indices)),)
    grad = mine.values
    pending = run.comm.start(sums, mine.weight, extras, rows, None if grad is sums.grad else grad)
    if members.shrinker is not None and run.comm.rank == 0:  # in the collective's shadow
        members.joins_waiting = members.shrinker.joins_waiting()
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


def apply(run: AllreduceRank, reduced: WeightedSum, divisor: float | None, lr_scale: float) -> None:
    """theta <- theta - lr * lr_scale * sum_n w_n G_n / denominator, the denominator the
    rule's ``divisor`` or (None) the reduced sum of the weights."""
    divisor = reduced.total if divisor is None else divisor
    # nobody computed anything: every weight and the weighted sum are 0, and so is the step
    divisor = divisor if divisor != 0 else 1.0
    theta = run.learner.theta
    numerator = reduced.numerator.to(theta.device)  # a GPU buffer's sum (nccl, gloo on CUDA)
    run.learner.theta = run.update.apply_reduced(theta, numerator, divisor, lr_scale)


def finish(run: AllreduceRank) -> RankResult:
    """Gather the traces on rank 0, write the outputs, summarise (partial after Ctrl-C)."""
    if run.dealer is not None:  # every rank is past the last round (``settle_last``)
        run.dealer.close()
    if run.comm.rank == 0:
        topology = {**summarise(run.record), **time_means(run.record.steps)}
        shrinker = run.membership.shrinker
        if shrinker is not None:
            # each regroup: [generation, the round in flight, the ranks lost, taken in, seconds]
            topology["generations"] = [list(h) for h in shrinker.history]
            topology |= shrinker.deadline_summary()
            if run.dealer is not None:  # per generation: the round in flight's deal, redone
                topology["redone_micro_batches"] = list(run.dealer.redone)
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
