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
