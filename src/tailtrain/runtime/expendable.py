"""Local ranks whose death the job survives: the workers of a parameter server.

torch's elastic agent (``max_restarts=0``) stops the whole job when any rank exits non-zero,
and ``torch.multiprocessing`` terminates the other ranks as soon as one fails. A parameter
server goes on without a dead worker (``runtime.ps.liveness``), so in a local launch each of
its worker ranks runs in a child of the process the launcher started: that process forks the
child, waits for it and hands back its results; if the child died (a SIGKILL included, which
no process can catch) or raised, it logs one line naming the rank and why, and returns
placeholder results with status 0, so the agent sees a rank that finished. The server (rank 0)
is not shielded: its failure stops the job as before.

The child dies with its parent (``PR_SET_PDEATHSIG`` on Linux, and a SIGTERM handler), so the
launcher stopping the job stops it too. Under torchrun nothing is shielded: torchrun's agent
stops the job when any rank dies (its policy), so there a dead worker ends the job.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import pickle
import signal
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from tailtrain.core.records import RunRecord
from tailtrain.errors import TailtrainError

if TYPE_CHECKING:  # at run time imported where a placeholder is made: ``runtime.config``
    # loads the scenario and its delay laws (scipy), a second of every launcher's start
    from tailtrain.runtime.config import RankResult

log = logging.getLogger(__name__)


class LeftAlive(TailtrainError):
    """A shielded rank that ends on purpose, alive, because the others went on without it
    (the allreduce's shrink refused a hung rank that woke too late): the shield says what
    happened, tells nobody it died, and its placeholder summary says ``left``."""


#: prctl(2) option: the signal a process gets when its parent dies
PR_SET_PDEATHSIG = 1


def shielded(
    body: Callable[[], list[RankResult]],
    rank: int,
    count: int,
    on_death: Callable[[int, str], None] | None = None,
    again: Callable[[], list[RankResult]] | None = None,
    restarts: int = 0,
) -> list[RankResult]:
    """``body()`` (rank ``rank``'s ``count`` results) in a child process; its death is
    logged and answered with placeholders whose summary says ``dead``, not raised (a rank
    that ends with :class:`LeftAlive` is logged as leaving, and its summary says ``left``).
    ``on_death(rank, why)`` tells others at once (the allreduce's shrink census). With
    ``again``, a child that died (killed: it handed back nothing) is replaced by a new child
    running ``again()`` (a rank that rejoins the live ones), up to ``restarts`` times."""
    from tailtrain.runtime.config import RankResult

    attempt = 0
    while True:
        outcome, status = in_child(body if attempt == 0 else again)
        if os.waitstatus_to_exitcode(status) == 0 and outcome is not None and outcome[0] == "ok":
            return outcome[1]
        if outcome is not None and outcome[0] == "left":  # alive, not dead: no death to tell
            log.warning("rank %d left the job: %s", rank, outcome[1])
            left = RunRecord(summary={"left": outcome[1]})
            return [RankResult(rank, left, np.zeros(0)) for _ in range(count)]
        why = outcome[1] if outcome is not None else exit_reason(status)
        if on_death is not None:
            on_death(rank, why)
        if again is None or outcome is not None or attempt >= restarts:
            break
        attempt += 1
        log.warning("rank %d died (%s); started again (%d of %d)", rank, why, attempt, restarts)
    log.warning("rank %d died (%s); the job goes on without it", rank, why)
    dead = RunRecord(summary={"dead": why})
    return [RankResult(rank, dead, np.zeros(0)) for _ in range(count)]


def in_child(body: Callable[[], list[RankResult]]) -> tuple[Any, int]:
    """Run ``body`` in a child process (module docstring); its outcome and wait status."""
    read, write = os.pipe()
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:  # the child: the rank itself
        os.close(read)
        die_with(parent)
        run_child(body, write)
    os.close(write)
    previous = signal.signal(signal.SIGTERM, lambda *_: stop_child(pid))
    try:
        with os.fdopen(read, "rb") as pipe:
            data = pipe.read()  # until the child exits: its results, pickled by ourselves
        _, status = os.waitpid(pid, 0)
    finally:
        signal.signal(signal.SIGTERM, previous)
    return (pickle.loads(data) if data else None), status


def run_child(body: Callable[[], Any], fd: int) -> None:
    """Run the rank, write ("ok", results) or ("failed", why) to ``fd``, and exit."""
    code = 1
    try:
        outcome: tuple[str, Any] = ("ok", body())
        code = 0
    except BaseException as exc:  # handed to the parent, which reports it
        text = str(exc).strip().splitlines()
        kind = "left" if isinstance(exc, LeftAlive) else "failed"
        outcome = (kind, f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__)
    try:
        with os.fdopen(fd, "wb") as pipe:
            pickle.dump(outcome, pipe)
    finally:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        os._exit(code)


def die_with(parent: int) -> None:
    """Be killed when ``parent`` dies (Linux); elsewhere the parent's SIGTERM handler is all."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


def stop_child(pid: int) -> None:
    """SIGTERM from the launcher: kill the rank, then take the default action ourselves."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


def exit_reason(status: int) -> str:
    code = os.waitstatus_to_exitcode(status)
    if code < 0:
        return f"killed by {signal.Signals(-code).name}"
    return f"exit status {code}"
