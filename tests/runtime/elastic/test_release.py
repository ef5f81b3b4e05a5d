"""``group.release``: a left generation's own group is let go, so its destructor closes its
sockets and ends gloo's event loop (``abort`` and ``shutdown`` close nothing in torch 2.13,
and a live peer's bytes for a collective a rank left keep that loop spinning); it waits for the
collective that broke to end, so the destructor, which holds the GIL, never waits in it. Two
ranks of a gloo group as threads of this process over an in-process store."""

from __future__ import annotations

import contextlib
import datetime
import gc
import threading
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from tailtrain.runtime.elastic.group import release

SPAN = datetime.timedelta(seconds=20)


def loops() -> int:
    """gloo's event-loop threads in this process (one per group's device), once the groups
    an earlier test of this process left behind are collected."""
    gc.collect()
    count = 0
    for task in Path("/proc/self/task").iterdir():
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            count += (task / "comm").read_text().strip() == "gloo_tcp_loop"
    return count


def pair(works: list[dist.Work] | None = None) -> list[dist.ProcessGroup]:
    """Two ranks' groups, one allreduce done on them (its Works kept in ``works``)."""
    store, groups = dist.HashStore(), [None, None]

    def make(rank: int) -> None:
        group = dist.ProcessGroupGloo(dist.PrefixStore("gen1", store), rank, 2, SPAN)
        work = group.allreduce([torch.ones(3)])
        work.wait()
        groups[rank] = group
        if works is not None:
            works.append(work)

    threads = [threading.Thread(target=make, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert all(g is not None for g in groups)
    return groups


class Pending:
    """A collective still running until ``end`` is set."""

    def __init__(self) -> None:
        self.end = threading.Event()

    def is_completed(self) -> bool:
        return self.end.is_set()


@pytest.mark.timeout(60)
def test_a_released_group_closes_its_sockets_and_its_event_loop_ends():
    before = loops()
    groups = pair()
    assert loops() == before + 2
    threads = [release(groups.pop(), None, bound=5.0) for _ in range(2)]
    for t in threads:
        t.join(10)
    assert loops() == before


@pytest.mark.timeout(60)
def test_a_group_is_let_go_only_once_the_collective_that_broke_ended():
    before = loops()
    groups = pair()
    running = Pending()
    held = release(groups.pop(), running, bound=30.0)  # type: ignore[arg-type]
    released = release(groups.pop(), None, bound=30.0)
    released.join(10)
    time.sleep(0.5)
    assert held.is_alive() and loops() == before + 1  # still waiting for its collective
    running.end.set()
    held.join(10)
    assert not held.is_alive() and loops() == before


@pytest.mark.timeout(60)
def test_a_collective_that_never_ends_holds_the_group_no_longer_than_the_bound():
    before = loops()
    groups = pair()
    threads = [release(groups.pop(), Pending(), bound=0.5) for _ in range(2)]  # type: ignore[arg-type]
    for t in threads:
        t.join(10)
    assert loops() == before


@pytest.mark.timeout(60)
def test_the_work_a_release_waited_for_keeps_nothing_open_once_it_let_go():
    """A gloo Work holds its group's connections: the one passed to ``release`` is the thread's
    only, and goes with it."""
    before, works = loops(), []
    groups = pair(works)
    threads = [release(groups.pop(), works.pop(), bound=5.0) for _ in range(2)]
    for t in threads:
        t.join(10)
    assert loops() == before
