"""After a regroup: who leads the new generation's sync, how its state reaches the others,
and how the rule follows the live world (``runtime.elastic.shrink``, SYNCING; review E1, E2).

Every rank host that shrinks (the allreduce's rounds, the partial collective's regroup,
``integrate.StragglerStep``) takes these three decisions here and builds only its own
payload:

* **the lead** (:func:`elect`): the member that completed the most rounds, the lowest rank
  among equals. A round completes only once every member reduced into it, so a member is at
  most one round ahead of another and the lead holds every round any survivor completed. The
  counts are gathered afresh over the new generation's group, not read from the census: a
  sync that failed after some member took its lead's state (a member lost during SYNCING,
  and the census runs again) leaves that member ahead of what it checked in with;
* **the hand-over** (:func:`hand_over`): the lead's state, built on the lead only, broadcast
  to every member;
* **the live world** (:func:`follow_live`): the rule for the L live ranks
  (``RuleDriver.followed``: ``Strategy.follow_world`` with ``n_workers`` = L and ``live`` the
  members' original ranks). A rule that cannot follow was refused before any round
  (``refusals``), so failing here is a bug.

:func:`pass_drills` marks the fault drills of the rounds a member skipped (it took a lead's
later state) as past, so a kill drill does not fire again.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from tailtrain.errors import TailtrainError
from tailtrain.runtime.control import RuleDriver
from tailtrain.runtime.elastic.group import GroupCollectives
from tailtrain.runtime.reduce import Collectives
from tailtrain.strategies.base import Context


@dataclass(frozen=True)
class Lead:
    """The new generation's lead, seen from one member (module docstring)."""

    #: the lead's place in the generation (the broadcast's source)
    place: int
    #: this rank's place
    mine: int
    #: each member's completed rounds and record rows, by place, as gathered
    steps: tuple[int, ...]
    rows: tuple[int, ...]

    @property
    def leads(self) -> bool:
        """Whether this rank is the lead."""
        return self.place == self.mine

    @property
    def fewest(self) -> int:
        """The fewest record rows any member holds: the lead sends the rows past them."""
        return min(self.rows)


def lead_of(steps: Sequence[int]) -> int:
    """The place of the member that completed the most rounds, the lowest among equals (the
    members are in rank order, so the lowest rank)."""
    return max(range(len(steps)), key=lambda place: (steps[place], -place))


def elect(comm: GroupCollectives, step: int, rows: int = 0) -> Lead:
    """The lead of ``comm``'s generation, from every member's completed rounds (``step``) and
    record rows (``rows``) gathered now (module docstring). One gather, on every member."""
    counts = comm.gather([step, rows]).astype(int)
    steps, held = tuple(int(s) for s in counts[:, 0]), tuple(int(r) for r in counts[:, 1])
    return Lead(lead_of(steps), comm.rank, steps, held)


def hand_over(comm: GroupCollectives, lead: Lead, state: Callable[[], Any]) -> Any:
    """The lead's ``state()`` on every member (built on the lead only; the lead gets its own
    object back)."""
    return comm.broadcast_object(state() if lead.leads else None, lead.place)


def follow_live(
    rule: RuleDriver, ctx: Context, members: Sequence[int]
) -> tuple[RuleDriver, Context]:
    """``rule`` for the live world of ``members`` (original ranks, in order), and that world's
    context (``ctx`` with ``n_workers`` and ``live`` replaced)."""
    live = tuple(members)
    ctx = dataclasses.replace(ctx, n_workers=len(live), live=live)
    followed = rule.followed(ctx)
    if followed is None:  # refusals.check_follows refused such a rule before any round
        raise TailtrainError(
            f"{rule.strategy.describe()!r} cannot follow the live ranks {list(live)}: "
            f"{rule.strategy.follow_refusal()}"
        )
    return followed, ctx


def pass_drills(comm: Collectives, step: int) -> None:
    """The fault drills of the rounds before ``step`` are past on this rank (it took a lead's
    later state; a kill drill would fire again)."""
    drill = comm.drill
    drill.reached = max(drill.reached, step - 1)
