"""Error-runtime trade-off of the K-family (slow-and-stale Sec. IV-V, Lemma 7, Theorem 3).

The error bounds count iterations J; combined with a runtime per iteration E[T] (Table II),
J = t / E[T] iterations fit in wall-clock time t (Sec. VI, N(t) ~ t / E[T]), which turns them
into error-versus-time curves such as the paper's Fig. 1(b).

Symbols (Sec. IV-A): F is L-smooth and c-strongly convex; the stochastic gradient of a
mini-batch of m samples has variance <= sigma^2/m + M_G/m ||grad F||^2; eta is the learning rate.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from tailtrain.errors import UsageError


@dataclass(frozen=True)
class ErrorModel:
    """Constants of slow-and-stale Sec. IV-A, by their paper symbols."""

    lr: float  # eta
    smoothness: float  # L
    convexity: float  # c
    noise: float  # sigma^2
    batch: int  # m, samples per mini-batch
    initial_gap: float  # F(w_0) - F*
    noise_growth: float = 0.0  # M_G

    def __post_init__(self) -> None:
        values = (self.lr, self.smoothness, self.convexity, self.batch)
        if min(values) <= 0 or min(self.noise, self.initial_gap, self.noise_growth) < 0:
            raise UsageError(
                f"error model needs eta, L, c, m > 0 and sigma^2, gap, M_G >= 0: {self}"
            )


def k_sync_max_lr(model: ErrorModel, k: int) -> float:
    """Largest eta for Lemma 7: 1 / (2L (M_G/(Km) + 1))."""
    return 1.0 / (2 * model.smoothness * (model.noise_growth / (k * model.batch) + 1))


def k_async_max_lr(model: ErrorModel, k: int) -> float:
    """Largest eta for Theorem 3: 1 / (2L (M_G/(Km) + 1/K))."""
    return 1.0 / (2 * model.smoothness * (model.noise_growth / (k * model.batch) + 1 / k))


def k_sync_error(iterations: ArrayLike, k: int, model: ErrorModel) -> NDArray[np.float64]:
    """Bound on E[F(w_J)] - F* after J iterations of K-sync SGD (slow-and-stale Lemma 7, Eq. 22):

    eta L sigma^2 / (2c K m) + (1 - eta c)^J (F(w_0) - F* - eta L sigma^2 / (2c K m)).
    """
    _check_lr(model, k_sync_max_lr(model, k), "Lemma 7")
    return _decay(iterations, model, k, rate=1.0)


def k_async_error(
    iterations: ArrayLike, k: int, model: ErrorModel, staleness: float, p0: float
) -> NDArray[np.float64]:
    """Bound on E[F(w_J)] - F* after J iterations of K-async or K-batch-async SGD
    (slow-and-stale Theorem 3, Eq. 21, and Remark 3), with gamma' = 1 - gamma + p0/2:

    eta L sigma^2 / (2c gamma' K m) + (1 - eta c gamma')^J (F(w_0) - F* - that floor).

    ``staleness`` is gamma <= 1 with E||grad F(w_j) - grad F(w_tau)||^2 <= gamma E||grad F(w_j)||^2;
    ``p0`` lower-bounds P(tau(l, j) = j) (Lemma 6: 1/P for exponential times).
    """
    if not 0 <= staleness <= 1 or not 0 <= p0 <= 1:
        raise UsageError(f"Theorem 3 needs 0 <= gamma <= 1 and 0 <= p0 <= 1, got {staleness}, {p0}")
    _check_lr(model, k_async_max_lr(model, k), "Theorem 3")
    return _decay(iterations, model, k, rate=1 - staleness + p0 / 2)


def p0_exponential(workers: int) -> float:
    """p0 = 1/P for exponential compute times (slow-and-stale Lemma 6)."""
    return 1.0 / workers


def k_sync_curve(
    times: ArrayLike, iteration_time: float, k: int, model: ErrorModel
) -> NDArray[np.float64]:
    """Lemma 7's bound versus wall-clock time t, with J = t / E[T] (slow-and-stale Sec. VI)."""
    return k_sync_error(_iterations(times, iteration_time), k, model)


def k_async_curve(
    times: ArrayLike,
    iteration_time: float,
    k: int,
    model: ErrorModel,
    staleness: float,
    p0: float,
) -> NDArray[np.float64]:
    """Theorem 3's bound versus wall-clock time t, with J = t / E[T] (slow-and-stale Sec. VI)."""
    return k_async_error(_iterations(times, iteration_time), k, model, staleness, p0)


def _iterations(times: ArrayLike, iteration_time: float) -> NDArray[np.float64]:
    if not iteration_time > 0:
        raise UsageError(f"runtime per iteration must be > 0, got {iteration_time}")
    return np.asarray(times, dtype=float) / iteration_time


def _decay(iterations: ArrayLike, model: ErrorModel, k: int, rate: float) -> NDArray[np.float64]:
    j = np.asarray(iterations, dtype=float)
    floor = (
        model.lr * model.smoothness * model.noise / (2 * model.convexity * rate * k * model.batch)
    )
    contraction = 1 - model.lr * model.convexity * rate
    if not 0 <= contraction < 1:
        raise UsageError(
            f"need 0 < eta c gamma' <= 1 for a decaying bound, got {1 - contraction:g}"
        )
    return floor + contraction**j * (model.initial_gap - floor)


def _check_lr(model: ErrorModel, largest: float, source: str) -> None:
    if model.lr > largest:
        raise UsageError(f"{source} holds for eta <= {largest:.4g}; got eta={model.lr:g}")
