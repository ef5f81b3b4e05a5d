"""Runtime theory of straggler-tolerant SGD.

* :mod:`~tailtrain.theory.order_stats` — E[X_{k:n}] (exact, quadrature, or Monte Carlo for traces)
* :mod:`~tailtrain.theory.kfamily` — slow-and-stale Table II, Lemmas 1-5, Theorems 1-2
* :mod:`~tailtrain.theory.montecarlo` — K-async / K-batch-sync iteration times by simulation
* :mod:`~tailtrain.theory.dropcompute` — DropCompute Eqs. 4-12, tau*, Algorithm 2
* :mod:`~tailtrain.theory.tradeoff` — error-runtime bounds (Lemma 7, Theorem 3) as curves
* :mod:`~tailtrain.theory.families` — closed forms of sums of M i.i.d. micro-batch times
"""

from typing import TYPE_CHECKING

from tailtrain.lazy import lazy_names

#: public name -> the module of this package that defines it, loaded on first use: a rank
#: imports ``theory.dropcompute`` for Algorithm 2 and needs none of the rest (nor scipy)
_NAMES: dict[str, str] = {
    "ThresholdChoice": "tailtrain.theory.dropcompute",
    "ThresholdEvaluation": "tailtrain.theory.dropcompute",
    "analytic_speedup": "tailtrain.theory.dropcompute",
    "analytic_threshold": "tailtrain.theory.dropcompute",
    "bailey_expected_max": "tailtrain.theory.dropcompute",
    "bailey_iteration_time": "tailtrain.theory.dropcompute",
    "carried_rates": "tailtrain.theory.dropcompute",
    "carried_threshold": "tailtrain.theory.dropcompute",
    "empirical_speedup": "tailtrain.theory.dropcompute",
    "empirical_threshold": "tailtrain.theory.dropcompute",
    "evaluate_threshold": "tailtrain.theory.dropcompute",
    "exact_speedup": "tailtrain.theory.dropcompute",
    "exact_threshold": "tailtrain.theory.dropcompute",
    "expected_completed": "tailtrain.theory.dropcompute",
    "Estimate": "tailtrain.theory.estimate",
    "closed_form": "tailtrain.theory.families",
    "exponential_params": "tailtrain.theory.families",
    "nonnegative": "tailtrain.theory.families",
    "TableII": "tailtrain.theory.kfamily",
    "async_speedup": "tailtrain.theory.kfamily",
    "async_time": "tailtrain.theory.kfamily",
    "batch_speedup": "tailtrain.theory.kfamily",
    "batch_speedup_approx": "tailtrain.theory.kfamily",
    "k_async_bound": "tailtrain.theory.kfamily",
    "k_async_shifted_exp_approx": "tailtrain.theory.kfamily",
    "k_async_shifted_exp_bound": "tailtrain.theory.kfamily",
    "k_batch_async_time": "tailtrain.theory.kfamily",
    "k_batch_sync_bound": "tailtrain.theory.kfamily",
    "k_sync_time": "tailtrain.theory.kfamily",
    "table_ii": "tailtrain.theory.kfamily",
    "OrderStats": "tailtrain.theory.order_stats",
    "expected_order_stat": "tailtrain.theory.order_stats",
    "expected_order_stats": "tailtrain.theory.order_stats",
    "ErrorModel": "tailtrain.theory.tradeoff",
    "k_async_curve": "tailtrain.theory.tradeoff",
    "k_async_error": "tailtrain.theory.tradeoff",
    "k_sync_curve": "tailtrain.theory.tradeoff",
    "k_sync_error": "tailtrain.theory.tradeoff",
    "p0_exponential": "tailtrain.theory.tradeoff",
}

__getattr__, __dir__ = lazy_names(__name__, _NAMES)

if TYPE_CHECKING:
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
