"""Entry point of the simulator: picks the engine of a strategy's topology."""

from __future__ import annotations

import importlib

from tailtrain.sim.engine import Progress
from tailtrain.sim.records import RunRecord
from tailtrain.sim.scenario import Scenario
from tailtrain.strategies.base import Strategy, Topology

#: topology -> the simulator engine ``simulate(scenario, strategy, seed, progress) -> RunRecord``
ENGINES = {
    Topology.PARAMETER_SERVER: "tailtrain.sim.engine:simulate_parameter_server",
    Topology.ALLREDUCE: "tailtrain.sim.allreduce_engine:simulate_allreduce",
    Topology.PARTIAL_COLLECTIVE: "tailtrain.sim.eager_engine:simulate_eager",
}


def simulate(
    scenario: Scenario, strategy: Strategy, seed: int, progress: Progress | None = None
) -> RunRecord:
    """Run ``strategy`` on ``scenario`` with ``seed``; the same inputs give the same record."""
    module, _, name = ENGINES[strategy.topology].partition(":")
    return getattr(importlib.import_module(module), name)(scenario, strategy, seed, progress)
