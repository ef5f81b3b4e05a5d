"""Lose a rank, keep training: any topology's membership protocol (issue 26).

The protocol below is shared by every rank host that shrinks: the allreduce's rounds
(``runtime.allreduce.rounds``), eager-SGD's partial collective (``runtime.partial.regroup``)
and a user's own loop (``integrate.step``). This module holds the states and the
:class:`Shrinker`; its parts live beside it in ``runtime.elastic``: the learned deadline
(``deadline``), the watched collectives of a generation (``group``: ``Watch``,
``GroupCollectives``, ``Broken``, ``abort``), the agent's store and the launcher's environment
names (``store``), what the members hand over after a regroup (``handover``: the lead, the
rule following the live world) and the one-line refusals before any process starts
(``refusals``). The text below tells it as the allreduce runs it.

With ``--on-rank-loss shrink`` (``TrainConfig.on_rank_loss``; the default ``stop`` keeps the
census, exit and ``--max-restarts`` restart of ``runtime.keep``), the ranks of a local launch
go on without a rank that died or stayed silent, with no restart and no checkpoint read.

**Generations.** The ranks step in a *generation* g: its members (original ranks, sorted)
and a process group among them. Generation 0 is the job's default group (in a user's loop, a
group of its own among the same ranks, :meth:`Shrinker.own_first`). Generation g > 0 is a
fresh ``ProcessGroupGloo`` over ``PrefixStore(f"gen{g}", store)`` with the members renumbered
0..L-1 in order, as torchft's ``ProcessGroupGloo.configure`` builds each quorum's group:
``torch.distributed.new_group`` needs every member of the broken group, and ``shrink_group``'s
abort path still hangs survivors. The group a generation leaves is aborted
(``ProcessGroupGloo.abort``, which in torch 2.13 closes no socket), and one of its own is let
go (``group.let_go``): its destructor closes its sockets once its stuck collective timed out,
so no live peer's bytes for a collective this rank left keep gloo's event loop spinning.
``store`` is the elastic agent's (``MASTER_ADDR:MASTER_PORT`` with
``TORCHELASTIC_USE_AGENT_STORE``): it lives in the launcher, not in a rank, so it outlives any
rank, and its keys sit under ``tailtrain/shrink/{run id}/{restart}``.

**States** (:class:`ShrinkPhase`) of one rank:

* ``STEPPING``: rounds as ``runtime.allreduce.rounds``; each collective is waited for by
  polling (``group.Watch``, 0.5 ms sleeps), so that every wait has two bounds: the
  *deadline* and the generation's ``broken`` key. The deadline is learned from the measured
  round times, as the parameter server's ``--worker-timeout`` is (``runtime.ps.liveness``):
  ``deadline.DEADLINE_FACTOR`` times the ``QUANTILE`` quantile of the last
  ``ROUNDS_SEEN`` settled rounds (a burst of load on a few rounds does not move it) and
  at least ``LONGEST_FACTOR`` times the longest of them, at least ``MIN_DEADLINE``
  seconds, never more than ``--timeout``; before a round settled it is ``--timeout``. The
  pauses of rank 0 that are no hang are waited for up to ``--timeout``: the barrier after
  its evaluation, and the allreduce of a round after it wrote a checkpoint
  (``--checkpoint-every``: every rank knows when one is due); that round, which holds the
  write, is left out of the rounds seen. The summary keeps the deadline that decided the
  latest break and how it was learned (``hang_deadline``, ``hang_deadline_learned``).
  A collective that fails (a peer's socket closed: SIGKILL) or outlives the deadline (a hung
  peer: SIGSTOP, a frozen thread; it sets ``gen{g}/hung`` too) sets ``gen{g}/broken``; every
  member sees that key within ``group.CHECK`` seconds of entering its next collective, and
  leaves it.
* ``CENSUS``: the rank flushes its record rows, checks in (``gen{g}/in/{rank}`` = the rounds
  it completed and its rows) and waits until every member of g has checked in or is known dead
  (``dead/{rank}``, set by the shield of ``runtime.expendable`` the moment the rank's process
  dies), or until the census window passes. After a hang (``gen{g}/hung``) that is
  :data:`HANG_WINDOW`: the deadline is longer than any recent round, so every live member
  is already waiting in the collective that broke and checks in within ``CHECK`` seconds
  (one slower than that misses the generation and asks to join: JOINING);
  after a failure, ``deadline.WINDOW_FACTOR`` times the longest recent round (a live member may
  be inside one compute), at least ``MIN_WINDOW``, at most the deadline; for rank 0 (a
  census without it ends the job, and it may be inside an evaluation) until it checks in or
  is known dead, at most ``--timeout``.
  The first rank to close it writes the members of g + 1, the ranks checked in at that
  moment and not known dead since (``store.compare_set`` on the absent ``gen{g}/members``:
  every closing rank offers its list and the first stands, so no rank's death between two
  steps leaves the list unwritten); every rank reads that list.
* A rank not in the list (it checked in late: it hung past the deadline and woke, or it was
  slower than the window) goes on to JOINING below; its work after the last round it
  completed counts nowhere, so nothing is counted twice.
* ``FORMING``: the members build generation g + 1's group (bounded by the deadline). When a
  member dies meanwhile (a death during the census or the forming), forming fails or the first
  collective breaks, and the protocol runs again from g + 1: at most once per member.
* ``SYNCING``: the lead member, the one that completed the most rounds (the lowest rank among
  equals; counted afresh over the new group, ``handover.elect``), broadcasts its state over
  the new group: parameters, update and rule state, the clock, the unsettled round, the delay
  draws as they stood before its round in flight, and the record rows the others lack. A rank
  can be at most one round ahead of another (a round completes only once every member reduced
  into it), so the group goes on from the last round any survivor completed, and the round in
  flight is computed again by the live ranks.
* ``JOINING``: a rank that came after a census (it woke from a hang) does not leave: it asks to
  join (``join/{rank}`` = its step and rows; a rank of a node's second start first waits, up
  to ``--timeout``, for its launcher's clearance, ``store.await_clearance``) and waits, up to
  ``--timeout``, for ``joined/{rank}``; if the run ends first (``finished``) it is ``REFUSED``
  (:class:`Refused`), withdraws its ``join/{rank}`` (writes it ``null``: only the lowest member
  deletes join keys) and leaves. Its round in flight counts nowhere, so nothing is counted
  twice. A rank started again (``rejoining``) that no grow took in within
  ``--timeout`` while the run goes on withdraws too, and fails (``TailtrainError``: a heal
  that failed is a failure, which its launcher reports, not a leave). Taken in, it adopts the
  lowest member's rounds seen (``recent`` in the grow's word), so its forming and sync wait
  the live ranks' deadline, as theirs do, not ``--timeout``: a member lost during the heal
  fails the new group for every rank alike, and all of them meet in the census that follows.
* ``GROWING``: the lowest member looks for the ``join/{rank}`` keys of the ranks that are no
  members (and not ``dead/{rank}``: one that died waiting is withdrawn) at most every
  :data:`JOIN_LOOK` seconds, while a round's allreduce runs, and says
  what it saw in the next round's allreduce (an extra), so every member learns it after the
  same round; a key stays until a grow takes its rank in, so a request whose grow a break
  overtook is seen again in the next generation. At that step
  boundary the lowest member takes in the ranks that asked (``gen{g}/grow``, ``joined/{j}``;
  the ranks of a node started again only once all of them asked: ``tailtrain launch``
  across nodes names them in each request, so a node heals whole),
  and the members and joiners form generation g + 1 and sync from the lead (a member) as
  above: the heal takes the model, update, rule, clock and record from a live peer, never
  from disk. The rows record ``rejoined``. A heal that loses a member runs the census again.
* **Held.** Once a generation formed and synced, each member says so in the store
  (:meth:`Shrinker.held`: ``gen{g}/held`` = its members, the step it goes on from, the ranks
  lost and taken in; the first word stands) and a rank taken in writes ``healed/{rank}``: a
  launcher that watches the ranks says that the job went on, or that a rank rejoined, only
  then (``runtime.launching.scripts``).

Every wait above is bounded: by the deadline, the census window or ``--timeout`` (``timedelta``
timeouts on the store and on each generation's group).

**The smaller world.** Each live rank keeps its own data shard and per-rank batch (the global
batch shrinks to L ranks' batches: "the same per-rank batch"); the dead rank's shard is
skipped, and each round's record row counts it: ``live`` (the original ranks that stepped),
``dead`` (the ranks lost at that round) and ``skipped`` (samples the lost ranks' shards did not
contribute, in this round). The update is the average over the live ranks' gradients: the rule
follows the live world (``handover.follow_live``: ``Strategy.follow_world`` with ``n_workers``
= L and ``live`` the members, applied to the lead's rule state): sync starts again (k = L), a
fixed DropCompute tau and Local-SGD's period stay and their divisor N becomes L (Eq. 1); a
calibrated tau (``threshold=auto``, ``drop-rate=p``) is chosen again by Algorithm 2 on the live
ranks' kept calibration samples, and a calibration under way goes on with the live ranks' columns
(``strategies.dropcompute``); rebalance deals its shares again over the live ranks' own
batches, sum_n m_n = L M (``strategies.rebalance``), except ``deal=demand``, whose live
ranks deal the whole pool of N M among themselves: the global batch is kept, ``skipped`` 0.
A rule that cannot follow (``Strategy.follow_refusal`` says why: DropCompute's
``compensate=larger-batch``, rebalance's ``defer=true``) refuses shrink in one line at start
(``refusals.check_shrink``).

**Rank 0** keeps the record and answers the launcher: its death stops the job as with
``stop`` (the launcher's line says to restart with ``--max-restarts``), and a census that
lost it (rank 0 hung) ends every rank with a line saying so. Under torchrun shrink is refused:
torchrun's agent stops the job when any rank dies. A killed rank does not come back by itself
unless ``--restart-lost N``: the shield (``runtime.expendable``) then starts it again, up to
N times, without the job's process group, and it asks to join at once (JOINING) and is
healed as a woken rank is; a hung one that wakes always asks.

**A user's own loop** (``integrate.StragglerStep(..., on_rank_loss="shrink")`` under
``tailtrain launch --on-rank-loss shrink``, ``runtime.launching.scripts``) runs this same protocol
through the same :class:`Shrinker`, with two of its options: ``keeper=None`` (the launcher
hosts the store and no rank keeps a record, so rank 0 is lost like any other: the census
neither waits for it past the window nor ends the job without it) and ``heals`` False in a
rank of the job (one that hung and woke after a census is REFUSED at once rather than
JOINING: its loop is inside a call and cannot skip ahead). A rank that ``tailtrain launch
--restart-lost`` started again (``store.REJOIN``, ``store.RESTART``) has ``heals`` True: its
``StragglerStep`` asks to join before its first call; the lowest member looks for it with
:meth:`Shrinker.joins_waiting` before a call's last gather and says so in that gather, so
every member GROWS (:meth:`Shrinker.grow`) after the same call, and the joiner's loop goes on
from ``StragglerStep.next_step``. A refused rank leaves ``left/{rank}`` in the store,
so a launcher that watches the ranks itself logs it as leaving, not as a death. The loop's
rounds, their sync and what a broken call returns are ``integrate.step``'s; a
``DistributedDataParallel`` job with the comm hook's state runs the same through
``integrate.elastic_ddp``, both on ``integrate.membership``. A sharded loop
(``integrate.ShardedStep``) runs it at group granularity (``integrate.group_membership``):
its census keeps whole replica groups (``whole``), and the ranks of a group that lost one
are REFUSED.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, NoReturn

import torch
import torch.distributed as dist

from tailtrain.errors import TailtrainError
from tailtrain.runtime.elastic.deadline import Deadline
from tailtrain.runtime.elastic.group import (
    Broken,
    GroupCollectives,
    Watch,
    abort,
    generation_group,
    let_go,
)
from tailtrain.runtime.elastic.store import REJOIN, REJOIN_WITH, await_clearance, open_store
from tailtrain.runtime.expendable import LeftAlive
from tailtrain.runtime.reduce import Collectives

log = logging.getLogger(__name__)

#: the census window after a hang (the deadline passed): every live member is already
#: waiting in the collective that broke (the deadline is longer than any recent round), and
#: sees the break within CHECK seconds
HANG_WINDOW = 0.2
#: seconds between two looks of the lowest member for ranks asking to join
JOIN_LOOK = 0.2
#: a ``join/{rank}`` request its rank withdrew (it left: the run ended, or its --timeout passed)
WITHDRAWN = "null"


class OnRankLoss(StrEnum):
    """What the allreduce's survivors do when a rank dies or hangs (``--on-rank-loss``)."""

    STOP = "stop"
    SHRINK = "shrink"


class ShrinkPhase(StrEnum):
    """A rank's state in the shrink protocol (module docstring)."""

    STEPPING = "stepping"
    CENSUS = "census"
    JOINING = "joining"
    GROWING = "growing"
    REFUSED = "refused"
    FORMING = "forming"
    SYNCING = "syncing"


class Refused(LeftAlive):
    """The survivors formed their new group without this rank (it came after the census,
    or, under ``ShardedStep``, its replica group lost a rank); it leaves alive, and the
    shield logs that, not a death (``runtime.expendable``)."""


@dataclass
class Census:
    """What the census of a generation found: the next members, and what each checked in
    with (the rounds it completed, its record rows)."""

    members: list[int]
    steps: dict[int, int]
    rows: dict[int, int]
    dead: list[int]
    #: ranks taken in again (a heal)
    joined: list[int] = field(default_factory=list)


@dataclass
class Shrinker:
    """One rank's part in the protocol (module docstring): its original ``rank``, the current
    generation, its members and its collectives."""

    rank: int
    store: dist.Store
    deadline: Deadline
    device: torch.device
    members: list[int]
    #: the job's ranks
    world: int = 0
    generation: int = 0
    #: when the lowest member looks again for ranks asking to join (:meth:`joins_waiting`)
    next_look: float = 0.0
    #: a rank started again after it died: it joins the live ranks before its first round
    rejoining: bool = False
    phase: ShrinkPhase = ShrinkPhase.STEPPING
    #: the generations left: the job's default group, aborted and kept, or the thread that
    #: lets an own group go (module docstring)
    left: list[Any] = field(default_factory=list)
    #: every new generation: (generation, the round in flight, the ranks lost, the ranks
    #: taken in, seconds)
    history: list[tuple[int, int, list[int], list[int], float]] = field(default_factory=list)
    #: the deadline in force when the latest generation broke: (round in flight, seconds, how
    #: it was learned); None while none broke
    broke_at: tuple[int, float, str] | None = None
    #: the rank the job cannot lose (``train``'s rank 0 keeps the record and answers the
    #: launcher: a census without it ends the job, and waits for it up to --timeout); None:
    #: any rank may be lost (``integrate.StragglerStep`` under ``tailtrain launch``)
    keeper: int | None = 0
    #: whether a rank that came after a census may ask to join (JOINING); False: it is
    #: REFUSED at once (``integrate.StragglerStep`` in a rank of the job: its loop cannot
    #: skip ahead; a rank started again asks). Members grow either way (:meth:`grow`)
    heals: bool = True
    #: the ranks that may go on, of those checked in (None: all of them). A sharded job's
    #: worker is a replica group, which leaves whole when it lost a rank
    #: (``integrate.sharded``): its other ranks are REFUSED
    whole: Callable[[list[int]], list[int]] | None = None

    def deadline_summary(self) -> dict[str, Any]:
        """The learned hang deadline for the run's summary: the one in force when the latest
        generation broke (the one that decided a fault), or at the end where none broke."""
        if self.broke_at is None:
            bound, how = self.deadline.bound, f"at the end: {self.deadline.describe()}"
        else:
            step, bound, how = self.broke_at
            how = f"in force when step {step} broke: {how}"
        return {"hang_deadline": bound, "hang_deadline_learned": how}

    def finished(self) -> None:
        """The run's rounds are over: a rank waiting to join is refused now."""
        with contextlib.suppress(Exception):
            self.store.set("finished", "1")

    @classmethod
    def start(
        cls, comm: Collectives, timeout: float, *, keeper: int | None = 0, heals: bool = True
    ) -> Shrinker:
        deadline = Deadline(timeout)
        store = open_store(datetime.timedelta(seconds=timeout))
        members = list(range(comm.world_size))
        shrinker = cls(comm.rank, store, deadline, comm.device, members, comm.world_size)
        shrinker.keeper, shrinker.heals = keeper, heals
        shrinker.rejoining = os.environ.get(REJOIN) == "1"
        comm.watch = Watch(store, 0, deadline)
        comm.grace = 0.0  # the launcher names nobody here: the census does
        return shrinker

    def own_first(self, comm: Collectives, timeout: float) -> GroupCollectives:
        """Generation 0 on a group of its own among every rank of the job (``comm``'s, the
        default group): a regroup then lets it go, sockets and all (``group.let_go``), where
        the default group must stay the script's. Its watch is its own: a Work it keeps holds
        the group's connections."""
        span = datetime.timedelta(seconds=timeout)
        return generation_group(
            self.store, 0, comm.rank, comm.world_size, self.device, span, self.deadline,
            comm._drill,  # armed by a drill (else None): the new group carries it
        )  # fmt: skip

    def census(self, step: int, rows: int) -> Census:
        """Check in with ``step`` completed rounds and ``rows`` record rows; the next
        generation's members (bounded by the census window, then the deadline)."""
        self.phase = ShrinkPhase.CENSUS
        g, store = self.generation, self.store
        store.set(f"gen{g}/broken", "census")  # whoever has not seen it yet
        store.set(f"gen{g}/in/{self.rank}", json.dumps([step, rows]))
        ins = [f"gen{g}/in/{m}" for m in self.members]
        deads = [f"dead/{m}" for m in self.members]
        started = time.monotonic()
        bound = started + self.deadline.timeout
        while not store.check([f"gen{g}/members"]):
            known = [store.check([i]) or store.check([d]) for i, d in zip(ins, deads, strict=True)]
            if all(known):
                break
            # a census without the keeper (train's rank 0) ends the job, and it may be
            # evaluating (longer than any round, as the patient barrier allows): wait for it
            # up to --timeout
            keeper = self.keeper
            waits_for_zero = keeper in self.members and not known[self.members.index(keeper)]
            hung = store.check([f"gen{g}/hung"])
            end = started + (HANG_WINDOW if hung else self.deadline.window)
            if time.monotonic() >= (bound if waits_for_zero else end):
                break
            time.sleep(0.005)
        # every rank that closes it offers the ranks checked in now and the first offer
        # stands (compare_set on an absent key), so no elected closer can die between its
        # election and its write and leave the others waiting for a list that never comes
        # a rank that checked in and died since (its launcher noted it: a node's mates are
        # killed as their node leaves) is no member: forming with it would fail once
        here = [
            m
            for m, key, dead in zip(self.members, ins, deads, strict=True)
            if store.check([key]) and not store.check([dead])
        ]
        if self.whole is not None:
            here = self.whole(here)
        members = json.loads(store.compare_set(f"gen{g}/members", "", json.dumps(here)))
        if self.keeper is not None and self.keeper in self.members and self.keeper not in members:
            raise TailtrainError(
                f"rank 0, which keeps the record and answers the launcher, was lost at step "
                f"{step}: --on-rank-loss shrink cannot go on without it; add --max-restarts 1 "
                "and --out DIR to go on from a checkpoint"
            )
        if self.rank not in members:
            if self.whole is not None:  # its group, not whole at the census, leaves whole
                self.refuse(
                    f"rank {self.rank} leaves with its replica group at step {step}: the "
                    "survivors went on with the groups whole at the census (a rank of this "
                    "one was lost, or came late), and a group's shards are one model"
                )
            return self.join(step, rows)
        steps, rows_of = {}, {}
        for m in members:
            s, r = json.loads(store.get(f"gen{g}/in/{m}"))
            steps[m], rows_of[m] = int(s), int(r)
        dead = [m for m in self.members if m not in members]
        return Census(members, steps, rows_of, dead)

    def join(self, step: int, rows: int) -> Census:
        """JOINING (module docstring): this rank came after a census; it asks to be taken in
        at a step boundary and waits, up to --timeout, for the generation that takes it (or
        for the run's end: :class:`Refused`). Its round in flight counts nowhere."""
        store, me = self.store, self.rank
        if not self.heals:
            self.refuse(
                f"rank {me} came after the census at step {step}: the survivors went on "
                "without it and this run takes no rank back; its round in flight counts nowhere"
            )
        began = time.monotonic()  # one --timeout for the clearance and the join together
        await_clearance(store, me, self.deadline.timeout)
        self.phase = ShrinkPhase.JOINING
        log.warning("rank %d asks to join the live ranks", me)
        with contextlib.suppress(Exception):  # a rank the shield noted dead is back
            store.delete_key(f"dead/{me}")
        # the ranks of its node started again with it: taken in together (``asking``)
        together = [int(r) for r in os.environ.get(REJOIN_WITH, "").split(",") if r]
        store.set(f"join/{me}", json.dumps([step, rows, together]))
        end = began + self.deadline.timeout
        while not store.check([f"joined/{me}"]):
            ended = store.check(["finished"])
            if ended or time.monotonic() > end:
                # withdrawn: a later grow must not take in a rank that left. Written, not
                # deleted: only the lowest member deletes join keys, so its check-then-read
                # of one never waits on a key gone between the two (``asking``)
                with contextlib.suppress(Exception):
                    store.set(f"join/{me}", WITHDRAWN)
                if not ended and self.rejoining:  # a heal that failed is a failure, not a leave
                    raise TailtrainError(
                        f"rank {me} was started again and asked to join the live ranks; none "
                        f"took it in within --timeout {self.deadline.timeout:g}s: the heal failed"
                    )
                self.refuse(
                    f"rank {me} asked to join the live ranks (it came after a census, or was "
                    "started again) and the run ended first: its round in flight counts nowhere"
                )
            time.sleep(0.01)
        generation, census = json.loads(store.get(f"joined/{me}"))
        store.delete_key(f"joined/{me}")
        # the lowest member's rounds seen: its new group's forming and sync wait the live
        # ranks' deadline, not --timeout (a member lost meanwhile fails it for all alike)
        if census.get("recent"):  # none settled there: keep what this rank learned
            self.deadline.adopt(census["recent"])
        self.generation = int(generation) - 1  # form() makes it this generation
        return Census(
            census["members"],
            {int(k): v for k, v in census["steps"].items()},
            {int(k): v for k, v in census["rows"].items()},
            [],
            joined=census["joined"],
        )

    def refuse(self, why: str) -> NoReturn:
        """REFUSED: this rank leaves alive. ``left/{rank}`` tells a launcher that watches the
        ranks itself (``runtime.launching.scripts``) that its exit is no failure."""
        self.phase = ShrinkPhase.REFUSED
        with contextlib.suppress(Exception):
            self.store.set(f"left/{self.rank}", why)
        raise Refused(why)

    def joins_waiting(self) -> bool:
        """The lowest member asks the store, at most every :data:`JOIN_LOOK` seconds, whether
        a rank that is no member asked to join (the answer rides on the next round's
        allreduce). It reads the ``join/{rank}`` keys themselves, which only a grow takes
        away: a request whose grow a break overtook is seen again after the census."""
        now = time.monotonic()
        if now < self.next_look:
            return False
        self.next_look = now + JOIN_LOOK
        return bool(self.asking())

    def asking(self, asks: dict[int, list[Any]] | None = None) -> list[int]:
        """The ranks, no members, whose ``join/{rank}`` asks to be taken in (:meth:`requests`),
        a node started again only once all of its ranks asked: a node heals at one step
        boundary, not rank by rank. Its launcher started every one of them (a ``dead/`` key
        may still stand for one that has not asked yet) and stops them all if one dies again;
        the joiners' own --timeout bounds the wait."""
        asks = self.requests() if asks is None else asks
        here = {*asks, *self.members}
        return [r for r, request in asks.items() if set(node_mates(request)) <= here]

    def requests(self) -> dict[int, list[Any]]:
        """The live requests to join, by rank: [step, rows, node mates]. A rank whose
        ``dead/{rank}`` is set died after it asked (a rank started again withdraws its
        ``dead/`` key before it asks): its request is stale, and taking it in would fail the
        new generation's forming once, before a census. The lowest member clears it; a
        withdrawn one (``WITHDRAWN``) is no request."""
        asks = {}
        for r in range(self.world):
            if r in self.members or not self.store.check([f"join/{r}"]):
                continue
            if self.store.check([f"dead/{r}"]):
                log.info("rank %d died waiting to join: its request is withdrawn", r)
                with contextlib.suppress(Exception):  # gone already (another look cleared it)
                    self.store.delete_key(f"join/{r}")
                continue
            request = json.loads(self.store.get(f"join/{r}"))
            if request != json.loads(WITHDRAWN):
                asks[r] = request
        return asks

    def grow(self, step: int, rows: int) -> Census:
        """GROWING: every member at the same step boundary; the lowest member takes in the
        ranks that asked to join, and tells them the generation and what it knows."""
        self.phase = ShrinkPhase.GROWING
        g, store = self.generation, self.store
        key = f"gen{g}/grow"
        if self.rank == self.members[0]:
            asks = self.requests()
            joiners = self.asking(asks)
            steps = dict.fromkeys(map(str, self.members), step)
            rows_of = dict.fromkeys(map(str, self.members), rows)
            for j in joiners:
                steps[str(j)], rows_of[str(j)] = asks[j][:2]
                store.delete_key(f"join/{j}")
            members = sorted(self.members + joiners)
            census = {"members": members, "steps": steps, "rows": rows_of, "joined": joiners}
            census["recent"] = list(self.deadline.recent)  # the joiners' deadline (``join``)
            for j in joiners:
                store.set(f"joined/{j}", json.dumps([g + 1, census]))
            store.set(key, json.dumps(census))
        store.wait([key], datetime.timedelta(seconds=self.deadline.bound))
        census = json.loads(store.get(key))
        return Census(
            census["members"],
            {int(k): v for k, v in census["steps"].items()},
            {int(k): v for k, v in census["rows"].items()},
            [],
            joined=census["joined"],
        )

    def form(self, members: list[int], old: Collectives) -> GroupCollectives:
        """Generation g + 1's group among ``members`` (bounded by the deadline); the old
        generation's group is aborted first, so its stuck collective holds nothing."""
        self.phase = ShrinkPhase.FORMING
        abort(old.group if old.group is not None else dist.group.WORLD)
        if isinstance(old, GroupCollectives) and old.group is not None:  # its own: let go
            self.left.append(let_go(old, self.deadline.timeout))
        else:  # the job's default group stays the script's (it may still ask its rank)
            self.left.append(old.group)
        self.generation, self.members = self.generation + 1, members
        g, me = self.generation, members.index(self.rank)
        timeout = datetime.timedelta(seconds=self.deadline.bound)
        return generation_group(
            self.store, g, me, len(members), self.device, timeout, self.deadline, old.drill
        )

    def regroup(
        self,
        old: Collectives,
        step: int,
        rows: int,
        sync: Callable[[GroupCollectives, Census], None],
        grow: bool = False,
        join: bool = False,
    ) -> tuple[GroupCollectives, Census]:
        """Census (or, with ``grow``, the step boundary that takes joiners in), forming and
        sync until a generation holds: a member lost meanwhile (a death during the census,
        the forming, the sync or a heal) breaks the new generation, and the protocol runs
        again from it, at most once per rank of the job. ``join``: this rank was started
        again and asks to join first."""
        began, in_flight, lost, joined, comm = time.monotonic(), step, [], [], old
        if not (grow or join):  # a break: the deadline that was in force decided it
            self.broke_at = (step, self.deadline.bound, self.deadline.describe())
        for attempt in range(self.world):
            if attempt == 0 and (grow or join):
                found = self.grow(step, rows) if grow else self.join(step, rows)
            else:
                found = self.census(step, rows)
            lost += found.dead
            joined += [j for j in found.joined if j not in joined]
            try:
                comm = self.form(found.members, comm)
                self.phase = ShrinkPhase.SYNCING
                sync(comm, found)
            except (Broken, RuntimeError) as exc:  # gloo's own errors are RuntimeErrors
                log.warning("generation %d failed as it formed: %s", self.generation, exc)
                with contextlib.suppress(Exception):  # every member leaves it for a census
                    self.store.set(f"gen{self.generation}/broken", "forming failed")
                continue
            self.phase = ShrinkPhase.STEPPING
            seconds = time.monotonic() - began
            joined = [j for j in joined if j in found.members]  # a joiner lost again is lost
            found.dead, found.joined = sorted(set(lost)), sorted(joined)
            self.history.append((self.generation, in_flight, found.dead, found.joined, seconds))
            self.held(found)
            log.warning(
                # every survivor logs it: the rank says whose line it is, as "step broke" does
                "rank %d: step %d: generation %d of ranks %s goes on after %.2fs (lost %s, "
                "joined %s)",
                self.rank,
                in_flight,
                self.generation,
                found.members,
                seconds,
                found.dead,
                found.joined,
            )
            return comm, found
        raise TailtrainError(f"rank {self.rank}: no generation held after losing {lost}")

    def held(self, found: Census) -> None:
        """Say in the store that this generation held (``gen{g}/held``: its members, the step
        it goes on from, the ranks lost and taken in; the first member's word stands) and, in a
        rank taken in, ``healed/{rank}``: a launcher says what the ranks did only once it holds
        (``runtime.launching.scripts``)."""
        g, step = self.generation, max(found.steps.get(m, 0) for m in found.members)
        word = {"members": found.members, "step": step, "lost": found.dead, "joined": found.joined}
        with contextlib.suppress(Exception):  # words for the launcher: the group holds anyway
            self.store.compare_set(f"gen{g}/held", "", json.dumps(word))
            if self.rank in found.joined:
                self.store.set(f"healed/{self.rank}", json.dumps([g, step]))


def node_mates(request: list[Any]) -> list[int]:
    """The ranks started again with a joiner as one node (its request's third field; none for
    a rank started alone)."""
    return [int(r) for r in request[2]] if len(request) > 2 else []
