"""Injected delays and faults: the simulator's seeded delay process, slept for real.

Every rank builds the simulator's own sampler, ``DelayProcess(delay, pattern, seed, N, M)``
read round by round through ``delays.schedule.RoundClock`` (one delay-process iteration
per local step, the first M columns of each), and keeps column ``rank``. So worker w's j-th
unit sleeps exactly the seconds the simulator charges it, on top of its real compute, and a
measured unit time is compute + injected. ``--comm-time`` draws come from the clock's own
stream and are slept after the allreduce. Without ``--delay`` nothing is injected.

Time-scheduled patterns (``slowdown``) are evaluated at the round's start on the run's agreed
wall clock, and at each unit's start with the injected seconds before it, as the simulator
does with virtual time.

Fault drills (``--inject-fault``, :class:`FaultDrill`) that kill, freeze or raise fire once
per run: the run folder's drill ledger (:data:`DRILLS`, :func:`note_drill`,
:func:`fired_drills`) notes each before it fires, and a rank resumed or restarted in that
folder skips those noted.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import time
from pathlib import Path

import numpy as np
import torch

from tailtrain.core.scenario import World
from tailtrain.delays.comm import parse_comm_time
from tailtrain.delays.schedule import RoundClock
from tailtrain.faults import FaultPlan

log = logging.getLogger(__name__)

#: the run folder's ledger of fired drills, one JSON line each (module docstring)
DRILLS = "drills.jsonl"


class InjectedFault(RuntimeError):
    """Raised on purpose by fault injection (``--inject-fault raise:rank=R,step=S``)."""


class Injector:
    """This rank's injected unit seconds and the shared communication draws."""

    def __init__(self, world: World, rank: int, delays: bool) -> None:
        """``world.process`` is the simulator's seeded delay process of the same flags."""
        self.rank = rank
        self.delays = delays
        comm = parse_comm_time(world.scenario.comm_time)
        self.clock = RoundClock(world.process, comm, world.seed)
        #: whether tau may cut an injected unit in flight (``DelayModel.cuttable``)
        self.cuttable = self.clock.cuttable

    def unit_times(self, local_steps: int, micro_batches: int, start: float) -> np.ndarray:
        """Injected seconds (H*M,) of this rank's units in the round starting at ``start``."""
        if not self.delays:
            return np.zeros(local_steps * micro_batches)
        return self.clock.take(local_steps, micro_batches, start)[self.rank]

    def comm_time(self) -> float:
        """Injected communication seconds of this round (the same draw on every rank)."""
        return self.clock.next_comm()


def sleep(seconds: float) -> None:
    if seconds > 0:
        time.sleep(seconds)


# ---- the drill ledger: a drill fires once per run ----------------------------------------------
def fired_drills(folder: Path | None) -> set[str]:
    """The drills (``Fault.describe()``) noted in ``folder`` as fired."""
    if folder is None:
        return set()
    try:
        lines = (Path(folder) / DRILLS).read_text().splitlines()
    except FileNotFoundError:
        return set()
    fired = set()
    for line in lines:
        try:
            fired.add(str(json.loads(line)["fault"]))
        except (ValueError, KeyError, TypeError):  # a row torn by the kill it announced
            continue
    return fired


def note_drill(folder: Path, fault: str, step: int) -> None:
    """Note on disk (flushed, fsync'ed) that ``fault`` fires now, before it fires."""
    with (Path(folder) / DRILLS).open("a") as fh:
        fh.write(json.dumps({"fault": fault, "step": step, "at": time.time()}) + "\n")
        fh.flush()
        os.fsync(fh.fileno())


class FaultDrill:
    """Worker ``worker``'s part of the ``--inject-fault`` drills (``tailtrain.faults``), on
    rank ``rank`` (default: the worker's; a parameter server's rank 0 is no worker, None).

    A rank's drill rides on its collectives (``runtime.reduce.Collectives.drill``, armed by
    the launcher), and the one driver of every topology's rank calls :meth:`before` as the
    rank starts work for an update (an allreduce or partial-collective round, a
    parameter-server job, the server's step: ``runtime.rank.drive_rank``), so a drill is met
    by every topology alike: a kill, a freeze or a raise. With a run ``folder`` a kill,
    freeze or raise fires once per run: it is noted there before it fires
    (:func:`note_drill`), and a rank resumed or restarted in that folder skips the
    drills noted. Numeric drills fire again when their update is played again, as the
    uninterrupted run played it."""

    def __init__(
        self,
        plan: FaultPlan,
        worker: int | None,
        folder: Path | None = None,
        rank: int | None = None,
    ) -> None:
        self.plan, self.worker, self.folder = plan, worker, folder
        self.rank = worker if rank is None else rank
        self.fired = fired_drills(folder)
        self.reached = -1  # the latest update this worker started work for

    def before(self, step: int) -> None:
        """At the start of this worker's work for update ``step``: die, raise or hang if told
        to.

        A worker that skips updates (a late eager rank adopts a newer result, a K-async
        worker gets a newer version) meets the drills of the updates it skipped here, at the
        first update it starts after them. A kill is SIGKILL to this process, so nothing is
        cleaned up, as when a node dies; a freeze sleeps the process's main thread, as when it
        hangs."""
        if not self.plan.faults:  # the usual run: no drill, nothing to look up each round
            self.reached = max(self.reached, step)
            return
        due = self.plan.process_faults(self.worker, self.reached + 1, step, self.rank)
        self.reached = max(self.reached, step)
        for fault in due:
            if fault.kind == "raise" and f"fail-at:{fault.rank}:{fault.step}" in self.fired:
                continue  # fired in this run as --fail-at, before it was a drill
            if not self.once(fault.describe(), step):
                continue
            if fault.kind == "raise":  # the job's failure line says it
                raise InjectedFault(
                    f"rank {self.rank} fails at step {step} (--inject-fault {fault.describe()})"
                )
            log.warning("fault drill %s", fault.describe())
            if fault.kind == "kill":
                for stream in (sys.stdout, sys.stderr):
                    stream.flush()
                os.kill(os.getpid(), signal.SIGKILL)
            sleep(fault.seconds)

    def once(self, drill: str, step: int) -> bool:
        """Whether ``drill`` fires now: not if it fired before in this run; noted if it does."""
        if drill in self.fired:
            return False
        self.fired.add(drill)
        if self.folder is not None:
            note_drill(self.folder, drill, step)
        return True

    def poison(self, step: int, grad: torch.Tensor) -> None:
        """Fill ``grad`` in place with a numeric drill's value for update ``step``, if any."""
        value = self.plan.value(self.worker, step) if self.plan.faults else None
        if value is not None:
            log.warning("fault drill: gradient of update %d set to %s", step, value)
            grad.fill_(value)
