"""Entry point of the simulator: picks the engine a strategy belongs to."""

from __future__ import annotations

import importlib

from tailtrain.sim.engine import Progress
from tailtrain.sim.records import RunRecord
from tailtrain.sim.scenario import Scenario
from tailtrain.strategies.base import Strategy

#: engine name -> module exposing ``simulate(scenario, strategy, seed, progress) -> RunRecord``
ENGINES = {
    "parameter-server": "tailtrain.sim.engine:simulate_parameter_server",
    "allreduce": "tailtrain.sim.allreduce_engine:simulate_allreduce",
    "eager": "tailtrain.sim.eager_engine:simulate_eager",
}


def simulate(
    scenario: Scenario, strategy: Strategy, seed: int, progress: Progress | None = None
) -> RunRecord:
    """Run ``strategy`` on ``scenario`` with ``seed``; the same inputs give the same record."""
    module, _, name = ENGINES[strategy.engine].partition(":")
    return getattr(importlib.import_module(module), name)(scenario, strategy, seed, progress)
