"""Expected runtime per iteration of the K-family (slow-and-stale Table II, Lemmas 1-5,
Theorems 1-2).

P workers, X_1..X_P i.i.d. per mini-batch compute times, X_{K:P} the K-th order statistic:

=============  =====================================  ===========================
variant        E[T]                                   holds for
=============  =====================================  ===========================
K-sync         E[X_{K:P}]              (Lemma 1)      all distributions
K-batch-sync   <= K E[X_{1:P}]         (Lemma 2)      new-longer-than-used (NLTU)
K-async        <= E[X_{K:P}]           (Lemma 3)      NLTU; Lemma 4 for Delta+Exp
K-batch-async  K E[X] / P              (Lemma 5)      all (long-run average)
=============  =====================================  ===========================

For the exponential both bounds hold with equality (memorylessness; Eq. 10, Theorem 2's proof).
Fully synchronous SGD is K-sync with K = P; fully asynchronous is K-batch-async with K = 1.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from tailtrain.delays.base import DelayModel
from tailtrain.errors import UsageError
from tailtrain.theory.estimate import EXACT, Estimate
from tailtrain.theory.families import exponential_params
from tailtrain.theory.order_stats import (
    expected_order_stat,
    expected_order_stats,
    exponential_order_stats,
)


@dataclass(frozen=True)
class TableII:
    """Slow-and-stale Table II for one model and P, vectorised over K.

    ``k_batch_sync`` and ``k_async`` are the NLTU upper bounds of Lemmas 2-3 (exact for the
    exponential, see ``bounds_exact``); ``k_sync`` and ``k_batch_async`` are exact.
    """

    workers: int
    k: NDArray[np.int64]
    k_sync: NDArray[np.float64]
    k_batch_sync: NDArray[np.float64]
    k_async: NDArray[np.float64]
    k_batch_async: NDArray[np.float64]
    method: str
    bounds_exact: bool


def table_ii(
    model: DelayModel,
    workers: int,
    ks: ArrayLike | None = None,
    *,
    rng: np.random.Generator | None = None,
    samples: int = 20_000,
) -> TableII:
    """Expected runtime per iteration of each variant for every K in ``ks`` (default 1..P)."""
    stats = expected_order_stats(model, workers, ks, rng=rng, samples=samples)
    minimum = expected_order_stats(model, workers, [1], rng=rng, samples=samples).mean[0]
    exponential = exponential_params(model)
    return TableII(
        workers=workers,
        k=stats.k,
        k_sync=stats.mean,
        k_batch_sync=stats.k * minimum,
        k_async=stats.mean,
        k_batch_async=stats.k * model.mean / workers,
        method=stats.method,
        bounds_exact=exponential is not None and exponential[0] == 0.0,
    )


def k_sync_time(model: DelayModel, k: int, workers: int, **mc) -> Estimate:
    """E[T] = E[X_{K:P}] for K-sync SGD (slow-and-stale Lemma 1, Eq. 6)."""
    return expected_order_stat(model, _check_k(k, workers), workers, **mc)


def k_batch_sync_bound(model: DelayModel, k: int, workers: int, **mc) -> Estimate:
    """E[T] <= K E[X_{1:P}] for K-batch-sync SGD with NLTU times (Lemma 2, Eq. 9).

    Equality for X ~ Exp(mu), where T ~ Erlang(K, P mu) and E[T] = K/(P mu) (Eq. 10).
    """
    minimum = expected_order_stat(model, 1, workers, **mc)
    k = _check_k(k, workers)
    return Estimate(k * minimum.value, k * minimum.stderr, minimum.method)


def k_async_bound(model: DelayModel, k: int, workers: int, **mc) -> Estimate:
    """E[T] <= E[X_{K:P}] for K-async SGD with NLTU times (Lemma 3, Eq. 11); equality for
    the exponential (Theorem 2's proof)."""
    return expected_order_stat(model, _check_k(k, workers), workers, **mc)


def k_async_shifted_exp_bound(shift: float, rate: float, k: int, workers: int) -> float:
    """Per-iteration bound of K-async SGD for X ~ shift + Exp(rate), P = nK (Lemma 4, Eq. 12):

    E[T] <= (1/n) (shift + sum_{i=0}^{n-1} E[Xt_{K:(P-iK)}]),  Xt ~ Exp(rate).
    """
    n = _lemma4_blocks(k, workers)
    sizes = workers - k * np.arange(n)
    per_block = [exponential_order_stats(rate, int(size), [k])[0] for size in sizes]
    return (shift + float(np.sum(per_block))) / n


def k_async_shifted_exp_approx(shift: float, rate: float, k: int, workers: int) -> float:
    """Lemma 4's approximation Eq. (13): K shift / P + K log(P) / (P rate)."""
    return k * shift / workers + k * np.log(workers) / (workers * rate)


def k_batch_async_time(model: DelayModel, k: int, workers: int) -> float:
    """E[T] = K E[X] / P for K-batch-async SGD, any distribution (Lemma 5, Eq. 14)."""
    return _check_k(k, workers) * model.mean / workers


def async_time(model: DelayModel, workers: int) -> float:
    """Fully asynchronous SGD: K-batch-async with K = 1, E[T] = E[X] / P (Lemma 5)."""
    return k_batch_async_time(model, 1, workers)


def async_speedup(model: DelayModel, workers: int, **mc) -> Estimate:
    """E[T_sync] / E[T_async] = P E[X_{P:P}] / E[X] (slow-and-stale Theorem 1, Eq. 5)."""
    top = expected_order_stat(model, workers, workers, **mc)
    scale = workers / model.mean
    return Estimate(scale * top.value, scale * top.stderr, top.method)


def batch_speedup(model: DelayModel, k: int, workers: int, **mc) -> Estimate:
    """E[T_K-async] / E[T_K-batch-async] = P E[X_{K:P}] / (K E[X]) (Theorem 2; exact for the
    exponential, otherwise the ratio of Lemma 3's bound to Lemma 5)."""
    kth = expected_order_stat(model, _check_k(k, workers), workers, **mc)
    scale = workers / (k * model.mean)
    return Estimate(scale * kth.value, scale * kth.stderr, kth.method)


def batch_speedup_approx(k: int, workers: int) -> float:
    """Theorem 2's approximation P log(P / (P - K)) / K for 1 < K < P (exponential times)."""
    if not 1 < k < workers:
        raise UsageError(f"Theorem 2's approximation needs 1 < K < P, got K={k}, P={workers}")
    return workers * np.log(workers / (workers - k)) / k


def exponential_k_sync_time(rate: float, k: int, workers: int) -> Estimate:
    """E[X_{K:P}] = sum_{i=P-K+1}^{P} 1/(i rate) for Exp(rate) (Remark 1), exact."""
    value = exponential_order_stats(rate, workers, [_check_k(k, workers)])[0]
    return Estimate(float(value), 0.0, EXACT)


def _check_k(k: int, workers: int) -> int:
    if workers < 1:
        raise UsageError(f"need at least one worker, got P={workers}")
    if not 1 <= k <= workers:
        raise UsageError(f"K={k} must lie in 1..P={workers}")
    return int(k)


def _lemma4_blocks(k: int, workers: int) -> int:
    _check_k(k, workers)
    if workers % k or workers // k < 2:
        raise UsageError(f"Lemma 4 needs P = nK with an integer n > 1, got P={workers}, K={k}")
    return workers // k
