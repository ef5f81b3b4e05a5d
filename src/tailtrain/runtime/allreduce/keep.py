"""An allreduce rank's checkpoint (``rounds`` module docstring, Checkpoints): its state after a
round, which is the run's (:func:`state_of`), going on from one (:func:`resume_round`), and the rows
so far after a failure (:func:`rows_so_far`). ``runtime.keep`` writes and finds them."""

from __future__ import annotations

from typing import Any

from tailtrain.core import checkpoint, envelope
from tailtrain.runtime.allreduce.accounts import estimated_row, flush
from tailtrain.runtime.allreduce.state import AllreduceRank
from tailtrain.runtime.keep import reopen_records
from tailtrain.runtime.telemetry import attach


def state_of(run: AllreduceRank) -> dict[str, Any]:
    """This rank's envelope after a round (``core.envelope``): the run's, as every rank holds
    the same (``rounds`` module docstring). The parameters by reference (an update replaces
    them), the rest copied; its parts: the learner, the clock's settled and communication
    seconds, and the delay draws."""
    flush(run)
    steps, evals = run.record.steps, run.evals.record.evals
    return envelope.seal(
        step=run.step,
        now=run.clock.now,
        rule=run.rule.state_dict(),
        update=run.update.state_dict(),
        evals=run.evals,
        rows=envelope.rows_at(len(steps), steps[-1:], len(evals), evals[-1:]),
        pending=estimated_row(run),
        settled=float(run.clock.settled),
        comm_time=float(run.clock.comm_time),
        learner=checkpoint.capture(run.learner, checkpoint.MODEL_STATIC),
        clock=checkpoint.with_comm(run.injector.clock, ("process",)),
        delays=checkpoint.delay_state(run.world.process),
    )


def resume_round(run: AllreduceRank, saved: dict[str, Any]) -> None:
    """Go on from a checkpoint :func:`state_of` made. Rank 0 continues the record in the
    folder; the others keep only the number of rows before it and the last of them."""
    run.step, run.clock.now = int(saved["step"]), float(saved["now"])
    checkpoint.restore(run.learner, saved["learner"])
    envelope.unseal(saved, rule=run.rule, update=run.update, evals=run.evals)
    # a checkpoint taken after a shrink holds the rule for the smaller world; this run is whole
    followed = run.rule.followed(run.world.context)
    if followed is not None:
        run.rule = followed
    checkpoint.restore_with_comm(run.injector.clock, saved["clock"])
    checkpoint.restore_delays(run.world.process, saved["delays"])
    counts = {name: int(saved["rows"][name]) for name in ("steps", "evals")}
    last_step = next(iter(envelope.step_tail(saved)[-1:]), None)
    if run.comm.rank == 0:
        sink, rows = reopen_records(run.config.out, counts, last_step)
        attach(run.record, sink)
        run.record.steps, run.record.evals = rows["steps"], rows["evals"]
    else:
        run.record.steps = [last_step] * counts["steps"]
        run.evals.record.evals = envelope.eval_tail(saved)[-1:] * counts["evals"]
    pending = envelope.pending(saved)
    run.clock.settled, run.clock.comm_time = float(saved["settled"]), float(saved["comm_time"])
    if pending is not None:  # its timings were to come with the next round: keep the estimate
        run.record.add_step(pending)
        run.clock.settled = run.clock.now
    run.keeper.completed(run.step, lambda: state_of(run), save=False)


def rows_so_far(run: AllreduceRank) -> dict[str, Any] | None:
    """After a failure: record the completed rounds' rows, and return (rank 0) the unsettled
    one's estimate. A static rule's rounds are accounted here, running the rule: the rows end
    at a round whose accounting fails, and the failure path goes on."""
    try:
        flush(run)
        return estimated_row(run) if run.comm.rank == 0 else None
    except Exception as err:  # the census and checkpoint must still run
        run.log.warning("the rows end at a round whose accounting failed: %s", err)
        return None
