"""Generated traces: one worker always 3x slower under heavy-tailed noise, or none."""

from __future__ import annotations

import numpy as np
import pytest


def write_trace(path, times):
    """CSV rows iteration,worker,seconds from ``times[i, w]``."""
    iterations, workers = times.shape
    i, w = np.meshgrid(np.arange(iterations), np.arange(workers), indexing="ij")
    table = np.column_stack([i.ravel(), w.ravel(), times.ravel()])
    np.savetxt(
        path,
        table,
        fmt=["%d", "%d", "%.9f"],
        delimiter=",",
        header="iteration,worker,seconds",
        comments="",
    )
    return path


def noisy(kind, shape, seed):
    rng = np.random.default_rng(seed)
    if kind == "lognormal":
        return rng.lognormal(0.0, 0.5, shape)
    return 0.5 * (1 + rng.pareto(2.5, shape))  # Pareto shape 2.5, scale 0.5


@pytest.fixture
def helpers():
    """``write_trace`` and ``noisy`` for tests that build their own traces."""
    return write_trace, noisy


@pytest.fixture(params=["lognormal", "pareto"])
def slow_trace(request, tmp_path):
    """16 workers, 100 iterations; worker 3 always 3x slower."""
    times = noisy(request.param, (100, 16), seed=1)
    times[:, 3] *= 3
    return write_trace(tmp_path / "slow.csv", times), times


@pytest.fixture
def clean_trace(tmp_path):
    return write_trace(tmp_path / "clean.csv", noisy("lognormal", (100, 16), seed=2))
