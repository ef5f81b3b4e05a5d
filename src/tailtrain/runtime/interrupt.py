"""Ctrl-C and SIGTERM in a `tailtrain train` rank: stop at a step boundary, or leave now.

Split from ``runtime.keep`` so that the signals, which every topology's round loop and the
launcher read, depend on nothing of the run folder; what a stopped or interrupted run keeps is
``runtime.keep``'s.

**Stopping.** The launcher stops a failed group with SIGTERM; :func:`stop_on_sigterm` turns it
into :class:`Stopped`, raised in the main thread, so a rank takes its census and saves before it
exits (the agent waits 30 s for that before SIGKILL). A rank blocked inside a collective sees it
when the collective returns, which is at once when a peer died, since its sockets close. Once
a rank handles a failure it ignores SIGTERM (:func:`hold_sigterm`): the first survivor to end
its census makes the agent stop the rest, and the writer may still be in its own census or
writing the checkpoint.

**Ctrl-C.** SIGINT reaches every rank: the launcher's elastic agent forwards the one it gets,
a terminal sends it to the whole process group, and torchrun forwards SIGINT and SIGTERM
(under torchrun both mean Ctrl-C here: :func:`interrupt_on_signals`). In a rank it raises
nothing: it asks for a stop (:func:`interrupt_requested`), which each topology takes at a
step boundary, all ranks at the same step (the allreduce carries the request in its round's
allreduce, a parameter server's rank 0 decides and stops its workers, a partial collective's
ranks leave through the failure census of ``runtime.keep``, which writes the checkpoint).
Then the lead rank keeps the run (``runtime.keep.keep_interrupted``) and the launcher raises
:class:`Interrupted` with its one line: exit status 130, as ``simulate``'s.
"""

from __future__ import annotations

import signal
import threading
from typing import Any

from tailtrain.errors import TailtrainError


class Stopped(BaseException):
    """The launcher stopped this rank (SIGTERM): the group is being stopped or restarted."""


class Interrupted(TailtrainError):
    """Ctrl-C ended the run; the message is its one line (empty on ranks that print none)."""

    exit_code = 130


class Interrupt(KeyboardInterrupt):
    """A rank leaves its loop at a step boundary because Ctrl-C asked it to (module docstring)."""


#: whether Ctrl-C asked this process to stop. A plain flag, not a ``threading.Event``: a
#: handler runs between two bytecodes of the main thread, so a second SIGINT landing inside
#: the first one's ``Event.set()`` waited forever on the lock that ``set()`` holds (a
#: terminal's Ctrl-C and the elastic agent's forwarded copy reach a rank microseconds apart;
#: CI saw both ranks of a job hang there until the agent killed them)
_asked = False
#: the signals that ask for a stop in this process (:func:`interrupt_on_signals`)
_interrupting: tuple[signal.Signals, ...] = ()


def _ask(signum: int, frame: Any) -> None:
    global _asked
    _asked = True  # one store: safe however many signals nest here


def interrupt_on_signals(torchrun: bool) -> None:
    """From now on SIGINT (under torchrun also SIGTERM, which torchrun forwards) asks this rank
    to stop at the next step boundary instead of raising wherever it lands (main thread)."""
    global _interrupting, _asked
    _asked = False
    _interrupting = (signal.SIGINT, signal.SIGTERM) if torchrun else (signal.SIGINT,)
    for sig in _interrupting:
        signal.signal(sig, _ask)


def interrupt_requested() -> bool:
    """Whether Ctrl-C asked this rank to stop (:func:`interrupt_on_signals`)."""
    return _asked


def interrupted_by_user() -> bool:
    """Whether a stop was asked for by SIGINT alone, so surely the user's Ctrl-C; under
    torchrun SIGTERM asks too, and is also how torchrun stops the survivors of a failure."""
    return _asked and signal.SIGTERM not in _interrupting


def check_interrupt(step: int) -> None:
    """Raise :class:`Interrupt` at the boundary of ``step`` when a stop was asked for."""
    if _asked:
        raise Interrupt(f"interrupted at step {step}")


def stop_on_sigterm() -> None:
    """SIGTERM raises :class:`Stopped` in the main thread (module docstring); under torchrun
    it stays a Ctrl-C (:func:`interrupt_on_signals`)."""
    if signal.SIGTERM in _interrupting:
        return

    def stopped(signum: int, frame: Any) -> None:
        raise Stopped("stopped by the launcher (SIGTERM)")

    signal.signal(signal.SIGTERM, stopped)


def hold_sigterm() -> None:
    """Ignore SIGTERM from now on (main thread only): this rank is handling a failure and
    must end its census, checkpoint and note before it leaves (module docstring)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
