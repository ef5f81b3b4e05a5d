"""Ctrl-C in a rank (``runtime.interrupt``): a request taken at a step boundary, however many
signals arrive and however close together."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tailtrain.runtime import interrupt

ROOT = Path(__file__).resolve().parents[2]
#: a rank's main thread polling the request while signals land in it
POLLING = """
import sys, time
from tailtrain.runtime.interrupt import interrupt_on_signals, interrupt_requested
interrupt_on_signals(torchrun=False)
print("ready", flush=True)
deadline = time.monotonic() + {seconds}
while time.monotonic() < deadline:
    interrupt_requested()
print(interrupt_requested(), flush=True)
"""


def test_a_request_is_a_flag_the_step_boundary_reads(monkeypatch):
    monkeypatch.setattr(signal, "signal", lambda sig, handler: None)  # this process keeps its own
    # and its module state, which later tests read (stop_on_sigterm: the signals taken)
    monkeypatch.setattr(interrupt, "_interrupting", interrupt._interrupting)
    monkeypatch.setattr(interrupt, "_asked", interrupt._asked)
    interrupt.interrupt_on_signals(torchrun=True)
    assert not interrupt.interrupt_requested()
    interrupt.check_interrupt(3)  # nothing asked: nothing raised
    interrupt._ask(signal.SIGINT, None)
    interrupt._ask(signal.SIGINT, None)  # again, as a second handler nested in the first
    assert interrupt.interrupt_requested()
    with pytest.raises(interrupt.Interrupt, match="interrupted at step 3"):
        interrupt.check_interrupt(3)
    interrupt.interrupt_on_signals(torchrun=True)  # a new run starts unasked
    assert not interrupt.interrupt_requested()


@pytest.mark.timeout(120)
def test_a_burst_of_sigints_never_hangs_the_rank():
    """A terminal's Ctrl-C and the launcher's forwarded copy reach a rank microseconds apart.
    A handler that took a lock (``threading.Event.set``) hung when the second landed inside
    the first: 4 of 10 such bursts did on this machine. Here every burst's rank ends."""
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), OMP_NUM_THREADS="1")
    for _ in range(6):
        code = POLLING.format(seconds=1.5)
        rank = subprocess.Popen(
            [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env
        )
        assert rank.stdout is not None and rank.stdout.readline().strip() == "ready"
        until = time.monotonic() + 1.0
        while time.monotonic() < until and rank.poll() is None:
            os.kill(rank.pid, signal.SIGINT)
        try:
            out, _ = rank.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            rank.kill()
            rank.communicate()
            pytest.fail("a rank hung in its SIGINT handler")
        assert rank.returncode == 0 and out.strip() == "True"
