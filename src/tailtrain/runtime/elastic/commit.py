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
   ``broken`` key, writes ``ABORT`` there. Both write with ``compare_set`` on the absent key,
   so the first word stands and every member reads the same one.
3. **Apply or leave.** On ``COMMIT`` every member applies the round (and the rule adapts);
   on ``ABORT`` none does: the member marks the generation broken and raises ``Broken``, so
   every member meets in the census and the survivors compute the round again.

A member that never voted (it died, or its collective failed) leaves the count short, so the
round cannot commit: a vote comes only after the round's last collective, and the first
``ABORT`` stands before the count can be complete. A member that dies after it voted is lost
in the next round, whose collectives it misses. Every wait is bounded by the learned deadline
(``runtime.elastic.deadline``). The member that completes round r's count deletes round
r - 1's keys: every member read that decision before it voted in round r.

Cost per round: one ``add``, polls of one key every ``group.POLL`` seconds while the last
member arrives (the members left the round's last collective together, up to a few store
round trips apart), one ``get``: about a millisecond on loopback.
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


def commit(store: dist.Store, generation: int, members: int, step: int, deadline: Deadline) -> None:
    """Vote for round ``step`` of generation ``generation`` (``members`` ranks) and wait for
    the decision (module docstring); return on ``COMMIT``, raise :class:`Broken` on
    ``ABORT``."""
    key, broken = f"gen{generation}/commit/{step}", f"gen{generation}/broken"
    if store.add(f"{key}/in", 1) == members:
        decided = Decision(store.compare_set(key, "", Decision.COMMIT).decode())
        if decided == Decision.COMMIT:
            with contextlib.suppress(Exception):  # tidy only: every member read it
                store.delete_key(f"gen{generation}/commit/{step - 1}")
                store.delete_key(f"gen{generation}/commit/{step - 1}/in")
    else:
        decided = wait_for(store, key, broken, deadline.bound)
    if decided != Decision.COMMIT:
        with contextlib.suppress(Exception):
            store.set(broken, f"round {step} aborted")
        raise Broken(f"generation {generation}: round {step} was not committed on every member")


def wait_for(store: dist.Store, key: str, broken: str, bound: float) -> Decision:
    """The decision at ``key``; after ``bound`` seconds, or once ``broken`` is set, this member
    offers ``ABORT`` and the first word stands."""
    start = time.monotonic()
    look = start + CHECK
    while not store.check([key]):
        now = time.monotonic()
        if now - start > bound or (now >= look and store.check([broken])):
            break
        if now >= look:
            look = now + CHECK
        time.sleep(POLL)
    return Decision(store.compare_set(key, "", Decision.ABORT).decode())
