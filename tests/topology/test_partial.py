"""The partial-collective round row (``topology.partial.round_row``): one function, with the
columns only one engine can fill declared in the ledger."""

from __future__ import annotations

import numpy as np
import pytest

from tailtrain.strategies.base import ArrivalColumns, StepStats
from tailtrain.strategies.eager import Collective, RoundPlan
from tailtrain.topology import partial


def row(only=None):
    stats = StepStats(step=3, version=4, time=1.5, k=2, arrivals=ArrivalColumns.empty(), lr=0.1)
    plan = RoundPlan(k=2, collective=Collective.SOLO)
    return partial.round_row(stats, plan, np.array([0, 2]), np.array([0, 1]), 2, 0, only)


def test_both_engines_share_the_columns_in_one_order():
    assert list(row()) == list(partial.ROW)
    assert list(row({"models": 1})) == [*partial.ROW[:-1], "models", "arrivals"]
    measured = {"initiators": [0], "active": [0, 2], "reach": 0.01}
    assert list(row(measured)) == [*partial.ROW, *partial.MEASURED_ONLY]
    assert not set(partial.SIMULATED_ONLY) & set(partial.MEASURED_ONLY)


def test_an_undeclared_column_is_refused():
    with pytest.raises(ValueError, match="undeclared"):
        row({"spare": 1})
