"""Shared test settings."""

from __future__ import annotations

import signal

import pytest
import torch


@pytest.fixture(autouse=True, scope="session")
def one_torch_thread():
    """Tiny tensors: a thread pool costs more than it gives on a 2-core CI machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def sigterm():
    """Restore this process's SIGTERM handler after a test that installs its own (a rank run
    in the test's process does: ``runtime.interrupt``)."""
    before = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, before)


#: the end-to-end drills that start launchers, a store and 4-6 ranks each: under xdist's
#: ``--dist loadgroup`` (CI's) they run one at a time on one worker, beside the other workers'
#: lighter tests, so two of them never share the 2 cores (with three workers, two drills at
#: once slowed a forked 3-rank fixture past its 120 s bound)
DRILLS = (
    "tests/runtime/launching/test_nodes.py",
    "tests/integrate/test_shrink_ddp.py",
    "tests/integrate/test_shrink_step.py",
    "tests/runtime/allreduce/test_shrink_demand.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("slow") and item.nodeid.startswith(DRILLS):
            item.add_marker(pytest.mark.xdist_group("drills"))
