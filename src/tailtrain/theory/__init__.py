"""Runtime theory of straggler-tolerant SGD.

* :mod:`~tailtrain.theory.order_stats` — E[X_{k:n}] (exact, quadrature, or Monte Carlo for traces)
* :mod:`~tailtrain.theory.kfamily` — slow-and-stale Table II, Lemmas 1-5, Theorems 1-2
* :mod:`~tailtrain.theory.montecarlo` — K-async / K-batch-sync iteration times by simulation
* :mod:`~tailtrain.theory.dropcompute` — DropCompute Eqs. 4-12, tau*, Algorithm 2
* :mod:`~tailtrain.theory.tradeoff` — error-runtime bounds (Lemma 7, Theorem 3) as curves
* :mod:`~tailtrain.theory.families` — closed forms of sums of M i.i.d. micro-batch times
"""

from tailtrain.theory.dropcompute import (
    ThresholdChoice,
    ThresholdEvaluation,
    analytic_speedup,
    analytic_threshold,
    bailey_expected_max,
    bailey_iteration_time,
    carried_rates,
    carried_threshold,
    empirical_speedup,
    empirical_threshold,
    evaluate_threshold,
    exact_speedup,
    exact_threshold,
    expected_completed,
)
from tailtrain.theory.estimate import Estimate
from tailtrain.theory.families import closed_form, exponential_params, nonnegative
from tailtrain.theory.kfamily import (
    TableII,
    async_speedup,
    async_time,
    batch_speedup,
    batch_speedup_approx,
    k_async_bound,
    k_async_shifted_exp_approx,
    k_async_shifted_exp_bound,
    k_batch_async_time,
    k_batch_sync_bound,
    k_sync_time,
    table_ii,
)
from tailtrain.theory.order_stats import OrderStats, expected_order_stat, expected_order_stats
from tailtrain.theory.tradeoff import (
    ErrorModel,
    k_async_curve,
    k_async_error,
    k_sync_curve,
    k_sync_error,
    p0_exponential,
)

__all__ = [
    "ErrorModel",
    "Estimate",
    "OrderStats",
    "TableII",
    "ThresholdChoice",
    "ThresholdEvaluation",
    "analytic_speedup",
    "analytic_threshold",
    "async_speedup",
    "async_time",
    "bailey_expected_max",
    "bailey_iteration_time",
    "batch_speedup",
    "batch_speedup_approx",
    "carried_rates",
    "carried_threshold",
    "closed_form",
    "empirical_speedup",
    "empirical_threshold",
    "evaluate_threshold",
    "exact_speedup",
    "exact_threshold",
    "expected_completed",
    "expected_order_stat",
    "expected_order_stats",
    "exponential_params",
    "k_async_bound",
    "k_async_curve",
    "k_async_error",
    "k_async_shifted_exp_approx",
    "k_async_shifted_exp_bound",
    "k_batch_async_time",
    "k_batch_sync_bound",
    "k_sync_curve",
    "k_sync_error",
    "k_sync_time",
    "nonnegative",
    "p0_exponential",
    "table_ii",
]
