"""The ranks of a launch as their launcher sees them (``runtime.launching.scripts``): each
rank's state, how it is signalled and stopped (every wait bounded by :data:`STOP_GRACE`), how
the job is judged from their ends under shrink, and the bookkeeping of the ranks that die and
come back (``--restart-lost``, a node leaving whole, a restart taken in by the live ranks)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

import torch.distributed as dist

log = logging.getLogger("tailtrain.runtime.launching.scripts")  # the launcher's one logger

#: seconds a stopped rank has to leave before it is killed
STOP_GRACE = 10.0


class RankState(StrEnum):
    """One rank as the launcher sees it."""

    RUNNING = "running"
    #: exited with status 0
    FINISHED = "finished"
    #: exited non-zero or by a signal
    DIED = "died"
    #: exited after the survivors told it to leave (``left/{rank}``)
    LEFT = "left"
    #: stopped by the launcher (another rank failed under ``stop``, or Ctrl-C)
    STOPPED = "stopped"


@dataclass
class Rank:
    rank: int
    process: subprocess.Popen
    #: its place on this node (``LOCAL_RANK``)
    local: int = 0
    #: started as a restart by a node's launcher started again (not ``--restart-lost``'s)
    rejoins: bool = False
    state: RankState = RankState.RUNNING
    why: str = ""
    #: when the launcher saw it die (monotonic seconds): the first to fail is named
    died: float = float("inf")
    #: how many times it was started again (``--restart-lost``)
    restarts: int = 0
    #: this start was taken in by the live ranks (their ``healed/{rank}``): said once
    healed: bool = False

    @property
    def heals(self) -> bool:
        """Whether this start of the rank must be taken in by the live ranks (a restart)."""
        return bool(self.restarts or self.rejoins)


def taken_in(r: Rank, notes: dist.Store) -> bool:
    """Whether this start of ``r`` (a restart) was taken in by the live ranks: their
    ``healed/{rank}``, written once the generation that took it in held (``Shrinker.regroup``);
    said in one line the first time it is seen."""
    if r.healed or not r.heals:
        return r.healed
    with contextlib.suppress(Exception):  # the store gone: judged by the rank's own end
        if notes.check([f"healed/{r.rank}"]):
            generation, step = json.loads(notes.get(f"healed/{r.rank}"))
            r.healed = True
            log.warning(
                "rank %d rejoined the live ranks at step %d (generation %d)", r.rank, step,
                generation,
            )  # fmt: skip
    return r.healed


@dataclass
class Restarts:
    """``--restart-lost``'s bookkeeping: a rank that died is started again by ``start(rank,
    k)`` (k: its k-th restart) while it has restarts left, at most ``limit`` per rank."""

    limit: int
    start: Callable[[int, int], subprocess.Popen]

    def restart(self, r: Rank) -> bool:
        """Start ``r`` again when it may be (logged); whether it was."""
        if r.restarts >= self.limit:
            return False
        r.restarts += 1
        r.process = self.start(r.local, r.restarts)
        # said once it holds: started now; that it rejoined, once taken in (``taken_in``)
        log.warning("rank %d died (%s); started again (%d of %d)", r.rank, r.why, r.restarts,
                    self.limit)  # fmt: skip
        r.state, r.why, r.died, r.healed = RankState.RUNNING, "", float("inf"), False
        return True

    def restart_node(self, ranks: list[Rank], first: Rank) -> bool:
        """Start every rank of the node again, after ``first`` died (logged once), when each
        has restarts left; whether they were."""
        if any(r.restarts >= self.limit for r in ranks):
            return False
        why = first.why
        for r in ranks:
            r.restarts += 1
            r.process = self.start(r.local, r.restarts)
            r.state, r.why, r.died, r.healed = RankState.RUNNING, "", float("inf"), False
        log.warning(
            "rank %d died (%s); its node's ranks %s were started again (%d of %d)",
            first.rank, why, [r.rank for r in ranks], first.restarts, self.limit,
        )  # fmt: skip
        return True


def node_leaves(ranks: list[Rank], first: Rank, notes: dist.Store) -> str:
    """The node of ``ranks`` leaves whole after ``first`` died: its other running ranks are
    killed (they would only wait in a collective with the dead one), and every one of them is
    noted dead in the store at once; returns the words that say which were stopped."""
    mates = [r for r in ranks if r is not first and r.state is RankState.RUNNING]
    for r in mates:
        signal_rank(r.process, signal.SIGKILL)
    for r in mates:
        with contextlib.suppress(subprocess.TimeoutExpired):  # bounded: see stop()
            r.process.wait(STOP_GRACE)
        r.state, r.died = RankState.DIED, time.monotonic()
        r.why = f"its node left with rank {first.rank}"
    for r in (first, *mates):  # the census need not wait its window for any of them
        notes.set(f"dead/{r.rank}", r.why)
    return f"; ranks {[r.rank for r in mates]} of its node were stopped" if mates else ""


def judged(ranks: list[Rank]) -> str | None:
    """Under shrink: the job failed when no rank finished (one line), else None."""
    if any(r.state is RankState.FINISHED for r in ranks):
        return None
    died = [r for r in ranks if r.state is RankState.DIED]
    left = [r for r in ranks if r.state is RankState.LEFT]
    if not died and left:  # refused by the live ranks (it came after their census), or more
        return f"no rank finished: ranks {[r.rank for r in left]} left the job ({left[0].why})"
    if not died:  # every rank was stopped
        return f"no rank finished: {', '.join(f'rank {r.rank} {r.state}' for r in ranks)}"
    first = min(died, key=lambda r: r.died)  # in the order they died, not by rank
    return f"no rank finished: rank {first.rank} failed first ({first.why})"


def stop(ranks: list[Rank], sig: int) -> None:
    """Send ``sig`` to every running rank and what it started, wait up to :data:`STOP_GRACE`
    seconds, kill the rest."""
    running = [r for r in ranks if r.process.poll() is None]
    for r in running:
        signal_rank(r.process, sig)
    end = time.monotonic() + STOP_GRACE
    for r in running:
        try:
            r.process.wait(max(0.0, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            signal_rank(r.process, signal.SIGKILL)
            # SIGKILL ends a process unless it sleeps in the kernel (a stuck disk or NFS
            # read): bounded too, so the launcher never hangs on a rank it cannot end
            with contextlib.suppress(subprocess.TimeoutExpired):
                r.process.wait(STOP_GRACE)
        if r.state is RankState.RUNNING:
            r.state = RankState.STOPPED


def signal_rank(process: subprocess.Popen, sig: int) -> None:
    """``sig`` to the rank's own process group (it leads one), so that what the rank started
    (a data loader's workers, a tool it runs) goes with it, as a terminal's Ctrl-C would take
    them all; to the rank alone where it is no group's leader."""
    try:
        os.killpg(process.pid, sig)
    except (ProcessLookupError, PermissionError):
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(sig)
