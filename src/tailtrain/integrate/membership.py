"""A user's loop in the elastic layer: what a shrink or a heal hands over, and what the records
say (``runtime.elastic``; issue 35 item 6, issue 37 item 6).

Both loop entries that shrink stand on one :class:`LoopMembership`: ``integrate.step``'s
``StragglerStep`` (it owns the loop's step) and ``integrate.elastic_ddp`` (a
``DistributedDataParallel`` job with the DDP comm hook's state). Each runs its own round; this
module holds what follows a round, the same for both:

* **a break** (:meth:`LoopMembership.broke`): the survivors' census, new generation and sync
  from the lead (``Shrinker.regroup``: CENSUS, FORMING, SYNCING of ``runtime.elastic.shrink``),
  the rule following the live world (``handover.follow_live``). The lead is the member that
  completed the most rounds, so it holds every round any survivor completed: a member behind
  it returns the lead's record of its round (``StepCall.TAKEN``: its update is in the lead's
  state), the others compute or reduce the round again (``StepCall.REDONE``);
* **a completed round** (:meth:`LoopMembership.completed`): the record names the ranks lost
  since the previous one (``lost``), whether it is a round redone after a shrink
  (``redone``) and the ranks taken in just before it (``rejoined``); its seconds, from the
  previous call's end, teach the learned deadline (``runtime.elastic.deadline``);
* **a heal** (:meth:`LoopMembership.heal`): the lowest member sees a rank ask to join
  (:meth:`LoopMembership.asks`, said in the round's last gather, so every member learns it in
  the same round) and every member GROWS at the next step boundary; a rank started again
  JOINS. The sync hands over the model's ``state_dict``, the optimizer's, the rule's state and
  round count (``Rounds.sealed``; dealt on demand, the stream's place too), the learned
  deadline's rounds seen, the latest record and the loop's ``GradScaler`` state, if it has
  one: from a live peer, never from disk.

What a regroup hands over is the same state a checkpoint holds (``core.envelope``), so every
wait is the elastic layer's: bounded by the learned deadline, the census window or
``timeout``.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import time
from enum import StrEnum
from typing import Any

import torch
from torch import nn

from tailtrain.integrate.rounds import Rounds, StepRecord
from tailtrain.runtime.elastic.group import GroupCollectives
from tailtrain.runtime.elastic.handover import elect, follow_live, hand_over
from tailtrain.runtime.elastic.shrink import Census, Shrinker
from tailtrain.runtime.reduce import Collectives

log = logging.getLogger(__name__)

#: the bound on a shrinking loop's waits where no ``timeout`` is given (``train``'s --timeout)
SHRINK_TIMEOUT = 300.0


class StepCall(StrEnum):
    """Where a shrinking loop's call stands (module docstring)."""

    #: computing and reducing; nothing applied yet
    IN_FLIGHT = "in flight"
    #: its last collective done: the update applied (or handed to the loop), the record made
    COMPLETED = "completed"
    #: a rank died or hung in it: the survivors regroup (``runtime.elastic.shrink``)
    BROKEN = "broken"
    #: the lead completed it: this rank returns the lead's record
    TAKEN = "taken"
    #: nobody completed it: the survivors compute (or reduce) it again
    REDONE = "redone"
    #: a rank started again passes a step the live ranks took before it joined
    #: (``integrate.elastic_ddp``): it computes nothing, its update is in the state it took
    SKIPPED = "skipped"


class LoopMembership:
    """One rank's part in the elastic layer for a user's loop (module docstring): the
    ``rounds`` whose group and rule a regroup replaces, the ``model`` and ``optimizer`` whose
    state a sync hands over, and what the next record says."""

    def __init__(
        self,
        rounds: Rounds,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        shrinker: Shrinker,
        scaler: torch.amp.GradScaler | None = None,
    ) -> None:
        self.rounds, self.model, self.optimizer, self.shrinker = rounds, model, optimizer, shrinker
        #: the loop's GradScaler, whose scale every member must share: each scales its own
        #: gradients by it before they are summed (None: no scaler)
        self.scaler = scaler
        #: the latest record (a lead hands it to the ranks its shrink finds behind)
        self.last: StepRecord | None = None
        #: ranks lost since the previous record, and whether the next record is the round a
        #: shrink computes again
        self.lost: list[int] = []
        self.redo = False
        #: ranks taken in since the previous record (a heal), and whether a rank asked to join
        #: in the latest round (every member takes it in at the next step boundary)
        self.joined: list[int] = []
        self.grows = False
        #: when the latest call ended (None: after a regroup, whose seconds are no round's)
        self.ended: float | None = time.perf_counter()

    @classmethod
    def start(
        cls,
        rounds: Rounds,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        timeout: datetime.timedelta | None,
        *,
        rejoining: bool,
        scaler: torch.amp.GradScaler | None = None,
    ) -> LoopMembership:
        """The protocol's part of this rank, over ``rounds``' group. A rank of the job that
        hung and woke is mid-call in a loop that cannot skip ahead: it is refused (``heals``
        False); a rank started again (``rejoining``) asks to join here, and returns once the
        live ranks took it in, with their state."""
        bound = SHRINK_TIMEOUT if timeout is None else timeout.total_seconds()
        shrinker = Shrinker.start(rounds.comm, bound, keeper=None, heals=rejoining)
        if not rejoining:  # generation 0 on a group a regroup can let go, not the script's
            rounds.comm = shrinker.own_first(rounds.comm, bound)
        membership = cls(rounds, model, optimizer, shrinker, scaler)
        if rejoining:
            membership.heal(join=True)
        return membership

    @property
    def generation(self) -> Collectives:
        """The current generation's collectives over every member, which a regroup leaves
        (the rounds' own here: every member is a worker)."""
        return self.rounds.comm

    def asks(self) -> bool:
        """Whether a rank asks to join, as the lowest member sees it (at most every
        ``shrink.JOIN_LOOK`` seconds); False on the other members. Said in a round's last
        gather, so every member grows after the same round."""
        shrinker = self.shrinker
        return shrinker.rank == shrinker.members[0] and shrinker.joins_waiting()

    def broke(self, exc: BaseException) -> StepRecord | None:
        """After ``exc`` broke this rank's round: the survivors' census, new generation and
        sync from the lead; the lead's record of this rank's round when the lead completed it
        (``StepCall.TAKEN``), else None (the round is computed or reduced again)."""
        shrinker, rounds = self.shrinker, self.rounds
        log.warning("rank %d: step %d broke: %s", shrinker.rank, rounds.step, exc)
        mine = rounds.step
        comm, found = shrinker.regroup(self.generation, mine, 0, self.sync)
        self.follow(comm, found)
        taken = rounds.step > mine  # the lead completed this rank's round
        # the lead's record of it already names the ranks lost before it (this rank's pending
        # ones, the same generations): the next record names only the ranks lost now
        self.lost = sorted({*([] if taken else self.lost), *found.dead})
        self.redo = True
        self.ended = None  # the regroup's seconds are no round's
        if taken:
            assert self.last is not None and self.last.step == mine
            return self.last
        return None

    def completed(self, record: StepRecord) -> StepRecord:
        """``record`` of a round just completed, naming what changed before it (module
        docstring); its seconds, from the previous call's end, teach the deadline."""
        # the first round after a shrink: the lead broke in it, so on every survivor it is
        # a redone round that names the ranks lost (the records agree)
        record = dataclasses.replace(record, lost=self.lost, redone=self.redo, rejoined=self.joined)
        self.lost, self.redo, self.joined, self.last = [], False, [], record
        ended, self.ended = self.ended, time.perf_counter()
        if ended is not None:  # a round's seconds, from the last call's end: the deadline
            self.shrinker.deadline.seen(self.ended - ended)
        return record

    def heal(self, join: bool = False) -> None:
        """GROWING (every member, at the step boundary after the round in which the lowest
        member saw a rank ask) or, with ``join``, JOINING (a rank started again): the new
        generation and the lead member's state (``Shrinker.regroup``). The next record names
        the ranks taken in (``rejoined``)."""
        self.grows = False
        comm, found = self.shrinker.regroup(
            self.generation, self.rounds.step, 0, self.sync, grow=not join, join=join
        )
        self.follow(comm, found)
        # a heal that lost a member ran a census: at a step boundary nothing is redone
        self.lost = sorted({*self.lost, *found.dead})
        self.joined = sorted({*self.joined, *found.joined})
        self.ended = None  # the heal's seconds are no round's

    def follow(self, comm: GroupCollectives, found: Census) -> None:
        """The new generation's group and live ranks; the rule follows the live world."""
        rounds = self.rounds
        rounds.comm, rounds.live = comm, tuple(found.members)
        rounds.rule, rounds.ctx = follow_live(rounds.rule, rounds.ctx, found.members)

    def sync(self, comm: GroupCollectives, found: Census) -> None:
        """SYNCING: the lead member's model, optimizer, rule state, deadline, latest record
        and GradScaler state (its scale and growth count) on every member of the new
        generation."""
        shrinker = self.shrinker
        lead = elect(comm, self.rounds.step)  # the lead: runtime.elastic.handover
        state: dict[str, Any] = hand_over(
            comm,
            lead,
            lambda: self.rounds.sealed(
                list(shrinker.deadline.recent),
                model=self.model.state_dict(),
                optimizer=self.optimizer.state_dict(),
                last=self.last,
                scaler=None if self.scaler is None else self.scaler.state_dict(),
            ),
        )
        if lead.leads:
            return
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.scaler is not None and state["scaler"] is not None:
            self.scaler.load_state_dict(state["scaler"])
        self.rounds.load_state_dict(state)
        shrinker.deadline.adopt(state["deadline"])
        self.last = state["last"]
