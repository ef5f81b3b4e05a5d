"""Statistical yardsticks shared by the delay tests; every tolerance comes from the sample."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

#: probability that a correct model fails one statistical check
ALPHA = 1e-6
#: standard errors allowed for a sample mean or variance (two-sided p ≈ 6e-5)
Z = 4.0


def mean_tolerance(samples: np.ndarray) -> float:
    """Z standard errors of the sample mean, from the sample's own spread."""
    return Z * float(np.std(samples)) / math.sqrt(samples.size) + 1e-12


def var_tolerance(samples: np.ndarray) -> float:
    """Z standard errors of the sample variance: sqrt((m4 − m2²)/n) from central moments."""
    centred = samples - samples.mean()
    m2, m4 = np.mean(centred**2), np.mean(centred**4)
    return Z * math.sqrt(max(m4 - m2**2, 0.0) / samples.size) + 1e-12


def dkw_epsilon(n: int) -> float:
    """Dvoretzky–Kiefer–Wolfowitz: P(sup|F_n − F| > ε) ≤ 2·exp(−2nε²) = ALPHA."""
    return math.sqrt(math.log(2 / ALPHA) / (2 * n))


def ecdf_distance(model, samples: np.ndarray) -> float:
    """sup over sample points and model quantiles of |ECDF − cdf| (both one-sided limits)."""
    ordered = np.sort(samples)
    points = np.unique(np.concatenate([ordered, model.quantile(np.linspace(0.001, 0.999, 999))]))
    points = points[np.isfinite(points)]
    upper = np.searchsorted(ordered, points, side="right") / ordered.size
    lower = np.searchsorted(ordered, points, side="left") / ordered.size
    right_limit = model.cdf(points)
    left_limit = model.cdf(np.nextafter(points, -np.inf))
    return float(max(np.abs(upper - right_limit).max(), np.abs(lower - left_limit).max()))


@pytest.fixture(scope="session")
def stat() -> SimpleNamespace:
    return SimpleNamespace(
        mean_tolerance=mean_tolerance,
        var_tolerance=var_tolerance,
        dkw_epsilon=dkw_epsilon,
        ecdf_distance=ecdf_distance,
    )
