"""Shared helpers for the theory tests: Monte Carlo tolerances come from the samples."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

#: standard errors allowed between a formula and its Monte Carlo estimate
Z = 4.0


def mc_mean(draws: np.ndarray, axis: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Sample mean and its standard error along ``axis``."""
    draws = np.asarray(draws, dtype=float)
    count = draws.shape[axis]
    return draws.mean(axis=axis), draws.std(axis=axis, ddof=1) / np.sqrt(count)


def assert_within(value, mean, stderr, z: float = Z) -> None:
    """``value`` lies within ``z`` standard errors of the Monte Carlo ``mean``."""
    value, mean, stderr = np.broadcast_arrays(
        *(np.asarray(a, float) for a in (value, mean, stderr))
    )
    gap = np.abs(value - mean)
    bad = gap > z * stderr + 1e-12 * np.abs(mean)
    assert not bad.any(), f"formula {value[bad]} vs Monte Carlo {mean[bad]} ± {stderr[bad]} (z={z})"


@pytest.fixture
def mc() -> SimpleNamespace:
    """``mc.mean(draws)`` -> (mean, stderr); ``mc.within(value, mean, stderr)`` asserts."""
    return SimpleNamespace(mean=mc_mean, within=assert_within, z=Z)


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(20240601)
