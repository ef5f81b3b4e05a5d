"""Predicted iteration time and throughput of every strategy in one scenario, from theory in
seconds (``prediction.estimates``; the model is in its docstring). ``prediction.large`` holds the
methods above a few thousand workers, ``prediction.families`` the rows of the families without a
table (Local-SGD, eager-SGD, DBW), ``prediction.context`` the laws and samplers they share."""

from tailtrain.prediction.estimates import best_k, predict
from tailtrain.prediction.scenario import (
    ALL_K_UP_TO,
    CRITERION,
    K_FAMILY,
    STRATEGIES,
    DelayScenario,
    Prediction,
    Row,
    k_grid,
)

__all__ = [
    "ALL_K_UP_TO",
    "CRITERION",
    "K_FAMILY",
    "STRATEGIES",
    "DelayScenario",
    "Prediction",
    "Row",
    "best_k",
    "k_grid",
    "predict",
]
