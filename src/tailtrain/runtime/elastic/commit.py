"""One decision for a round that several process groups reduce: commit it everywhere or nowhere.

A sharded job (``integrate.sharded``, hybrid sharding over a replicate x shard mesh) reduces
each round over S replicate groups, one per shard index, and FSDP's collectives within each
replica group are apart from them. When a rank dies during the reduction, the replicate group
of one shard index can complete its all-reduce while another's fails: without one decision,
a surviving replica group would hold shard 0 at round r and shard 1 at round r - 1, and no
redone round could put them back together. So no rank applies a round before every member of
the generation said that its collectives of the round completed, and the store (the
launcher's: it outlives any rank) decides once:

1. **Vote.** A member whose round's last collective completed adds one to
   ``gen{g}/commit/{r}/in``.
2. **Decide.** The member whose add made the count the number of members writes ``COMMIT``
   to ``gen{g}/commit/{r}``; a member that waited past the deadline, or saw the generation's
   ``broken`` key or a member's ``dead/{rank}`` (the launcher's shield writes it the moment
   a rank's process dies), writes ``ABORT`` there. Both write with ``compare_set`` on the
   absent key, so the first word stands and every member reads the same one.
3. **Apply or leave.** On ``COMMIT`` every member applies the round (and the rule adapts);
   on ``ABORT`` none does: the member marks the generation broken and raises ``Broken``, so
   every member meets in the census and the survivors compute the round again.

A member that never voted (it died, or its collective failed) leaves the count short, so the
round cannot commit: a vote comes only after the round's last collective, and the first
``ABORT`` stands before the count can be complete. A member that dies after it voted is lost
in the next round, whose collectives it misses. Every wait is bounded by the learned deadline
(``runtime.elastic.deadline``). The member that completes round r's count deletes round
r - 1's keys: every member read that decision before it voted in round r.

Cost per round and member: one ``add``, then either the ``compare_set`` that decides or polls
of the decision's key every ``group.POLL`` seconds (and of the ``broken`` and ``dead/`` keys
every ``group.CHECK`` seconds) while the last member arrives, and one ``compare_set`` that
reads it: about a millisecond on loopback, since the members left the round's last
collective together. The same decision, under its own key, closes the forming of a sharded
job's new generation (``integrate.group_membership``): every member formed its groups, or
none goes on.
"""

from __future__ import annotations

import contextlib
import time
from enum import StrEnum

import torch.distributed as dist

from tailtrain.runtime.elastic.deadline import Deadline
from tailtrain.runtime.elastic.group import CHECK, POLL, Broken


class Decision(StrEnum):
    """The store's word on a round (module docstring)."""

    COMMIT = "commit"
    ABORT = "abort"


def commit(
    store: dist.Store, generation: int, members: list[int], step: int, deadline: Deadline
) -> None:
    """Vote for round ``step`` of generation ``generation`` (its ``members``, job ranks) and
    wait for the decision (module docstring); return on ``COMMIT``, raise :class:`Broken` on
    ``ABORT``."""
    key, previous = f"gen{generation}/commit/{step}", f"gen{generation}/commit/{step - 1}"
    if decide(store, key, generation, members, deadline, previous) == Decision.COMMIT:
        return
    raise Broken(f"generation {generation}: round {step} was not committed on every member")


def decide(
    store: dist.Store,
    key: str,
    generation: int,
    members: list[int],
    deadline: Deadline,
    previous: str | None = None,
) -> Decision:
    """This member's vote on ``key`` and the store's one decision (module docstring). The
    vote that completes the count offers ``COMMIT``; a member that waited past the deadline,
    or saw the generation broken or a member dead (``dead/{rank}``, which the launcher's
    shield sets), offers ``ABORT``; the first word stands. On ``ABORT`` the generation is
    marked broken, so every member still in a collective leaves it. ``previous``: the keys
    of a decision every member read before it voted here, which a completed count deletes."""
    broken = f"gen{generation}/broken"
    gone = [broken, *(f"dead/{m}" for m in members)]
    if store.add(f"{key}/in", 1) == len(members):
        decided = Decision(store.compare_set(key, "", Decision.COMMIT).decode())
        if decided == Decision.COMMIT and previous is not None:
            with contextlib.suppress(Exception):  # tidy only
                store.delete_key(previous)
                store.delete_key(f"{previous}/in")
    else:
        start = time.monotonic()
        look = start + CHECK
        while not store.check([key]):
            now = time.monotonic()
            if now - start > deadline.bound:
                break
            if now >= look:
                if any(store.check([k]) for k in gone):
                    break
                look = now + CHECK
            time.sleep(POLL)
        decided = Decision(store.compare_set(key, "", Decision.ABORT).decode())
    if decided != Decision.COMMIT:
        with contextlib.suppress(Exception):
            store.set(broken, f"{key} aborted")
    return decided
