"""Lose a rank, keep training: the partial collective's shrink in place (issue 26).

With ``--on-rank-loss shrink`` the ranks of eager-SGD's partial collective
(``runtime.partial.collective``: solo, majority, quorum) go on without a rank that died or
hung, with no restart and no checkpoint read. The group protocol is the allreduce's
(``runtime.elastic.shrink``, shared as it is: generations of a fresh ``ProcessGroupGloo``
over ``PrefixStore("gen{g}", agent store)``, the census with its ``dead/{rank}`` keys from
the shield, the closer, the retry when a member dies during the census or the forming, the
``finished`` key); this module is the collective's own part around it.

**States** (:class:`CollectivePhase`) of one rank's collective:

* ``RUNNING``: the rounds of generation g's :class:`PartialCollective`. Every wait of the
  main thread for a round or a plan looks every ``WATCH_SLICE`` seconds at a
  :class:`DeathWatch`: the generation's ``broken`` key and the ``dead/{m}`` key of every
  other member m, at most every :data:`LOOK` seconds, so a dead initiator (majority's
  designated rank, the counter of a quorum round), whose round would never be activated,
  stops nobody for longer than that. A wait for a round is bounded by the learned deadline
  (``runtime.elastic.deadline.Deadline``, the allreduce's rule: ``DEADLINE_FACTOR`` times
  the ``QUANTILE`` quantile of the last ``ROUNDS_SEEN`` steps seen, at least
  ``LONGEST_FACTOR`` times the longest of them, at least ``MIN_DEADLINE`` seconds, at most
  ``--timeout``; a step is a whole job, compute, delay and call, since a live member may be
  anywhere in one when a peer fails): a hung initiator or a stopped process (its reducer
  stalls every round's data phase) is found there. The same deadline bounds the wait for the
  threads when a generation closes. The progress threads' own
  waits stay bounded by ``--timeout`` (the groups' timeouts) and end at the latest when the
  groups are aborted below.
* ``ABORTING``: the main thread saw the failure (a thread's collective raised: a peer's
  socket closed; the watch; the deadline). It freezes the rule
  (``runtime.partial.rule.Rule.freeze_for_regroup``: a round its reducer completes from now
  on counts nowhere here), sends ``ABORT``
  (``PartialCollective.abort``), aborts the generation's activation and reduce groups
  (``ProcessGroupGloo.abort``, so no thread stays in a collective), and goes to the census
  at once (the threads leave on their own). What it completed: the rounds its reducer
  finished (``done``).
* ``REGROUPING``: ``Shrinker.regroup`` with ``done`` for the step: CENSUS, FORMING and
  SYNCING as the allreduce's module says. A member that died meanwhile breaks the new
  generation and the census runs again. A rank that checked in late (it hung past the
  deadline and woke) is not among the members and asks to join (JOINING, below).
* ``GROWING`` (a heal): a rank asks to join, started again by the shield after it died
  (``--restart-lost N``: it skips the job's process group and asks at once) or woken after a
  census went on without it (``join/{rank}``, as the allreduce's JOINING). Rank 0's main
  thread looks for those keys at most every ``JOIN_LOOK`` seconds
  (``Shrinker.joins_waiting``; a key stays until a grow takes its rank in, so a request
  whose grow a failure overtook is seen again in the next generation) and says so in its
  next slot (the head's ``grow``), so every
  member learns it from the same round r: the rule ends the generation after r, every member
  closes its collective cleanly (no round lost), and ``Shrinker.regroup(grow=True)`` takes the
  joiners in at that boundary (``Shrinker.grow``), then FORMING and HANDOVER as after a loss:
  the joiner takes the model, rule, clock and rows from the lead, never from disk. A joiner
  that finds the run over (``finished``) or waits past ``--timeout`` is ``REFUSED`` and its
  work counts nowhere.
* ``HANDOVER`` (SYNCING): the lead member, the one whose reducer completed the most rounds
  (the lowest rank among equals; a round completes everywhere or on some survivors only, when
  a peer died inside its allreduce), broadcasts over the generation's ``GroupCollectives``
  its *agreed model* (the model of a rank that adopted every round, which every rank keeps:
  ``runtime.partial.rule``), the rule's state, the run's clock, the injected
  communication draws, the update's state and the rows of the rounds the others lack. Every
  member takes the agreed model as its own (a shrink is a model average, as a resume is),
  and the rule follows the live world (``RuleDriver.followed``: eager's divisor P, its quorum
  and majority's initiator draw become the L live ranks). The members then build the new
  collective's two groups (``gen{g}/partial/act``, ``gen{g}/partial/reduce`` under the agent
  store), bounded by the deadline; a member lost there breaks it as in FORMING.
* back to ``RUNNING`` on generation g + 1, from round ``done`` of the lead, rank r of the
  collective being the member's index (its data shard and delays stay its original rank's).

**The smaller world, and what is lost.** Each live rank keeps its own data shard and
per-rank batch (the same per-rank batch; a round's sum is divided by the L live ranks, Alg. 2
line 6 with P = L). The dead rank's shard is skipped from then on: every rank draws its own
jobs only (keyed (seed, rank, job)), so no sample is used twice. At a regroup each member
looks at the calls it made since the last one (:func:`dropped_calls`): the call in flight is
done again with the same job key (nothing lost, nothing twice) unless a round the lead
completed carried it (then it counts there and the job moves on); a gradient parked in its
send buffer (a late or waiting call) that no such round carried is dropped, and the first
round of the new generation counts every member's in ``skipped`` (samples), as every row
counts the lost ranks' shards (one job of each a round, as the allreduce counts them). The
dead rank's gradients that no round carried before it died are lost with it (not counted:
nobody knows them). A model average pending at the failure (``sync-every``) is replaced by
the agreed model, which every member takes.

**The record.** Rows of a shrinking run gain ``live`` (original ranks of the round's
generation), ``dead`` (lost just before it), ``skipped``, ``rejoined`` (taken in just
before it), ``committed_at`` (Unix seconds when this rank's reducer completed the round),
``generation``, and, aligned with ``workers``, ``jobs`` and ``adopted`` (the round each
gradient's rank had adopted last when it computed it: ``runtime.partial.wire``'s slot column);
``workers``, ``initiators`` and ``active`` name original ranks. The summary gains
``generations`` (as the allreduce's) and ``calls``: per surviving rank, each call
``[generation, job, version, adopted]`` (``adopted``: the round it adopted, None for a call a
failure cut). From these a run's final parameters can be rebuilt
(``tests/runtime/partial/test_regroup.py``).

**Refused** (one line at start, ``runtime.elastic.refusals.check_shrink``, as the allreduce): a
launch under torchrun (its agent stops the job when any rank dies), a rule that cannot follow a
smaller world (``dbw-quorum``'s time estimates), a run on nccl or CUDA tensors (a generation's
groups are gloo's). Rank 0's loss stops the job as with the allreduce: it keeps the record and
answers the launcher. A joiner's job count starts past the lead's rounds (a rank's j-th job
is never past the run's round j: one call per round), so a rank started again uses no
mini-batch it may have used before it died.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import time
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import torch.distributed as dist

from tailtrain.runtime.elastic.group import Broken, GroupCollectives, abort
from tailtrain.runtime.elastic.handover import elect, hand_over, pass_drills
from tailtrain.runtime.elastic.shrink import Shrinker
from tailtrain.runtime.partial.collective import PartialCollective

if TYPE_CHECKING:
    import torch

    from tailtrain.core.scenario import World
    from tailtrain.runtime.config import TrainConfig
    from tailtrain.runtime.elastic.shrink import Census
    from tailtrain.runtime.partial.rule import Rule
    from tailtrain.runtime.reduce import Collectives

log = logging.getLogger(__name__)

#: seconds between two looks of a waiting main thread at the store (``broken``, ``dead/{m}``)
LOOK = 0.05
#: the store key where rank 0 keeps the longest step its deadline learned, for a rank started
#: again (its own deadline knows no step yet); rewritten when it grows by PUBLISH_GROWTH
LONGEST = "partial/longest"
PUBLISH_GROWTH = 1.2


class CollectivePhase(StrEnum):
    """A rank's partial collective under ``--on-rank-loss shrink`` (module docstring)."""

    RUNNING = "running"
    ABORTING = "aborting"
    REGROUPING = "regrouping"
    GROWING = "growing"
    HANDOVER = "handover"
    REFUSED = "refused"


class Member(Protocol):
    """What a regroup reads and replaces of one rank's run (``runtime.partial.rounds`` holds
    it): declared here, so this module needs nothing of the rank loop that drives it."""

    config: TrainConfig
    world: World
    rule: Rule
    #: the job's collectives, then a generation's (``GroupCollectives``)
    comm: Collectives
    coll: PartialCollective | None
    shrinker: Shrinker | None
    phase: CollectivePhase
    #: the original rank (its data shard and delays), the model and the next job
    rank: int
    theta: torch.Tensor
    job: int
    #: each call ``[generation, job, version, adopted]``, those a regroup accounted for, and
    #: the longest step rank 0 last told the store (:func:`publish_deadline`)
    calls: list[list[Any]]
    accounted: int
    published: float


class DeathWatch:
    """What a waiting main thread looks at (module docstring, RUNNING): raises
    :class:`~tailtrain.runtime.elastic.group.Broken` once generation g broke or a member
    is known dead."""

    def __init__(self, shrinker: Shrinker) -> None:
        self.store = shrinker.store
        self.broken = f"gen{shrinker.generation}/broken"
        others = [m for m in shrinker.members if m != shrinker.rank]
        self.dead = [(m, f"dead/{m}") for m in others]
        self.next = 0.0

    def __call__(self) -> None:
        now = time.monotonic()
        if now < self.next:
            return
        self.next = now + LOOK
        if self.store.check([self.broken]):
            raise Broken(f"{self.broken} is set")
        for member, key in self.dead:
            if self.store.check([key]):
                raise Broken(f"rank {member} died")


def publish_deadline(run: Member) -> None:
    """Rank 0 keeps the longest step its deadline learned in the store (:data:`LONGEST`), so
    that a rank started again forms its first generation within the live ranks' deadline,
    not ``--timeout``; written only when it grew by :data:`PUBLISH_GROWTH`."""
    assert run.shrinker is not None
    longest = run.shrinker.deadline.longest
    if longest > run.published * PUBLISH_GROWTH:
        run.shrinker.store.set(LONGEST, repr(longest))
        run.published = longest


def generation_groups(
    shrinker: Shrinker, timeout: float
) -> tuple[dist.ProcessGroup, dist.ProcessGroup]:
    """The activation and reduce groups of the shrinker's current generation (its members,
    renumbered by index), each over its own prefix of the agent's store; bounded by
    ``timeout`` seconds (a member lost here raises a RuntimeError: the census runs again)."""
    g, members = shrinker.generation, shrinker.members
    me, span = members.index(shrinker.rank), datetime.timedelta(seconds=timeout)
    groups = []
    for name in ("act", "reduce"):
        store = dist.PrefixStore(f"gen{g}/partial/{name}", shrinker.store)
        groups.append(dist.ProcessGroupGloo(store, me, len(members), span))
    return groups[0], groups[1]


def new_collective(
    run: Member, groups: tuple[dist.ProcessGroup, dist.ProcessGroup] | None = None
) -> PartialCollective:
    """The partial collective of ``run``'s current generation (``groups``: a shrunk one's;
    None: every rank of the job), watched under shrink (module docstring, RUNNING)."""
    config, rule, comm, shrinker = run.config, run.rule, run.comm, run.shrinker
    watched: dict[str, Any] = {}
    if shrinker is not None:
        deadline = shrinker.deadline
        watched = {"watch": DeathWatch(shrinker), "bound": lambda: deadline.bound}
    return PartialCollective(
        comm.rank,
        comm.world_size,
        int(run.world.task.dim),
        rule.first(),
        rule.after_round,
        backend=config.backend,
        device=comm.device,
        timeout=config.timeout,
        groups=groups,
        **watched,
    )


def regroup_run(
    run: Member, exc: BaseException | None, grow: bool = False, join: bool = False
) -> None:
    """After ``exc``: ABORTING, then REGROUPING and HANDOVER (module docstring); with
    ``grow`` (the generation ended cleanly: a rank asks to join) or ``join`` (this rank was
    started again), GROWING or JOINING instead of the census. ``run`` goes on in the new
    generation with its collective (``run.coll``), or with none when the lead's rounds
    already spent the run's budget."""
    shrinker, rule, coll = run.shrinker, run.rule, run.coll
    assert shrinker is not None
    if exc is not None and coll is not None:
        log.warning("rank %d: %s", run.rank, exc)
        run.phase = CollectivePhase.ABORTING
        rule.freeze_for_regroup()
        coll.abort()  # ABORT to the peers, then no thread may stay inside a collective
        abort(coll.act_group)
        abort(coll.red_group)
        # no wait for the threads: the census window does not wait for this rank, and the
        # frozen rule lets no thread change what it checks in with; they leave on their own
    run.phase = CollectivePhase.GROWING if grow or join else CollectivePhase.REGROUPING
    if join:  # started again: the live ranks' deadline, not --timeout, bounds its forming
        with contextlib.suppress(Exception):
            if shrinker.store.check([LONGEST]):
                shrinker.deadline.seen(float(shrinker.store.get(LONGEST)))
    done = rule.done
    sync = lambda comm, found: handover(run, comm, found)  # noqa: E731
    run.comm, found = shrinker.regroup(run.comm, done, done, sync, grow=grow, join=join)
    # the next row's (regroup gathered them over its tries)
    rule.lost, rule.joined = list(found.dead), list(found.joined)
    run.phase = CollectivePhase.RUNNING


def handover(run: Member, comm: GroupCollectives, found: Census) -> None:
    """HANDOVER (module docstring): the lead's state on every member, the dropped gradients
    counted, the new collective built; raises (Broken, RuntimeError) when a member is lost
    meanwhile, and Shrinker.regroup runs the census again."""
    shrinker, rule = run.shrinker, run.rule
    assert shrinker is not None
    run.phase = CollectivePhase.HANDOVER
    lead = elect(comm, rule.done, rule.done)  # a round is a row
    clock = rule.origin + (run.coll.now() if run.coll is not None else rule.now)
    # the rows rank 0 lacks (member 0: it keeps the record; a joiner far behind needs none)
    state = hand_over(comm, lead, lambda: rule.handover_state(lead.rows[0], clock))
    # a joiner (started again, or woken after a census) is not of the lead's generation
    joiner = run.rank not in state["members"]
    dropped, carried = dropped_calls(run, state)
    drops = comm.gather([dropped])[:, 0]
    rule.take_over(state, list(found.members), shrinker.generation)
    rule.skipped += int(drops.sum()) * run.world.task.batch_size
    run.theta, run.accounted = rule.agreed.clone(), len(run.calls)
    run.job += int(carried)  # else the job in flight is computed again, with its own key
    if joiner:
        # a rank's j-th job is never past the run's round j (one call per round), so a
        # joiner that lost its count (started again) takes none it may have used
        run.job = max(run.job, rule.done + 1)
    pass_drills(comm, rule.done)  # the rounds this rank did not reach
    if run.world.finished(rule.done, rule.now):
        run.coll = None
        return
    groups = generation_groups(shrinker, shrinker.deadline.bound)
    run.comm = comm  # the collective's rank and size are the generation's
    try:
        run.coll = new_collective(run, groups)
    except BaseException:
        abort(groups[0])
        abort(groups[1])
        raise


def dropped_calls(run: Member, state: dict[str, Any]) -> tuple[int, bool]:
    """This rank's calls since the last regroup whose gradient no round the lead completed
    carried: the number of those dropped from the send buffer (lost, counted in ``skipped``),
    and whether a round carried the call in flight (else its job is computed again with the
    same key: nothing is lost or used twice)."""
    rule = run.rule
    carried = set(rule.carried)
    for row in rule.owed_rows(state):
        versions = row["step"] - np.asarray(row["staleness"], dtype=np.int64)
        carried.update(
            int(v) for w, v in zip(row["workers"], versions, strict=True) if w == run.rank
        )
    calls = run.calls[run.accounted :]
    flying = calls[-1] if calls and calls[-1][3] is None else None
    lost = [c for c in calls if c is not flying and c[2] not in carried]
    return len(lost), flying is not None and flying[2] in carried
