"""``Shrinker.join`` in a rank of a node's second start (``store.CLEARED`` set by its
launcher): it asks to join only once its launcher's look found no earlier launcher of the node
beating, so the ranks of a ``--node-rank`` given twice never touch the job's keys; a clearance
that never comes fails the heal in one line within --timeout. One rank in a thread over an
in-process store."""

from __future__ import annotations

import threading
import time

import pytest
import torch
import torch.distributed as dist

from tailtrain.errors import TailtrainError
from tailtrain.runtime.elastic.deadline import Deadline
from tailtrain.runtime.elastic.shrink import Refused, Shrinker
from tailtrain.runtime.elastic.store import CLEARED

KEY = "cleared/1/1"


def joiner(store: dist.Store, timeout: float) -> Shrinker:
    s = Shrinker(2, store, Deadline(timeout), torch.device("cpu"), [0, 1], 4, rejoining=True)
    s.keeper = None
    return s


def joining(store: dist.Store, timeout: float) -> tuple[threading.Thread, list[BaseException]]:
    raised: list[BaseException] = []

    def run() -> None:
        try:
            joiner(store, timeout).join(step=7, rows=1)
        except BaseException as exc:  # what join ended with, for the test's thread
            raised.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, raised


@pytest.mark.timeout(60)
def test_a_rank_of_a_second_start_asks_to_join_only_once_its_launcher_cleared_it(monkeypatch):
    monkeypatch.setenv(CLEARED, KEY)
    store = dist.HashStore()
    thread, raised = joining(store, timeout=30.0)
    time.sleep(1.0)  # the launcher looks at the node's earlier beats meanwhile
    assert not store.check(["join/2"]) and not raised
    store.set(KEY, "1")
    end = time.monotonic() + 20
    while not store.check(["join/2"]) and time.monotonic() < end:
        time.sleep(0.01)
    assert store.check(["join/2"])  # asked once cleared
    store.set("finished", "1")  # the run ends before any grow: the request is withdrawn
    thread.join(timeout=20)
    assert len(raised) == 1 and isinstance(raised[0], Refused)


@pytest.mark.timeout(60)
def test_a_clearance_that_never_comes_fails_the_heal_in_one_line_and_touches_nothing(
    monkeypatch,
):
    monkeypatch.setenv(CLEARED, KEY)
    store = dist.HashStore()
    store.set("dead/2", "killed")  # the earlier start's death, which only an asking rank clears
    thread, raised = joining(store, timeout=1.0)
    thread.join(timeout=20)
    assert len(raised) == 1 and type(raised[0]) is TailtrainError
    line = str(raised[0])
    assert "\n" not in line
    assert line == (
        "rank 2 was started again and its launcher did not clear it to join within --timeout "
        "1s: the heal failed"
    )
    assert not store.check(["join/2"]) and store.check(["dead/2"])


@pytest.mark.timeout(60)
def test_a_rank_with_no_clearance_to_wait_for_asks_at_once(monkeypatch):
    monkeypatch.delenv(CLEARED, raising=False)
    store = dist.HashStore()
    store.set("finished", "1")
    thread, raised = joining(store, timeout=30.0)
    thread.join(timeout=20)
    assert len(raised) == 1 and isinstance(raised[0], Refused)
    assert store.check(["join/2"])  # asked, then withdrew
