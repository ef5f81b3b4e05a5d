"""Evaluation schedules: one virtual-time grid for every strategy, interpolated time to target."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tailtrain.core.evaluation import DEFAULT_GRID_POINTS, EvalSchedule, time_to_target
from tailtrain.core.records import RunRecord
from tailtrain.core.scenario import Scenario
from tailtrain.errors import UsageError
from tailtrain.sim.compare import compare
from tailtrain.sim.run import simulate
from tailtrain.strategies.registry import parse_strategy


def record_of(points: list[tuple[float, float]]) -> RunRecord:
    record = RunRecord()
    for t, loss in points:
        record.add_eval({"step": 0, "time": t, "train_loss": loss})
    return record


def test_time_to_target_interpolates_between_the_bracketing_evaluations() -> None:
    record = record_of([(0.0, 2.0), (10.0, 1.0), (20.0, 0.2)])
    # 1.0 -> 0.2 over [10, 20]: 0.5 is reached 5/8 of the way
    assert time_to_target(record, 0.5) == pytest.approx(10.0 + 10.0 * 0.5 / 0.8)
    assert time_to_target(record, 1.0) == 10.0
    assert time_to_target(record, 3.0) == 0.0
    assert time_to_target(record, 0.1) is None
    assert time_to_target(record, None) is None


def test_default_schedule_is_a_time_grid_under_a_budget_and_steps_otherwise() -> None:
    assert EvalSchedule.of(eval_interval=None, eval_every=None, time_budget=300.0).interval == (
        300.0 / DEFAULT_GRID_POINTS
    )
    assert EvalSchedule.of(eval_interval=None, eval_every=None, time_budget=None).every == 10
    assert EvalSchedule.of(eval_interval=2.0, eval_every=None, time_budget=None).interval == 2.0
    with pytest.raises(UsageError, match="not both"):
        Scenario(task="logreg", iterations=5, eval_every=2, eval_interval=1.0)
    with pytest.raises(UsageError, match="--eval-interval"):
        Scenario(task="logreg", iterations=5, eval_interval=0.0)


@pytest.mark.parametrize(
    "strategy", ["sync", "k-sync:k=2", "dropcompute:threshold=inf", "eager:mode=solo"]
)
def test_grid_point_scores_the_model_in_force_then(strategy: str) -> None:
    """Constant unit delays: update s happens at time s (s = 1, 2, ...), so the model in force
    at grid time g has floor(g) updates (the one at g itself included)."""
    scenario = Scenario(
        task="logreg", workers=4, delay="const:value=1", time_budget=6.0, eval_interval=0.5
    )
    record = simulate(scenario, parse_strategy(strategy), seed=0)
    times = [row["time"] for row in record.evals]
    assert times == pytest.approx(np.arange(0, 6.01, 0.5))
    if strategy.startswith("eager"):
        return  # rounds also take activation hops, so updates fall just after integers
    assert [row["step"] for row in record.evals] == [math.floor(t) for t in times]


def test_every_strategy_of_a_compare_is_evaluated_on_the_same_grid() -> None:
    scenario = Scenario(
        task="logreg", workers=8, delay="exp:rate=1", time_budget=20.0, target_loss=0.5
    )
    strategies = [parse_strategy(s) for s in ("sync", "k-sync:k=2", "dropcompute:threshold=1")]
    result = compare(scenario, strategies, seeds=[0])
    grids = [[row["time"] for row in runs[0].evals] for runs in result.runs.values()]
    assert all(grid == grids[0] for grid in grids)
    assert grids[0] == pytest.approx(np.linspace(0, 20.0, DEFAULT_GRID_POINTS + 1))
