"""Entry point of the simulator: the engine of a strategy's topology, driven by one loop."""

from __future__ import annotations

from typing import Any

from tailtrain.core.capacity import check_fits
from tailtrain.core.records import RunRecord
from tailtrain.core.scenario import Scenario, World
from tailtrain.core.session import RunControl
from tailtrain.delays.schedule import DelaySource
from tailtrain.sim.allreduce.engine import AllreduceEngine
from tailtrain.sim.driver import Progress, drive
from tailtrain.sim.partial.engine import PartialCollectiveEngine
from tailtrain.sim.ps.engine import ServerEngine
from tailtrain.strategies.base import Strategy, Topology, check_contract

#: topology -> the simulator's engine for it (``sim.driver.Engine``)
ENGINES = {
    Topology.PARAMETER_SERVER: ServerEngine,
    Topology.ALLREDUCE: AllreduceEngine,
    Topology.PARTIAL_COLLECTIVE: PartialCollectiveEngine,
}


def simulate(
    scenario: Scenario,
    strategy: Strategy,
    seed: int,
    progress: Progress | None = None,
    *,
    task: Any = None,
    delays: DelaySource | None = None,
    control: RunControl | None = None,
) -> RunRecord:
    """Run ``strategy`` on ``scenario`` with ``seed``; the same inputs give the same record.

    ``task`` and ``delays`` replace the scenario's task and delay process (tests, own models);
    ``control`` streams the record, checkpoints, resumes and drills faults (``sim.driver``).
    With replica groups (``scenario.group_size`` > 1) the engines run the groups as workers
    and ``delays``, if given, is the ranks' process (``core.scenario.World.build``).
    A run too large for this machine's memory is refused before it starts (``core.capacity``).
    """
    engine = ENGINES[strategy.topology]
    check_contract(strategy, strategy.topology, getattr(engine, "does", frozenset()))
    capacity = strategy.micro_batch_capacity(scenario.micro_batches)
    check_fits(scenario.workers, capacity)
    world = World.build(scenario, seed, task=task, delays=delays, micro_batches=capacity)
    if world.task.has_model:  # one model per worker the rules act on (a replica group)
        check_fits(world.scenario.workers, capacity, int(world.task.dim))
    return drive(engine(world), strategy, world, progress, control)
