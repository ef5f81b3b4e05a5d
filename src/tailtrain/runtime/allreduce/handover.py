"""The allreduce's payload in a regroup's state handover under ``--on-rank-loss shrink``
(``runtime.elastic.shrink``, SYNCING): what the lead member sends over the new generation,
what the others take from it, the delay draws kept so that a round in flight is drawn again
alike on every member, and a round's timings laid out for the ranks it had. Who leads and how
the state travels are ``runtime.elastic.handover``'s; ``rounds`` drives these at each
regroup."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from tailtrain.core import checkpoint, envelope
from tailtrain.runtime.elastic.group import GroupCollectives
from tailtrain.runtime.elastic.handover import elect, hand_over, pass_drills
from tailtrain.runtime.elastic.shrink import Census

if TYPE_CHECKING:
    from tailtrain.runtime.allreduce.state import AllreduceRank


def drawn_now(run: AllreduceRank) -> dict[str, Any]:
    """The delay draws as they stand (the clock and the delay process)."""
    return {
        "clock": checkpoint.with_comm(run.injector.clock, ("process",)),
        "delays": checkpoint.delay_state(run.world.process),
    }


def sync_from_lead(run: AllreduceRank, comm: GroupCollectives, found: Census) -> None:
    """The lead member's state on every member of the new generation (``found``'s members:
    ``runtime.elastic.handover``); nothing changes here before it has come."""
    lead = elect(comm, run.step, len(run.record.steps))
    state = hand_over(comm, lead, lambda: lead_state(run, lead.fewest))
    if not lead.leads:
        take_state(run, state, lead.rows[lead.mine] - lead.fewest)
    else:  # the lead drew its round in flight too: every member redraws it alike
        restore_drawn(run, run.membership.drawn)


def lead_state(run: AllreduceRank, fewest: int) -> dict[str, Any]:
    """What the others take from the lead: its envelope (``core.envelope``) after its last
    completed round, with the record rows past the ``fewest`` any member holds; its parts: the
    round's clock record, the learner, the unsettled rounds and the delay draws kept."""
    shrinker = run.membership.shrinker
    steps = run.record.steps
    return envelope.seal(
        step=run.step,
        now=run.clock.now,
        rule=run.rule.state_dict(),
        update=run.update.state_dict(),
        evals=run.evals,
        rows=envelope.rows_at(len(steps), steps[fewest:]),
        deadline=list(shrinker.deadline.recent) if shrinker is not None else None,
        round_clock=replace(run.clock),
        learner=checkpoint.capture(run.learner, checkpoint.MODEL_STATIC),
        unsettled=run.unsettled,
        drawn=run.membership.drawn,
    )


def take_state(run: AllreduceRank, state: dict[str, Any], have: int) -> None:
    """Go on from the lead's ``state``; ``have``: the rows of its tail this rank already
    holds (every rank's rows are the same, made from gathered data)."""
    run.step = int(state["step"])
    run.clock = replace(state["round_clock"])
    checkpoint.restore(run.learner, state["learner"])
    envelope.unseal(state, rule=run.rule, update=run.update, evals=run.evals)
    run.unsettled, run.settling = state["unsettled"], []
    for row in envelope.step_tail(state)[have:]:
        run.record.add_step(row)
    restore_drawn(run, state["drawn"])
    if run.membership.shrinker is not None and state["deadline"] is not None:
        run.membership.shrinker.deadline.adopt(state["deadline"])  # every member learns alike
    pass_drills(run.comm, run.step)  # the rounds this rank skipped


def restore_drawn(run: AllreduceRank, drawn: dict[str, Any] | None) -> None:
    """The delay draws as :func:`drawn_now` kept them (None: nothing kept yet)."""
    if drawn is not None:
        checkpoint.restore_with_comm(run.injector.clock, drawn["clock"])
        checkpoint.restore_delays(run.world.process, drawn["delays"])


def lost_timings(live: tuple[int, ...], members: list[int], timing: np.ndarray) -> np.ndarray:
    """A round's timings laid out for its own generation's ``live`` ranks, from ``timing``
    gathered over the next generation's ``members``: NaN for the ranks lost between."""
    full = np.full((len(live), timing.shape[1]), np.nan)
    for n, rank in enumerate(members):
        if rank in live:
            full[live.index(rank)] = timing[n]
    return full
