"""A hybrid-sharded job in the elastic layer: the worker is a replica group, which leaves whole
(``ShardedStep(..., on_rank_loss="shrink")``; ``integrate.sharded``).

The ranks of a replica group hold one model between them (FSDP shards it within the group), so
a group that loses a rank cannot step: it leaves whole, and the other groups go on. This is the
loop's membership (``integrate.membership``) over the same ``Shrinker`` and store, with three
differences, each for that reason:

* **The census keeps whole groups** (``Shrinker.whole``): of the ranks checked in and not known
  dead, only those whose replica group is complete go on; the others are REFUSED
  (``Refused``: "leaves with its replica group"), and their launcher logs a leave.
* **One decision per round** (``runtime.elastic.commit``): a round is reduced over S replicate
  groups, one per shard index, which a death can break apart (shard 0's all-reduce completed,
  shard 1's failed). No rank applies a round before the store says every member completed it,
  so the survivors are all at the same round, no state needs handing over after a break, and
  the round in flight is computed again among them (``StepCall.REDONE``) from its start
  (``ShardedStep`` restores its buffers and Local-SGD's state).
* **The generation's groups**: Shrinker's FORMING builds the flat group of every member (its
  forming checks that every member is there); SYNCING builds this rank's new replicate group,
  its shard index's ranks of the groups that go on (``gen{g}/replicate{s}`` in the store,
  numbered in group order), checks that every member stands at the same round, and ends in a
  decision in the store (``runtime.elastic.commit.decide``) that every member formed its
  groups, so that no member computes while another's forming failed. FSDP's
  shard groups stay: a group that goes on lost none of its ranks. The rule follows the live
  GROUPS (``handover.follow_live`` with the groups' indices), and the records' ``live`` and
  ``lost`` name groups, as ``completed`` and ``weights`` do.

**Group mates leave together.** A rank's own collectives (the step's, within its group and
across) are watched with the generation's deadline and ``broken`` key
(``runtime.elastic.group.Watch``). FSDP's collectives inside a micro-batch are not (they are
FSDP's): a peer that dies makes them fail at once (gloo: the socket closes), which the step
reads as a break (:func:`lost_peer`); one that hangs holds them up to the shard group's own
timeout (``init_device_mesh`` builds its groups with torch's ``default_pg_timeout``, 30
minutes on gloo). So no rank may enter FSDP's collectives while a mate has left: a watched
reduce can complete on one mate after the other gave up on it (its part was already sent).
Every point before FSDP's collectives is therefore one decision for the group: the previous
round's commit, the new generation's ``formed`` decision, and, while a finite tau is in
force, the group's lockstep reduce before each micro-batch, which is not watched and carries
each rank's ``broken`` look (:meth:`GroupMembership.sees_broken`, one store look per
micro-batch), so that the group's ranks leave after the same reduce. The step's other
collectives in the group are followed by watched ones, where a mate left behind leaves too. A group
started again is not taken back (``--restart-lost`` is refused): its ranks would need the live
groups' shards, one rank from the rank with the same shard index, at a step boundary.
"""

from __future__ import annotations

import datetime
import logging

import torch
import torch.distributed as dist
from torch import nn

from tailtrain.errors import TailtrainError
from tailtrain.integrate.membership import SHRINK_TIMEOUT, LoopMembership
from tailtrain.integrate.mesh import ReplicaCollectives
from tailtrain.integrate.rounds import Rounds, StepRecord
from tailtrain.runtime.elastic.commit import Decision, commit, decide
from tailtrain.runtime.elastic.group import Broken, GroupCollectives, Watch, abort
from tailtrain.runtime.elastic.handover import follow_live
from tailtrain.runtime.elastic.shrink import Census, Shrinker
from tailtrain.runtime.reduce import Collectives

log = logging.getLogger(__name__)


def lost_peer(exc: BaseException) -> bool:
    """Whether ``exc`` is gloo's own failure of a collective (a peer's socket closed, or its
    wait timed out): FSDP's collectives inside a micro-batch raise it as a RuntimeError."""
    return isinstance(exc, RuntimeError) and "gloo" in str(exc).lower()


class GroupMembership(LoopMembership):
    """One rank's part in the elastic layer for a sharded job (module docstring): ``groups``
    the job's ranks of each replica group, ``within`` its group's (shard) collectives, and
    ``job`` the generation's collectives over every member."""

    def __init__(
        self,
        rounds: Rounds,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        shrinker: Shrinker,
        groups: list[list[int]],
        within: Collectives,
        job: Collectives,
    ) -> None:
        super().__init__(rounds, model, optimizer, shrinker)
        self.groups, self.within, self.job = groups, within, job
        #: the group's lockstep reduce before each micro-batch (under a finite tau), not
        #: watched: a mate that left it early on the ``broken`` key could leave the other,
        #: whose reduce completed, inside FSDP's next all-gather (module docstring). Bounded
        #: by ``within``'s timeout, as FSDP's own collectives are by the group's
        self.lockstep = Collectives(
            within.rank, within.world_size, within.device, grace=0.0, group=within.group,
            timeout=within.timeout,
        )  # fmt: skip
        me = shrinker.rank
        #: this rank's shard index: its place in its replica group
        self.shard = next(g.index(me) for g in groups if me in g)
        #: SYNCING's new replicate collectives and live groups, which ``follow`` installs
        self._next: tuple[ReplicaCollectives, tuple[int, ...]] | None = None
        shrinker.whole = self.whole
        self.watch(0)

    @classmethod
    def start_groups(
        cls,
        rounds: Rounds,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        timeout: datetime.timedelta | None,
        groups: list[list[int]],
        within: Collectives,
    ) -> GroupMembership:
        """The protocol's part of this rank: generation 0 is the job's default group."""
        bound = SHRINK_TIMEOUT if timeout is None else timeout.total_seconds()
        job = Collectives.of_group(None, within.device)
        shrinker = Shrinker.start(job, bound, keeper=None, heals=False)
        return cls(rounds, model, optimizer, shrinker, groups, within, job)

    @property
    def generation(self) -> Collectives:
        return self.job

    def whole(self, here: list[int]) -> list[int]:
        """The ranks of ``here`` whose replica group is all in ``here`` (``Shrinker.whole``)."""
        present = set(here)
        return [r for r in here if all(m in present for m in self.group_of(r))]

    def group_of(self, rank: int) -> list[int]:
        return next(g for g in self.groups if rank in g)

    def commit(self) -> None:
        """The store's one decision on the round in flight (``runtime.elastic.commit``):
        returns once every member completed it, raises ``Broken`` otherwise."""
        shrinker = self.shrinker
        commit(
            shrinker.store, shrinker.generation, shrinker.members, self.rounds.step,
            shrinker.deadline,
        )  # fmt: skip

    def sees_broken(self) -> bool:
        """Whether this rank sees the generation broken now (``gen{g}/broken``): said in the
        group's lockstep reduce, so that its ranks leave after the same one (module
        docstring)."""
        shrinker = self.shrinker
        return shrinker.store.check([f"gen{shrinker.generation}/broken"])

    def broke(self, exc: BaseException) -> StepRecord | None:
        """After ``exc`` broke this rank's round: the survivors' census (whole groups),
        new generation and groups. Always None: the commit keeps every member at the same
        round, so the round is computed again among the groups that go on; the next record
        names the groups lost (``lost``)."""
        shrinker, rounds = self.shrinker, self.rounds
        log.warning("rank %d: step %d broke: %s", shrinker.rank, rounds.step, exc)
        comm, found = shrinker.regroup(self.job, rounds.step, 0, self.sync)
        self.follow(comm, found)
        gone = {self.groups.index(self.group_of(r)) for r in found.dead}
        self.lost = sorted({*self.lost, *gone})
        self.redo, self.ended = True, None  # the regroup's seconds are no round's
        return None

    def sync(self, comm: GroupCollectives, found: Census) -> None:
        """SYNCING (module docstring): every member at the same round, and this rank's new
        replicate group among the groups that go on."""
        steps = {found.steps[m] for m in found.members}
        if steps != {self.rounds.step}:  # the commit keeps them together: a bug otherwise
            raise TailtrainError(f"a sharded step's members stood at rounds {sorted(steps)}")
        shrinker = self.shrinker
        if self._next is not None:  # an attempt that failed: its group holds nothing
            abort(self._next[0].group)
            self._next = None
        live = tuple(n for n, g in enumerate(self.groups) if g[0] in found.members)
        peers = [self.groups[n][self.shard] for n in live]
        store = dist.PrefixStore(f"gen{shrinker.generation}/replicate{self.shard}", shrinker.store)
        timeout = datetime.timedelta(seconds=shrinker.deadline.bound)
        me, size = peers.index(shrinker.rank), len(peers)
        group = dist.ProcessGroupGloo(store, me, size, timeout)
        replicas = ReplicaCollectives(self.within, group, self.within.device, rank=me, size=size)
        replicas.grace = 0.0
        self._next = (replicas, live)
        # one decision that every member formed its groups: none computes (FSDP's collectives
        # are not watched) while a group mate went back to the census
        formed = decide(
            shrinker.store, f"gen{shrinker.generation}/formed", shrinker.generation,
            found.members, shrinker.deadline,
        )  # fmt: skip
        if formed != Decision.COMMIT:
            raise Broken(f"generation {shrinker.generation} did not form on every member")

    def follow(self, comm: GroupCollectives, found: Census) -> None:
        """The new generation's collectives (the flat group, the replicate group, the watch on
        the shard group) and its live groups; the rule follows the live groups."""
        assert self._next is not None
        rounds = self.rounds
        abort(rounds.comm.group)  # the replicate group left: its stuck collective holds nothing
        self.job, (rounds.comm, rounds.live), self._next = comm, self._next, None
        rounds.rule, rounds.ctx = follow_live(rounds.rule, rounds.ctx, rounds.live)
        self.watch(self.shrinker.generation)
        log.warning("rank %d: the replica groups %s go on", self.shrinker.rank, list(rounds.live))

    def watch(self, generation: int) -> None:
        """The generation's deadline and ``broken`` key on the step's own collectives."""
        shrinker = self.shrinker
        for comm in (self.within, self.rounds.comm):
            comm.watch = Watch(shrinker.store, generation, shrinker.deadline)
            comm.grace = 0.0
