"""The partial-collective topology of `tailtrain train`: eager-SGD (solo, majority, quorum) and
dbw-quorum on real ranks, over :class:`~tailtrain.runtime.partial.collective.PartialCollective`.

Rank p runs eager-SGD's Algorithm 2 as process p of ``sim.partial.engine`` does, with wall time
for the virtual clock:

1. its j-th gradient: the mini-batch ``tasks.stream.job_batches`` keyed by (seed, p, j), at
   its own model; with ``--delay`` it then sleeps the seconds the simulator charges worker p's
   j-th job (``World.durations``, the same seeded draws);
2. ``call`` of its step's round (late, waiting or active: ``runtime.partial.collective``);
3. it adopts the latest result, theta <- theta - lr * lr_scale * sum_i w g_i / divisor, through
   ``tailtrain.core.update.WeightedUpdate`` (a late rank skips the rounds it missed, eager-SGD §5),
   and after a round with ``average_models`` averages the models of all ranks (§5's periodic
   synchronisation; the staleness bound's synchronous rounds need no averaging).

The rule runs on every rank's reducer thread after each round (``runtime.partial.rule.Rule``:
the same arrivals on every rank, so every rank plans the same next round).

Evaluations: rank 0 scores the initial model, and the final one after a last average of the
models; scoring in between would stall rank 0 and make it the straggler. ``time`` is the
round's close on the run's clock (``RoundResult.closed``, plus the seconds of the launches
before a resume).

**Checkpoints** (``runtime.keep``, with ``--out``): of the *agreed model*, the model of a rank
that adopted every round, which each rank's reducer thread keeps with a snapshot of what the run
needs to go on (``runtime.partial.rule``); rank 0's main thread writes the latest every
``--checkpoint-every`` rounds, and after a failure the survivors' census writes the last round
every reducer completed.

**Resume.** Every rank loads the agreed model as its own (a resume is also a model average),
the rule's state, clock and generator; the next round is the checkpoint's round, and every
rank's job counter starts there too (job j of rank p is still the mini-batch keyed (seed, p,
j) and its injected delay the simulator's j-th): a rank that had been late skips the keys it
had not reached, and the rounds after the checkpoint are played again with the keys they used.
The send buffers start empty: a gradient buffered when the group failed, stale or waiting for
its round, is lost, as is the round in flight — that is what a restart may lose. A resumed
run therefore ends close to, not equal to, an uninterrupted one: the two differ by the private
model drift of late ranks and the buffered gradients at the checkpoint (a round whose every
rank was on time, with empty buffers, resumes exactly).

**Failure.** A rank that sees the group fail (its collective raised, or the launcher's
SIGTERM) freezes its snapshot (the reducer takes no more), stops the partial collective
(``PartialCollective.abort``: the reducer leaves its wait, and every surviving peer's receiver
leaves on this rank's ``ABORT``), takes part in the census with the rounds its reducer
completed, and leaves; the launcher's line names the dead rank and the round in flight. A
thread blocked inside a collective leaves once a peer exits; the census does not need it, and
a rank waits at most :data:`ABORT_WAIT` seconds for it. A rank that only hangs is no failure
here: the others go on without it (it is late). With ``--on-rank-loss shrink`` the survivors
go on in place instead (``runtime.partial.regroup``): a new generation of the live ranks from
the lead's agreed model, no restart, no checkpoint read.

**Ctrl-C** (``runtime.interrupt``) reaches every rank as a request that its main thread takes
before its next gradient: it leaves as from a failure (the census writes the checkpoint of the
last round every reducer completed), and rank 0 then keeps the record with its summary marked
partial (``Keeper.interrupted``).
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from tailtrain.core import envelope
from tailtrain.core.evaluation import Evaluator
from tailtrain.core.records import RunRecord
from tailtrain.core.scenario import World
from tailtrain.core.session import check_entry
from tailtrain.core.update import WeightedUpdate, screen_own
from tailtrain.runtime.config import RankResult, TrainConfig, build_world
from tailtrain.runtime.elastic.group import Broken
from tailtrain.runtime.elastic.shrink import OnRankLoss, Refused, Shrinker
from tailtrain.runtime.interrupt import (
    Stopped,
    check_interrupt,
    hold_sigterm,
    interrupt_requested,
    stop_on_sigterm,
)
from tailtrain.runtime.keep import Keeper, reopen_records
from tailtrain.runtime.partial.collective import (
    CollectiveFailed,
    CollectiveTimeout,
    PartialCollective,
)
from tailtrain.runtime.partial.regroup import (
    CollectivePhase,
    new_collective,
    publish_deadline,
    regroup_run,
)
from tailtrain.runtime.partial.rule import Rule
from tailtrain.runtime.partial.wire import row
from tailtrain.runtime.rank import Updates, drive_rank
from tailtrain.runtime.reduce import GRACE, Collectives
from tailtrain.runtime.telemetry import (
    TraceRows,
    attach,
    close_record,
    follow,
    split_step,
    time_means,
    time_row,
    write_rank_steps,
    write_traces,
)
from tailtrain.strategies.base import Strategy
from tailtrain.tasks.stream import job_batches
from tailtrain.topology.partial import summarise as partial_summary

log = logging.getLogger(__name__)

#: seconds a failed rank waits, after its census, for the collective's threads to leave
ABORT_WAIT = 1.0


@dataclass
class _Run:
    """One rank's run; lives only inside :func:`train_partial`."""

    config: TrainConfig
    world: World
    strategy: Strategy
    comm: Collectives
    rule: Rule
    evals: Evaluator
    keeper: Keeper
    theta: torch.Tensor
    #: this rank's measured jobs (``telemetry.write_traces``): one unit each, iteration = job
    trace: TraceRows
    #: each of this rank's steps (a job: compute, call, adopt) in parts (``telemetry.time_row``)
    step_times: list[dict[str, Any]] = field(default_factory=list)
    job: int = 0  # this rank's next job (module docstring: Resume)
    coll: PartialCollective | None = field(default=None, repr=False)
    #: this rank's original rank: its data shard and delays, whatever its index in a shrunk
    #: generation (``comm.rank``)
    rank: int = 0
    #: ``--on-rank-loss shrink``'s protocol (``runtime.partial.regroup``; None: stop)
    shrinker: Shrinker | None = None
    phase: CollectivePhase = CollectivePhase.RUNNING
    #: under shrink: each call ``[generation, job, version, adopted]`` (module docstring of
    #: ``runtime.partial.regroup``), and the calls made in the current generation
    calls: list[list[Any]] = field(default_factory=list)
    #: the calls a regroup has accounted for (``runtime.partial.regroup``, HANDOVER), and
    #: the longest step rank 0 last told the store (``regroup.publish_deadline``)
    accounted: int = 0
    published: float = 0.0

    # ---- the topology's contract (``runtime.rank.RankRun``) ----------------------------------
    def updates(self) -> Updates:
        return rounds(self)

    def failed(self, exc: BaseException) -> BaseException:
        if isinstance(exc, Refused):  # the survivors went on without it: nothing to keep
            self.phase = CollectivePhase.REFUSED
            log.warning("%s", exc)
            return exc
        return failed(self, exc)

    def finish(self) -> RankResult:
        return finish(self)


def train_partial(config: TrainConfig, comm: Collectives) -> RankResult:
    """Run ``config`` as rank ``comm.rank`` under a partial-collective rule (module docstring).

    When the group fails this rank stops the collective, takes part in the survivors' census
    and checkpoint (``runtime.keep.Keeper.failed``) and leaves."""
    stop_on_sigterm()
    return drive_rank(start(config, comm), comm.drill)


def start(config: TrainConfig, comm: Collectives) -> _Run:
    world, strategy = build_world(config)
    scenario, rank, n = world.scenario, comm.rank, comm.world_size
    check_entry(world, n)
    task = world.task
    theta = task.init_params(world.seed)
    task.grads(theta, batch(world, rank, 0))  # build torch.func machinery before the clock
    keeper = Keeper.of(config, world, strategy, rank, n)
    kept = keeper if config.out is not None else None
    rule = Rule(world, strategy, rank, rank == 0, theta, kept)
    if rule.record is not None:
        follow(rule.record, config, world, True)
    # every rank follows the schedule, the others into a record of their own, without scoring
    rule.evals = evals = Evaluator(scenario.evaluation, rule.record or RunRecord(), True)
    trace = TraceRows(rank, per_micro_batch=False, charged=True)
    run = _Run(config, world, strategy, comm, rule, evals, keeper, theta, trace, rank=rank)
    if config.on_rank_loss == OnRankLoss.SHRINK:
        run.shrinker = Shrinker.start(comm, config.timeout)
        rule.members = list(range(n))
    rejoining = run.shrinker is not None and run.shrinker.rejoining
    if keeper.saved is not None and not rejoining:  # a restarted rank heals from a live peer
        resume(run, keeper.saved)
    elif config.out is not None and rank == 0:
        attach(rule.record, reopen_records(config.out, None, None)[0])
    scorer = (lambda: task.evaluate(theta)) if rank == 0 else dict
    keeper.run.begin(evals, scorer, resumed=keeper.saved is not None)
    return run


def resume(run: _Run, saved: dict[str, Any]) -> None:
    """Go on from a checkpoint :meth:`Rule.state_dict` made (module docstring: Resume)."""
    rule = run.rule
    rule.load_state_dict(saved)
    run.theta, run.job = rule.agreed, rule.base
    counts = {name: int(saved["rows"][name]) for name in ("steps", "evals")}
    if run.comm.rank == 0:
        sink, rows = reopen_records(run.config.out, counts, rule.last_row)
        attach(rule.record, sink)
        rule.record.steps, rule.record.evals = rows["steps"], rows["evals"]
    else:  # the others keep the number of evaluations before it and the last of them
        run.evals.record.evals = envelope.eval_tail(saved)[-1:] * counts["evals"]
    run.keeper.completed(rule.done, rule.state_dict, save=False)


def rounds(run: _Run) -> Updates:
    """Every round until the plan ends, then the final model average; each round's index is
    yielded as this rank starts its gradient for it (``runtime.rank``: the drills)."""
    world, rule, shrinker = run.world, run.rule, run.shrinker
    if not world.finished(rule.done, rule.now):
        if shrinker is not None and shrinker.rejoining:  # started again: join the live ranks
            regroup_run(run, None, join=True)
        else:
            run.coll = new_collective(run)
        # each turn: a generation's rounds, then (shrink) a new generation's collective, or
        # None when the run is over
        while run.coll is not None:
            try:
                yield from run_rounds(run)
                if not rule.growing:
                    break
                run.coll.close()  # a rank asks to join: this generation ends cleanly
            except (CollectiveFailed, CollectiveTimeout, Broken) as exc:
                if shrinker is None:
                    raise
                regroup_run(run, exc)
                continue
            regroup_run(run, None, grow=True)
        if run.coll is not None:
            run.coll.close()
    if run.shrinker is not None:
        run.shrinker.finished()  # a rank waiting to join is refused now
    comm = run.comm
    run.theta = comm.weighted_sum(run.theta, 1.0 / comm.world_size).numerator  # the final sync


def failed(run: _Run, exc: BaseException) -> BaseException:
    """The group failed: freeze the snapshot, stop the collective, census and checkpoint; the
    exception to end with. A rank the launcher stopped leaves at once after the census."""
    hold_sigterm()  # the census runs to its end (runtime.keep)
    run.rule.freeze()
    if run.coll is not None:
        run.coll.abort()
    end = run.keeper.failed(run.rule.done, exc, run.config.timeout)
    if run.coll is not None and not run.coll.abort(ABORT_WAIT):
        log.info("the collective's threads are still in a collective; they end with this rank")
    if interrupt_requested():  # Ctrl-C, not a failure: rank 0 keeps the run, partial
        if run.rule.record is not None:
            run.rule.record.summary = summarise(run, run.rule.record)
        run.keeper.interrupted(run.rule.record, run.rule.done)
    if run.rule.record is not None:  # flush steps.jsonl and TensorBoard before leaving
        close_record(run.rule.record)
    if isinstance(exc, Stopped):
        os._exit(143)
    if isinstance(exc, CollectiveFailed | CollectiveTimeout):  # it saw a peer fail: as
        time.sleep(GRACE)  # runtime.reduce's ranks do, it waits, so the first to fail is named
    return end


def finish(run: _Run) -> RankResult:
    """Score the final model, summarise, close the run folder (rank 0)."""
    world, rule, evals, rank = run.world, run.rule, run.evals, run.comm.rank
    step = rule.done  # the run's round count
    if run.config.out is not None:  # every rank: rank 0 gathers the traces
        write_traces(run.config.out, run.trace, run.comm)
    calls: dict[str, list[list[Any]]] = {}
    if run.shrinker is None:
        steps = run.comm.gather_objects(run.step_times)  # every rank: rank 0 takes the means
    else:  # and each member's calls, from which its parameters can be rebuilt
        both = run.comm.gather_objects((run.step_times, run.calls))
        steps = None if both is None else [times for times, _ in both]
        members = run.rule.members or []
        calls = {str(m): c for m, (_, c) in zip(members, both or [], strict=False)}
    if rank == 0 and run.config.out is not None:
        write_rank_steps(run.config.out, steps)
    final = evaluate_once(world.task, run.theta) if rank == 0 else dict
    if not world.scenario.evaluation.on_time_grid:  # the every-U-updates schedule's last point
        run.keeper.run.stepped(evals, step, rule.now, final, final)
    run.keeper.run.end(evals, step, rule.now, final, interrupted=False)
    record = rule.record or RunRecord()
    if rank == 0:
        record.summary = summarise(run, record, [row for rows in steps or [] for row in rows])
        if run.shrinker is not None:
            # each regroup: [generation, its first round, the ranks lost, taken in, seconds]
            record.summary["generations"] = [list(h) for h in run.shrinker.history]
            record.summary["calls"] = calls
            # the allreduce's keys: the deadline that decided the latest break (bench_faults)
            record.summary |= run.shrinker.deadline_summary()
        if run.config.out is not None:
            run.keeper.finish(record)
    return RankResult(rank, record, run.theta.numpy().copy())


def summarise(run: _Run, record: RunRecord, steps: list[dict] | None = None) -> dict[str, Any]:
    """simulate's summary keys of ``record`` on the wall clock (``core.session.RunKeeper``)
    and the means of every rank's ``steps`` parts (``telemetry.time_means``: per job and
    rank; they sum to the mean seconds of a rank's step, not of a round)."""
    topology = {**partial_summary(record), **time_means(steps or [])}
    return run.keeper.run.summary(run.world, run.strategy, record, topology)


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


def run_rounds(run: _Run) -> Updates:
    """The main thread: compute, (sleep the injected delay), call, adopt; until the plan ends.
    ``step`` counts this launch's rounds (the collective's), ``rule.base + step`` the run's."""
    config, world, coll, rule, comm = run.config, run.world, run.coll, run.rule, run.comm
    assert coll is not None
    rank, n = run.rank, comm.world_size  # the original rank: shard and delays (a shrink)
    durations = world.durations(round_trips=False)
    durations.next_job[rank] = run.job  # the j-th job sleeps the simulator's j-th delay
    me = np.array([rank])
    update = WeightedUpdate(world.lr)
    step, averaged, written = 0, 0, rule.done
    adopted = -1  # the run's last round this rank adopted in this generation (shrink)
    timed = None  # the last job's (job, start, parts): its step ends where the next begins
    while coll.plan(step) is not None:
        check_interrupt(rule.base + step)  # Ctrl-C: leave before the next gradient
        yield rule.base + step  # the drills (``runtime.rank``)
        start = coll.now()
        if timed is not None:
            time_step(run, *timed, start)
        loss, grad = world.task.grads(run.theta, batch(world, rank, run.job))
        loss, grad = float(loss[0]), grad[0]
        slept = 0.0
        if config.inject:
            seconds = float(durations.peek(me, np.array([rule.origin + start]))[0])
            durations.advance(me)
            time.sleep(seconds)
            slept = seconds
        unit = coll.now() - start
        run.trace.add(run.job, 1, 1, (unit,), slept=slept)  # the job's unit, as trace: reads
        comm.drill.poison(rule.base + step, grad)
        grad, loss, screened, gsq = screen_own(
            grad, loss, config.on_nonfinite, rank, rule.base + step
        )
        called = coll.now()
        if run.shrinker is not None:  # the record of calls (``runtime.partial.regroup``)
            call = [run.shrinker.generation, run.job, rule.base + step, None]
            run.calls.append(call)
        seen = adopted if run.shrinker is not None else -1
        out = coll.call(step, grad, row(run.job, step, start, called, loss, gsq, seen, screened))
        returned = coll.now()
        if run.shrinker is not None:  # the record of calls, and the learned deadline
            call[3] = adopted = rule.base + out.result.index
            # a live member may be anywhere in a step when a peer fails: the census window
            # and the deadline follow whole steps (compute, delay, call), not the calls alone
            run.shrinker.deadline.seen(returned - start)
        # the call waited for the round it adopts to close (its last snapshot), then the
        # round was the collective's own: its data phase, the rule, an injected T^c
        own = returned - max(out.result.closed, called)
        timed = (run.job, start, (unit, slept, returned - called, own))
        done = out.result.index
        total, divisor, lr_scale = rule.steps[done]
        run.theta = update.apply_reduced(run.theta, total.to(run.theta.dtype), divisor, lr_scale)
        while averaged < len(rule.averages) and rule.averages[averaged] <= done:
            run.theta = comm.weighted_sum(run.theta, 1.0 / n).numerator
            rule.rebase(rule.averages[averaged], run.theta)
            averaged += 1
        written = run.keeper.save_due(written)
        step, run.job = done + 1, run.job + 1
        if run.shrinker is not None and comm.rank == 0:
            publish_deadline(run)
            if run.shrinker.joins_waiting():
                coll.grow_asked = True  # the next snapshot says so: every rank learns it alike
    if timed is not None:
        time_step(run, *timed, coll.now())


def time_step(run: _Run, job: int, start: float, parts: tuple, end: float) -> None:
    """Job ``job``'s step, from its start to ``end`` (the next job's start), in its parts
    (``telemetry.split_step``); its wall seconds charge the trace's ``noncompute``."""
    times = split_step(*parts, end - start)
    run.step_times.append({"job": job, **time_row(times)})
    run.trace.charge(job, times.wall)
