"""An allreduce round's way into the record (``rounds`` module docstring, 4. and 5.): the rule's
selection over every rank's arrival, checked against what the round reduced (:func:`account`),
the round settled by the timings the next allreduce brings (:func:`settle`), and its record row
made ``ROWS_AT_ONCE`` rounds at a time (:func:`flush`, :func:`row_of`)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from tailtrain.core.session import RunKeeper
from tailtrain.core.update import GradientStats, closed_step_stats, key_workers
from tailtrain.errors import TailtrainError
from tailtrain.runtime.allreduce.handover import lost_timings
from tailtrain.runtime.allreduce.state import TIMES, AllreduceRank, Unsettled
from tailtrain.runtime.control import (
    RankWeighting,
    check_agreement,
    check_divisor,
    check_own_weight,
    round_times,
    screened_out,
)
from tailtrain.runtime.telemetry import Settled, allreduce_row, split_round
from tailtrain.topology.allreduce import round_arrivals

#: settled rounds whose record rows are made together (:func:`flush`), a static rule's
#: accounted with them: one a round costs ~50-90 us (~150 accounted) with its code cold from
#: the compute, a batch a fraction of that
ROWS_AT_ONCE = 32


def account(run: AllreduceRank, done: Unsettled) -> RankWeighting:
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


def settle(run: AllreduceRank, timing: np.ndarray) -> None:
    """Settle the unsettled round with its gathered [allreduce, round seconds] (N, 2): the
    agreed clock at once, its record row later (:func:`flush`)."""
    done, run.unsettled = run.unsettled, None
    clock, shrinker = run.clock, run.membership.shrinker
    # every entry is a measured time: a round is settled by the one after it
    clock.comm_time, elapsed = round_times(timing)
    # the deadline is learned from the settled rounds; a round after rank 0 wrote a
    # checkpoint holds the write, which is no round time (and is waited for:
    # ``rounds.shrinkable_round``)
    if shrinker is not None and not run.keeper.run.due(done.ex.step):
        shrinker.deadline.seen(elapsed)
    clock.settled += elapsed
    clock.now = clock.settled
    run.trace.charge(done.ex.step, elapsed)
    # identities, not counts: a heal that also lost a member keeps the count, not the ranks
    if (
        shrinker is not None
        and done.live is not None
        and tuple(done.live) != tuple(shrinker.members)
    ):
        timing = lost_timings(done.live, shrinker.members, timing)
    run.settling.append((done, Settled(clock.settled, clock.comm_time), timing))


def flush(run: AllreduceRank) -> None:
    """Record the settled rounds' rows, in order: every ``ROWS_AT_ONCE`` rounds in an
    allreduce's shadow, and before a snapshot, after a failure and at the end."""
    while run.settling:  # each leaves once recorded: a failure here records nothing twice
        done, settled, timing = run.settling[0]
        row = row_of(run, done, settled, timing)
        del run.settling[0]
        run.record.add_step(row)


def settle_last(run: AllreduceRank) -> None:
    """The last round's timings, by a small all-gather (no next allreduce brings them)."""
    if run.unsettled is not None:
        settle(run, run.comm.gather(run.clock.timing))
    flush(run)


def estimated_row(run: AllreduceRank) -> dict[str, Any] | None:
    """The unsettled round's row as this rank knows it before its timings come: its time the
    agreed estimate, its allreduce seconds unknown. A checkpoint keeps it in that form."""
    done = run.unsettled
    if done is None:
        return None
    return row_of(run, done, Settled(done.ex.time, done.ex.comm_time), None)


def row_of(
    run: AllreduceRank, done: Unsettled, settled: Settled, timing: np.ndarray | None
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


def shrink_columns(run: AllreduceRank, done: Unsettled) -> dict[str, Any]:
    """A shrinking run's row columns (``runtime.elastic.shrink``): the ranks that stepped,
    those lost just before the round, the samples of the global batch of N ranks it did
    without (the lost shards'; none on demand, whose live ranks deal the whole pool:
    ``Rebalance.follow_world``), and when (Unix seconds) the round's update was applied
    here: the time from a fault to the next committed step is read off it and
    ``drills.jsonl``'s ``at``."""
    assert done.live is not None
    plan, n = done.ex.plan, run.world.scenario.workers
    units = plan.local_steps * done.ex.m
    # a plan of shares deals sum(shares) micro-batches of the N M sync would
    dealt = len(done.live) * units if plan.shares is None else int(sum(plan.shares))
    skipped = (n * units - dealt) * run.world.task.batch_size
    columns = {"live": list(done.live), "dead": list(done.dead), "skipped": int(skipped)}
    columns["rejoined"] = list(done.rejoined)
    return columns | {"committed_at": done.committed}
