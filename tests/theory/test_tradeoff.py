"""Lemma 7 and Theorem 3 against SGD simulated on a strongly convex quadratic.

F(w) = c w^2 / 2 (so L = c, F* = 0); each of the K gradients of an update is c w + xi with
Var(xi) = sigma^2 / m, the noise of an m-sample mini-batch (M_G = 0).
"""

from __future__ import annotations

import numpy as np
import pytest

from tailtrain.errors import UsageError
from tailtrain.theory import tradeoff

C, SIGMA2, BATCH, W0 = 1.0, 4.0, 8, 3.0
CHECKPOINTS = np.array([0, 5, 20, 60, 200, 400])


def model(lr: float = 0.05) -> tradeoff.ErrorModel:
    return tradeoff.ErrorModel(lr, C, C, SIGMA2, BATCH, initial_gap=C * W0**2 / 2)


def simulate(k, lr, rng, fresh=1.0, runs=4000, steps=400):
    """K-(async) SGD; each gradient is computed at w_j with probability ``fresh``, else at
    w_{j-1}. Returns F(w_j) at the checkpoints and the staleness ratio gamma of each step."""
    w_prev = w = np.full(runs, W0)
    errors, gammas = [C * w**2 / 2], []
    for j in range(1, steps + 1):
        stale = rng.random((runs, k)) >= fresh
        at = np.where(stale, w_prev[:, None], w[:, None])
        noise = rng.normal(0.0, np.sqrt(SIGMA2 / BATCH), (runs, k))
        gradient = (C * at + noise).mean(axis=1)
        # E||grad F(w_j) - grad F(w_tau)||^2 / E||grad F(w_j)||^2 for one gradient
        gammas.append((1 - fresh) * np.mean((C * (w - w_prev)) ** 2) / np.mean((C * w) ** 2))
        w_prev, w = w, w - lr * gradient
        if j in CHECKPOINTS:
            errors.append(C * w**2 / 2)
    return np.array(errors), max(gammas)


@pytest.mark.parametrize("k", [1, 4])
def test_lemma_7_bounds_k_sync(k, rng, mc):
    errors, _ = simulate(k, 0.05, rng)
    mean, stderr = mc.mean(errors, axis=1)
    bound = tradeoff.k_sync_error(CHECKPOINTS, k, model())
    assert np.all(mean <= bound + mc.z * stderr)
    assert bound[0] == pytest.approx(model().initial_gap)
    # the floor is tight up to 1/(2 - eta c): on this quadratic the stationary error is exact
    floor = 0.05 * SIGMA2 / (2 * k * BATCH * (2 - 0.05 * C))
    mc.within(floor, mean[-1], stderr[-1])


def test_theorem_3_bounds_stale_sgd(rng, mc):
    k, p0, lr = 4, 0.5, 0.05
    errors, gamma = simulate(k, lr, rng, fresh=p0)
    assert gamma < 1
    mean, stderr = mc.mean(errors, axis=1)
    bound = tradeoff.k_async_error(CHECKPOINTS, k, model(lr), staleness=gamma, p0=p0)
    assert np.all(mean <= bound + mc.z * stderr)


def test_curves_map_wall_clock_time_to_iterations():
    times = np.linspace(0, 50, 11)
    m = model()
    np.testing.assert_allclose(
        tradeoff.k_sync_curve(times, 0.25, 4, m), tradeoff.k_sync_error(times / 0.25, 4, m)
    )
    stale = tradeoff.k_async_curve(times, 0.1, 2, m, staleness=0.2, p0=tradeoff.p0_exponential(8))
    np.testing.assert_allclose(stale, tradeoff.k_async_error(times / 0.1, 2, m, 0.2, 1 / 8))
    assert np.all(np.diff(tradeoff.k_sync_curve(times, 0.25, 4, m)) < 0)


def test_learning_rate_conditions_are_enforced():
    with pytest.raises(UsageError, match="Lemma 7"):
        tradeoff.k_sync_error([1], 1, model(lr=0.6))  # needs eta <= 1 / (2L)
    assert tradeoff.k_async_max_lr(model(), 4) == pytest.approx(4 / (2 * C))
    with pytest.raises(UsageError):
        tradeoff.k_async_error([1], 1, model(), staleness=1.5, p0=0.1)
