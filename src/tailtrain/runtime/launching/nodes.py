"""A job across nodes (issue 37): one ``tailtrain launch`` per node, meeting at one store.

``tailtrain launch --nnodes N --node-rank I --rdzv-endpoint HOST:PORT --nproc-per-node P
script.py`` on each of N machines starts that node's P ranks with torch's ``env://`` variables
as torchrun sets them (``RANK`` = I P + local rank, ``LOCAL_RANK``, ``WORLD_SIZE`` = N P,
``LOCAL_WORLD_SIZE`` = P, ``GROUP_RANK`` = I, ``MASTER_ADDR:MASTER_PORT`` the store), so a
script that runs under torchrun runs here unchanged.

**Where the store lives** (:class:`StoreAt`). The store is the shrink protocol's meeting place
(``runtime.elastic.shrink``), so the job lives as long as it does:

* ``launcher`` (the default): node 0's launcher hosts it at ``--rdzv-endpoint``, as torchrun's
  c10d rendezvous does; node 0 says at start, in one line, that the job ends if node 0 is lost;
* ``apart``: ``tailtrain store --rdzv-endpoint HOST:PORT --nnodes N`` hosts it in a small
  process of its own (torchft's lighthouse is its counterpart), started first on a machine
  that stays up; every launcher, node 0's too, is its client, so losing any node, the first
  included, leaves the job going.

The store listens on the address given only (:func:`host_store`: a socket bound there is
handed to the ``TCPStore``, which on its own would listen on every interface), loopback by
default. A c10d store is unauthenticated, as torchrun's is: a job across machines belongs on
a private network.

**Meeting** (:func:`meet`, the :class:`Meeting` it returns). The store's host writes a fresh run id
(``tailtrain/launch/run``: the prefix of every key of the job, so a job never reads another's keys);
every launcher reads it, bounded by ``--timeout``, and counts its node's starts
(``tailtrain/launch/{run}/starts/{I}``): a node whose launcher starts a second time (the user
started it again after the machine died) starts its ranks as restarts, which ask the live ranks to
take them in (JOINING) and heal from a live peer (``integrate.step``), not from disk. The first
launcher's shape (``shape``: ``--nnodes``, ``--nproc-per-node``, ``--group-by``) stands: one given
another is refused in one line before any rank starts. A second start of a node looks at the node's
beats for up to :data:`ALIVE_LOOK` while its ranks import, so a heal does not wait for the look, and
counts itself only then (:meth:`Meeting.confirm`); its ranks ask to join only once the look found
none (``cleared/{I}/{start}`` in the shrink protocol's keys, :meth:`Meeting.clearance`). It is
refused in one line, exit 2, counting nothing, while the node's earlier launcher still beats (a
``--node-rank`` given twice) or when another start of the node took its number meanwhile (two at
once): it kills its ranks before they asked to join (their script ran until then) and says nothing
for the node in the store; after a Ctrl-C during the look its ranks never ask either. Each launcher
beats (``beat/{I}``, every :data:`BEAT` seconds, from a thread of its own) from its meeting (a
second start: its confirmation) until it ends, and says when it ends (``ended/{I}``: which start of
the node, and whether its ranks finished). The store's host (node 0's launcher, or ``tailtrain
store``) keeps the store until every node ended or was lost (no beat for ``--timeout`` seconds), and
at most ``--timeout`` seconds after a node's ranks finished (:func:`await_job_end`), whatever became
of its own ranks. Under ``--on-rank-loss stop`` a node that fails says so (``stop``) and every other
node stops its ranks, as torchrun's agents do.

**A node is the unit of membership** (``--group-by node``, the default across nodes; ``rank``
keeps today's per-rank one): when any rank of a node dies under ``--on-rank-loss shrink``, its
launcher stops the node's other ranks (SIGKILL: they would only wait in a collective with the
dead one), notes every one of them ``dead/{rank}`` in the store at once, so the other nodes'
census need not wait its window, and the node leaves whole: the other nodes' ranks regroup in
place. With ``--restart-lost K`` the node's ranks are started again together (each as a
restart, at most K times), and heal as one rank does; a restart that ends before it was taken
in fails the heal (``runtime.launching.scripts``). A node that left ends its launcher with exit
1 and one line saying why (which rank died, which were stopped, or which restart failed its
heal); whether the others go on is their census's to decide, and their launchers say so once
a generation without the node held, not before. A node stopped (SIGSTOP) past the others'
learned deadline is left out by their census; continued, its ranks find their generation
gone and are refused (``left/{rank}``): their stale step enters no update, and their
launcher ends with exit 1, ``no rank finished: ranks [...] left the job (...)``.

**States and bounds.** A rank, as its launcher sees it: ``ranks.RankState``; a node, as the
store's host sees it: :class:`NodeState`; a rank in the shrink protocol:
``runtime.elastic.shrink.ShrinkPhase``. Every wait of the launchers is bounded: reaching the
store and reading the run id by ``--timeout``; a second start's look at its node's beats by
:data:`ALIVE_LOOK`; the watch's look at the ranks every ``scripts.WATCH_POLL`` seconds, a stop by
``ranks.STOP_GRACE`` before SIGKILL; the store's host by ``--timeout`` after the last sign of
life of any node (:func:`await_job_end`).
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import socket
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum

import torch.distributed as dist

from tailtrain.errors import UsageError
from tailtrain.runtime.launching.endpoint import Endpoint, address_of, unusable

log = logging.getLogger(__name__)

#: the keys of the launchers' own meeting (apart from the shrink protocol's)
LAUNCH_KEYS = "tailtrain/launch"
#: seconds between two looks at the store while the host waits for the other nodes' ends
END_POLL = 0.2
#: seconds between two beats of a launcher (:meth:`Meeting.keep_beating`): short, because a
#: node started again looks :data:`ALIVE_LOOK` for its earlier launcher's beats before its ranks
#: ask to join
BEAT = 0.25
#: how long a second start of a node watches its earlier launcher's beats: a launcher that
#: beats is seen at once; one that stalled this long (3 beats missed) counts as gone
ALIVE_LOOK = 4 * BEAT


class StoreAt(StrEnum):
    """Where the job's store lives (module docstring)."""

    LAUNCHER = "launcher"
    APART = "apart"


class NodeState(StrEnum):
    """A node as the store's host sees it (:func:`await_job_end`), by its latest start."""

    #: its launcher beats (``beat/{I}``, every :data:`BEAT` seconds)
    RUNNING = "running"
    #: its launcher said it ended (``ended/{I}`` of its latest start)
    ENDED = "ended"
    #: no beat for ``--timeout`` seconds: its machine died, or it is stopped; a beat again
    #: (continued, or started again) makes it RUNNING
    LOST = "lost"


class GroupBy(StrEnum):
    """The unit that leaves the job when one of its ranks dies (module docstring)."""

    NODE = "node"
    RANK = "rank"


@dataclass(frozen=True)
class Nodes:
    """The job's nodes as one launcher sees them."""

    nnodes: int = 1
    node_rank: int = 0
    store_at: StoreAt = StoreAt.LAUNCHER
    group_by: GroupBy = GroupBy.RANK

    @property
    def hosts_store(self) -> bool:
        """Whether this launcher hosts the store (node 0's, unless it lives apart)."""
        return self.store_at is StoreAt.LAUNCHER and self.node_rank == 0

    def rank_of(self, local: int, nproc: int) -> int:
        """The job rank of local rank ``local`` (torchrun's numbering)."""
        return self.node_rank * nproc + local


def check_nodes(
    nnodes: int, node_rank: int, store_at: str, group_by: str | None, endpoint: Endpoint
) -> Nodes:
    """One-line refusals of the node options, before any process starts; ``group_by`` None
    takes the default (``node`` across nodes, ``rank`` on one)."""
    if nnodes < 1:
        raise UsageError(f"--nnodes must be >= 1, got {nnodes}")
    if not 0 <= node_rank < nnodes:
        raise UsageError(
            f"--node-rank must be in 0..{nnodes - 1} for --nnodes {nnodes}, got {node_rank}"
        )
    if store_at not in tuple(StoreAt):
        raise UsageError(f"--store must be one of {', '.join(StoreAt)}, got {store_at!r}")
    if group_by is not None and group_by not in tuple(GroupBy):
        raise UsageError(f"--group-by must be one of {', '.join(GroupBy)}, got {group_by!r}")
    at = StoreAt(store_at)
    if (nnodes > 1 or at is StoreAt.APART) and endpoint.port == 0:
        raise UsageError(
            f"--rdzv-endpoint {endpoint} needs a port every node can be told: port 0 picks a "
            "free one on this machine only"
        )
    if group_by == GroupBy.NODE and nnodes == 1:
        raise UsageError(
            "--group-by node with --nnodes 1: the node is the whole job, and a rank's death "
            "would end it; leave --group-by out (rank, on one node)"
        )
    default = GroupBy.NODE if nnodes > 1 else GroupBy.RANK
    by = GroupBy(group_by) if group_by is not None else default
    return Nodes(nnodes, node_rank, at, by)


def host_store(endpoint: Endpoint, timeout: datetime.timedelta) -> dist.TCPStore:
    """A ``TCPStore`` served on ``endpoint``'s address only (port 0: a free one); a one-line
    :class:`UsageError` where it cannot listen there."""
    family, kind, proto, address = address_of(endpoint)
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(1024)
    except OSError as exc:
        sock.close()
        raise UsageError(unusable(endpoint, exc)) from None
    port = sock.getsockname()[1]
    # by hand: the TCPStore's own server listens on every interface; handed a socket bound to
    # one address (master_listen_fd), it serves there only
    return dist.TCPStore(
        endpoint.host, port, None, is_master=True, timeout=timeout, wait_for_workers=False,
        master_listen_fd=sock.detach(),
    )  # fmt: skip


def client_store(endpoint: Endpoint, timeout: datetime.timedelta) -> dist.TCPStore:
    """A client of the job's store, waiting for it at most ``timeout``; one line if none."""
    try:
        return dist.TCPStore(endpoint.host, endpoint.port, is_master=False, timeout=timeout)
    except (RuntimeError, dist.DistStoreError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UsageError(
            f"no store answered at --rdzv-endpoint {endpoint} within --timeout "
            f"{timeout.total_seconds():g}s ({first[:160]}); start node 0 (or `tailtrain store`) "
            "first"
        ) from None


def open_run(store: dist.Store) -> str:
    """The host's part of the meeting: write a fresh run id, unless one is there already
    (the first writer's stands)."""
    fresh = f"tailtrain-launch-{uuid.uuid4().hex[:12]}"
    return store.compare_set(f"{LAUNCH_KEYS}/run", "", fresh).decode()


@dataclass
class Meeting:
    """One launcher's place in the job: the store, the run id, and its node's earlier starts
    (``restarts`` > 0: a node started again, whose ranks rejoin)."""

    store: dist.Store
    run_id: str
    restarts: int
    nodes: Nodes
    #: whether this start is counted in ``starts/{I}`` (a second start: once confirmed)
    counted: bool = False
    #: set when this launcher ends: its beats stop (:meth:`keep_beating`)
    quiet: threading.Event = field(default_factory=threading.Event, repr=False)

    def key(self, name: str) -> str:
        return f"{LAUNCH_KEYS}/{self.run_id}/{name}"

    def beat(self, store: dist.Store | None = None) -> None:
        """Say once that this node's launcher is alive: the store's host counts a node whose
        beats stop for --timeout as gone (a machine that died), and a second start of the node
        is refused while they go on (:func:`beats`)."""
        with contextlib.suppress(Exception):
            (store or self.store).add(self.key(f"beat/{self.nodes.node_rank}"), 1)

    def keep_beating(self, endpoint: Endpoint) -> None:
        """Beat every :data:`BEAT` seconds until :meth:`ended`, from a thread with its own
        connection to the store: a launcher busy starting or stopping its ranks (seconds with
        no look at the store) still says it is alive, and a store that stops answering holds
        that thread only (each beat waits at most :data:`ALIVE_LOOK`), never the watch."""
        span = datetime.timedelta(seconds=ALIVE_LOOK)

        def beating() -> None:
            try:
                own = dist.TCPStore(endpoint.host, endpoint.port, is_master=False, timeout=span)
            except (RuntimeError, dist.DistStoreError):  # the store is gone: nothing to say
                return
            while not self.quiet.is_set():
                self.beat(own)
                self.quiet.wait(BEAT)

        self.beat()  # at once: a second start looking now sees this one alive
        threading.Thread(target=beating, name="tailtrain-beat", daemon=True).start()

    def confirm(self) -> None:
        """A second start of the node (``restarts`` > 0) looks at the node's beats for up to
        :data:`ALIVE_LOOK` while its ranks import (they ask to join only once their launcher
        set its :meth:`clearance`), and counts itself only then: it is refused in one line,
        counting nothing, while the node's earlier launcher still beats (a --node-rank given
        twice), or when another start of the node took its number meanwhile (two started at
        once). A first start counted itself as it met, with nothing to look at."""
        if not self.restarts:
            return
        node = self.nodes.node_rank
        starts, why = self.key(f"starts/{node}"), None
        if beats(self.store, self.key(f"beat/{node}")):
            why = "is running (its launcher beats)"
        elif not self.counted:
            self.counted = True
            if self.store.add(starts, 1) - 1 != self.restarts:
                why = "was started again by another launcher at the same time"
        if why is not None:
            if self.counted:  # its number goes back to the start that keeps it
                with contextlib.suppress(Exception):
                    self.store.add(starts, -1)
            raise UsageError(
                f"node {node} of this job {why}: give each launcher its own --node-rank"
            )

    def clearance(self) -> str | None:
        """The key, in the shrink protocol's store, that a second start's ranks wait for
        before they ask to join (``runtime.elastic.store.CLEARED``); None for a first start."""
        return f"cleared/{self.nodes.node_rank}/{self.restarts}" if self.restarts else None

    def ended(self, finished: bool) -> None:
        """This launcher ends (its ranks ``finished``, or not): said for this start of the
        node only, so a node started again is not ended by its earlier start's word."""
        self.quiet.set()
        with contextlib.suppress(Exception):
            word = json.dumps([self.restarts + 1, finished])
            self.store.set(self.key(f"ended/{self.nodes.node_rank}"), word)

    def stop_others(self, line: str) -> None:
        """Under ``--on-rank-loss stop``: this node failed; every other node stops too."""
        with contextlib.suppress(Exception):
            self.store.set(self.key("stop"), line)

    def stop_asked(self) -> str | None:
        """Another node's failure line under ``stop``, or None."""
        if self.nodes.nnodes == 1 or not self.store.check([self.key("stop")]):
            return None
        return self.store.get(self.key("stop")).decode()

    def wait_for_others(self, timeout: float, asked: Callable[[], bool]) -> None:
        """The store's host outlives its own ranks until the job ended on every node
        (:func:`await_job_end`): a node still stepping needs the store. ``asked``: Ctrl-C."""
        if self.nodes.hosts_store and self.nodes.nnodes > 1:
            line = await_job_end(self.store, self.run_id, self.nodes.nnodes, timeout, asked)
            log.warning("node 0 ends the job's store: %s", line)


def await_job_end(
    store: dist.Store, run: str, nnodes: int, timeout: float, asked: Callable[[], bool]
) -> str:
    """Wait until every node ended (its latest start said so), or was lost (no beat for
    ``timeout`` seconds), or ``timeout`` seconds after a node's ranks finished; or Ctrl-C
    (``asked``). Returns the line that says which. Every path ends within ``timeout`` seconds
    of the last sign of life of any node."""
    key = f"{LAUNCH_KEYS}/{run}"
    seen: dict[int, tuple[int, float]] = {}
    finished_at: float | None = None
    while True:
        now, states = time.monotonic(), {}
        for node in range(nnodes):
            beat = store.add(f"{key}/beat/{node}", 0)
            if seen.get(node, (None,))[0] != beat:
                seen[node] = (beat, now)
            said = store.check([f"{key}/ended/{node}"])
            if said:
                start, finished = json.loads(store.get(f"{key}/ended/{node}"))
                said = int(start) == store.add(f"{key}/starts/{node}", 0)
                if said and finished and finished_at is None:
                    finished_at = now
            lost = now > seen[node][1] + timeout
            state = NodeState.ENDED if said else NodeState.LOST if lost else NodeState.RUNNING
            states[node] = state
        over = [node for node, state in states.items() if state is not NodeState.RUNNING]
        if len(over) == nnodes:
            return f"every node ended or was lost ({nnodes} nodes)"
        if finished_at is not None and now > finished_at + timeout:
            late = sorted(set(range(nnodes)) - set(over))
            return f"nodes {late} still ran --timeout {timeout:g}s after the job finished"
        if asked():
            return "interrupted"
        time.sleep(END_POLL)


def meet(nodes: Nodes, endpoint: Endpoint, timeout: datetime.timedelta, nproc: int = 1) -> Meeting:
    """Host the store or join it, agree on the run id and the job's shape (the first
    launcher's stands: one line for a launcher whose options differ), and learn this node's
    earlier starts (a first start counts itself here, a second one in
    :meth:`Meeting.confirm`)."""
    if nodes.hosts_store:
        store = host_store(endpoint, timeout)
        run = open_run(store)
        if nodes.nnodes > 1:
            log.warning(
                "node 0 hosts the job's store at %s: the job ends if node 0 is lost (start "
                "`tailtrain store` apart and pass --store apart to every node to survive it)",
                Endpoint(endpoint.host, store.port),
            )
    else:
        store = client_store(endpoint, timeout)
        try:
            run = store.get(f"{LAUNCH_KEYS}/run").decode()
        except (RuntimeError, dist.DistStoreError):
            raise UsageError(
                f"the store at {endpoint} holds no job within --timeout "
                f"{timeout.total_seconds():g}s: is it a tailtrain store?"
            ) from None
    meeting = Meeting(store, run, 0, nodes)
    shape = json.dumps([nodes.nnodes, nproc, str(nodes.group_by)])
    agreed = store.compare_set(meeting.key("shape"), "", shape).decode()
    if agreed != shape:
        n, p, by = json.loads(agreed)
        raise UsageError(
            f"this job runs --nnodes {n} --nproc-per-node {p} --group-by {by} (its first "
            f"launcher's); this launcher was given --nnodes {nodes.nnodes} --nproc-per-node "
            f"{nproc} --group-by {nodes.group_by}"
        )
    starts = meeting.key(f"starts/{nodes.node_rank}")
    meeting.restarts = store.add(starts, 0)  # a second start counts itself once confirmed
    if not meeting.restarts:
        meeting.restarts, meeting.counted = store.add(starts, 1) - 1, True
    return meeting


def beats(store: dist.Store, key: str) -> bool:
    """Whether the launcher that beats at ``key`` is alive: its count moves within
    :data:`ALIVE_LOOK` (looked at every :data:`BEAT` / 5 s, so a live one is seen at once)."""
    before, end = store.add(key, 0), time.monotonic() + ALIVE_LOOK
    while time.monotonic() < end:
        time.sleep(BEAT / 5)
        if store.add(key, 0) != before:
            return True
    return False


def node_env(nodes: Nodes, nproc: int, local: int) -> dict[str, str]:
    """torchrun's variables of local rank ``local`` that depend on the node."""
    return {
        "RANK": str(nodes.rank_of(local, nproc)),
        "LOCAL_RANK": str(local),
        "WORLD_SIZE": str(nodes.nnodes * nproc),
        "LOCAL_WORLD_SIZE": str(nproc),
        "GROUP_RANK": str(nodes.node_rank),
        "ROLE_RANK": str(nodes.rank_of(local, nproc)),
        "ROLE_WORLD_SIZE": str(nodes.nnodes * nproc),
        "GROUP_WORLD_SIZE": str(nodes.nnodes),
    }


def env_of_run(env: Mapping[str, str], meeting: Meeting, endpoint: Endpoint) -> dict[str, str]:
    """The run's variables every rank of every node shares."""
    return dict(
        env,
        MASTER_ADDR=endpoint.host,
        MASTER_PORT=str(endpoint.port),
        TORCHELASTIC_RUN_ID=meeting.run_id,
        TORCHELASTIC_RESTART_COUNT="0",
        TORCHELASTIC_USE_AGENT_STORE="True",
    )
