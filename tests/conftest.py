"""Shared test settings."""

from __future__ import annotations

import signal
import subprocess
import zlib
from pathlib import Path

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


# ---- the slow suite, run in part --------------------------------------------------------------
#: the parts the slow suite is split into when the whole suite runs: CI runs one per commit
SLOW_PARTS = 2


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--slow",
        default=None,
        metavar="all|none|K/N",
        help="which tests marked slow run with the whole suite: 'all', 'none', or part K of N "
        f"(each test's part: crc32 of its id mod N); default: part (commit mod {SLOW_PARTS}) "
        f"of {SLOW_PARTS}, so commits of each part between them run every slow test; all of "
        "them outside a git checkout. Tests named on the command line, or chosen with -m, "
        "always run.",
    )


def slow_part(config: pytest.Config) -> tuple[int, int] | None:
    """The part (K, N) of the slow suite to run, or None for all of it."""
    chosen = config.getoption("--slow")
    if chosen is None:
        if config.option.markexpr or any(
            Path(arg.split("::")[0]).resolve() != config.rootpath / "tests" for arg in config.args
        ):
            return None  # the user picked the tests: run what they picked
        try:
            head = subprocess.run(
                ["git", "rev-parse", "HEAD"], cwd=config.rootpath, capture_output=True,
                text=True, timeout=10, check=True,
            ).stdout.strip()  # fmt: skip
        except (OSError, subprocess.SubprocessError):
            return None
        return int(head, 16) % SLOW_PARTS, SLOW_PARTS
    if chosen == "all":
        return None
    if chosen == "none":
        return -1, 1
    k, _, n = chosen.partition("/")
    if not (k.isdigit() and n.isdigit() and 0 <= int(k) < int(n)):
        raise pytest.UsageError(f"--slow takes all, none or K/N with 0 <= K < N, got {chosen!r}")
    return int(k), int(n)


def in_part(nodeid: str, part: tuple[int, int]) -> bool:
    # crc32, not hash(): the same on every xdist worker and every run
    return zlib.crc32(nodeid.encode()) % part[1] == part[0]


def pytest_report_header(config: pytest.Config) -> str:
    part = slow_part(config)
    if part is None:
        return "slow suite: all of it"
    if part[0] < 0:
        return "slow suite: none of it (--slow none)"
    return (
        f"slow suite: part {part[0]} of {part[1]} (by the commit; --slow all runs every slow "
        "test, -m slow only those)"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect the slow tests outside this run's part (docs/development.md, "The slow
    suite")."""
    part = slow_part(config)
    if part is None:
        return
    keep, drop = [], []
    for item in items:
        slow = item.get_closest_marker("slow") is not None
        (drop if slow and not in_part(item.nodeid, part) else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
