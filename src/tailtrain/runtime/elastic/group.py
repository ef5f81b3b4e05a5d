"""A generation's watched collectives (``runtime.elastic.shrink``, STEPPING and FORMING).

Every collective of a shrinking rank is waited for by polling (:class:`Watch`), so each wait
has two bounds: the learned deadline (``runtime.elastic.deadline``) and the generation's
``broken`` key, which any member sets when its collective fails or outlives the deadline.
A generation g > 0 runs on its own ``ProcessGroupGloo``, which torch.distributed does not know:
:class:`GroupCollectives` speaks ``Collectives`` over it (and so does a user's loop's generation
0, ``integrate.membership``), each built by :func:`generation_group`. A generation left is
aborted (:func:`abort`); one on its own group is let go (:func:`let_go`), which closes its
sockets; the job's default group stays, as the script that made it may still ask it its rank.
"""

from __future__ import annotations

import datetime
import logging
import pickle
import threading
import time
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from tailtrain.errors import TailtrainError
from tailtrain.runtime.elastic.deadline import Deadline
from tailtrain.runtime.reduce import Collectives, RankRow

log = logging.getLogger(__name__)

#: seconds between two looks at the generation's ``broken`` key while a collective runs
CHECK = 0.02
#: seconds between two looks at a left group's last collective before it is let go
RELEASE_POLL = 0.01
#: seconds a waiting rank sleeps between two looks at its collective. A poll, not
#: ``Work.wait(timeout)`` slices: those measured ~2 ms a round slower (the collective's own
#: time, bench_faults calm, 4 gloo ranks on 2 cores) for no CPU saved; and a slice under
#: 1 ms is 0 ms, c10d's "no timeout"
POLL = 0.0005


class Broken(TailtrainError):
    """This rank's generation broke: a collective failed, outlived the deadline, or a peer
    said so (``gen{g}/broken``)."""


class Watch:
    """Waits for one generation's collectives (``Collectives.watch``): each wait ends when the
    collective does, at the deadline, or when the generation's ``broken`` key appears; the
    last two raise :class:`Broken` after setting the key for the others."""

    def __init__(self, store: dist.Store, generation: int, deadline: Deadline) -> None:
        self.store, self.generation, self.deadline = store, generation, deadline
        self.key = f"gen{generation}/broken"
        self.last: dist.Work | None = None
        #: a barrier around rank 0's evaluation waits up to --timeout, not the deadline
        self.patient = False

    def __call__(self, work: dist.Work) -> None:
        self.last = work  # a left group is let go once it ended (``release``)
        start = time.monotonic()
        bound = self.deadline.timeout if self.patient else self.deadline.bound
        look = start + CHECK
        while not work.is_completed():
            now = time.monotonic()
            if now - start > bound:
                self.broken(f"no answer within the deadline {bound:.2f}s", hung=True)
            if now >= look:
                if self.store.check([self.key]):
                    raise Broken(f"generation {self.generation} broke ({self.store_why()})")
                look = now + CHECK
            time.sleep(POLL)
        try:
            work.wait()
        except Exception as exc:  # gloo: a peer's socket closed
            self.broken(f"a collective failed: {str(exc).strip().splitlines()[0][:120]}")

    def broken(self, why: str, hung: bool = False) -> None:
        try:
            if hung:  # before the break: a census that sees the break sees the hang
                self.store.set(f"gen{self.generation}/hung", "1")
            self.store.set(self.key, why)
        except Exception as exc:
            log.warning("could not mark generation %d broken: %s", self.generation, exc)
        raise Broken(f"generation {self.generation}: {why}")

    def store_why(self) -> str:
        try:
            return self.store.get(self.key).decode()
        except Exception:
            return "unknown"


class GroupCollectives(Collectives):
    """``Collectives`` over a group that torch.distributed does not know (a generation's own
    ``ProcessGroupGloo``): its gathers are allreduces of block rows, and its barrier one of a
    single value, called on the group itself."""

    def gather(self, row: RankRow) -> np.ndarray:
        mine = np.asarray(row, dtype=np.float64)
        block = torch.zeros(self.world_size, len(mine), dtype=torch.float64)
        block[self.rank] = torch.from_numpy(mine)
        with self._guard("all_gather"):
            self._wait(self.group.allreduce([block]))
        return block.numpy()

    def barrier(self) -> None:
        with self._guard("barrier"):
            self._wait(self.group.allreduce([torch.zeros(1)]))

    def gather_objects(self, obj: Any) -> list[Any] | None:
        data = pickle.dumps(obj)
        sizes = self.gather([len(data)])[:, 0].astype(np.int64)
        block = torch.zeros(self.world_size, int(sizes.max()), dtype=torch.uint8)
        block[self.rank, : len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        with self._guard("gather_object"):
            # uint8 sums of one row and zeros: exact, as long as the other rows are zero
            self._wait(self.group.allreduce([block]))
        if self.rank != 0:
            return None
        return [pickle.loads(block[r, : sizes[r]].numpy().tobytes()) for r in range(len(sizes))]

    def broadcast_object(self, obj: Any, src: int) -> Any:
        """``obj`` of member ``src`` on every member (the sync's payload)."""
        data = pickle.dumps(obj) if self.rank == src else b""
        size = int(self.gather([len(data)])[src, 0])
        buf = torch.zeros(size, dtype=torch.uint8)
        if self.rank == src:
            buf.copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
        opts = dist.BroadcastOptions()
        opts.rootRank = src
        with self._guard("broadcast"):
            self._wait(self.group.broadcast([buf], opts))
        return obj if self.rank == src else pickle.loads(buf.numpy().tobytes())


def abort(group: Any) -> None:
    """Abort a left generation's group: its stuck collective must not hold the exit."""
    try:
        if hasattr(group, "_get_backend"):  # the default group: its gloo backend
            group = group._get_backend(torch.device("cpu"))
        group.abort()
    except Exception as exc:
        log.info("could not abort a left group: %s", exc)


def generation_group(
    store: dist.Store,
    generation: int,
    rank: int,
    size: int,
    device: torch.device,
    timeout: datetime.timedelta,
    deadline: Deadline,
    drill: Any = None,
) -> GroupCollectives:
    """Generation ``generation``'s own ``ProcessGroupGloo`` among ``size`` ranks over
    ``PrefixStore(f"gen{g}", store)``, its collectives watched by a :class:`Watch` of its own;
    ``drill``: the fault drills it carries (``runtime.inject``), if armed."""
    group = dist.ProcessGroupGloo(dist.PrefixStore(f"gen{generation}", store), rank, size, timeout)
    comm = GroupCollectives(rank, size, device, grace=0.0, group=group, timeout=timeout)
    if drill is not None:
        comm.arm(drill)
    comm.watch = Watch(store, generation, deadline)
    return comm


def let_go(comm: GroupCollectives, bound: float) -> threading.Thread:
    """Let a left generation's own group go (:func:`release`) with the collective its watch
    waited for last; ``comm`` keeps neither (a Work holds the group's connections). ``bound``:
    seconds, where ``comm`` has no timeout of its own."""
    group, comm.group = comm.group, None
    watch = comm.watch if isinstance(comm.watch, Watch) else None
    work = watch.last if watch is not None else None
    if watch is not None:
        watch.last = None
    seconds = comm.timeout.total_seconds() if comm.timeout else bound
    return release(group, work, seconds)


def release(group: dist.ProcessGroup, work: dist.Work | None, bound: float) -> threading.Thread:
    """Let a left generation's own group go: only its destructor closes its sockets (gloo's
    ``abort`` and ``shutdown`` leave them open, and a live peer's bytes for a collective this
    rank left make gloo's event loop spin on them, a core's worth, for as long as the group
    lives). The destructor waits for the group's collectives and holds the GIL meanwhile, so a
    thread of its own holds the last reference until the collective this rank waited for last
    (``work``: the one that broke) ended, at most ``bound`` seconds (the group's timeout,
    within which gloo ends any collective): once a rank let go, its peers' collectives with it
    fail, and they let go in turn."""
    held = [group]
    del group

    def let_go() -> None:
        end = time.monotonic() + bound
        while work is not None and not work.is_completed() and time.monotonic() < end:
            time.sleep(RELEASE_POLL)
        held.clear()

    thread = threading.Thread(target=let_go, name="tailtrain-release", daemon=True)
    thread.start()
    return thread
