"""The one driver loop of the simulator, shared by its three topologies.

Each step: the rule plans, the topology's engine plays the step on its virtual clock and offers
the arrivals, the rule selects, the engine applies the Selection through the shared update
path (``tailtrain.update``) and reports ``StepStats``, and the rule adapts::

    plan = rule.plan(state) -> engine.play(plan) -> rule.select(state, arrivals)
         -> engine.apply(plan, selection) -> rule.adapt(state, stats)

Engines (``sim.ps``, ``sim.allreduce``, ``sim.partial``) own time, processes and tensors; the
driver owns the loop, the record and the evaluations (``sim.evaluation``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from tailtrain.sim.evaluation import Evaluator
from tailtrain.sim.records import RunRecord
from tailtrain.sim.scenario import World
from tailtrain.strategies.base import ArrivalColumns, Plan, Selection, StepStats, Strategy

Progress = Callable[[int, float], None]
Scorer = Callable[[], dict[str, Any]]


@dataclass(frozen=True)
class Played:
    """A played step: the arrivals offered to ``select`` and the engine's own details."""

    candidates: ArrivalColumns
    detail: Any = None


class Engine(Protocol):
    """What a topology's engine does for the driver."""

    #: updates done and the virtual clock
    step: int
    now: float
    #: whether there is a model to update and evaluate (False: timing only)
    learns: bool

    def finished(self, plan: Plan) -> bool: ...

    def scorer(self) -> Scorer:
        """Evaluates the model as it stands now, when called (even after later steps)."""
        ...

    def play(self, plan: Plan) -> Played: ...

    def apply(self, plan: Plan, selection: Selection, played: Played) -> StepStats: ...

    def row(
        self, plan: Plan, selection: Selection, played: Played, stats: StepStats
    ) -> dict[str, Any]: ...

    def advance(self) -> None:
        """Close the step: count it, move the clock, forget what no later step needs."""
        ...

    def summary(self, record: RunRecord) -> dict[str, Any]: ...


def drive(
    engine: Engine, strategy: Strategy, world: World, progress: Progress | None = None
) -> RunRecord:
    """Run ``strategy`` on ``engine`` until the scenario's budget; return the run record."""
    state = strategy.init(world.context)
    record = RunRecord()
    evals = Evaluator(world.scenario.evaluation, record, engine.learns)
    evals.start(engine.scorer())
    while not engine.finished(plan := strategy.plan(state)):
        before = engine.scorer()
        played = engine.play(plan)
        selection = strategy.select(state, played.candidates)
        stats = engine.apply(plan, selection, played)
        state = strategy.adapt(state, stats)
        record.add_step(engine.row(plan, selection, played, stats))
        engine.advance()
        evals.after_step(engine.step, engine.now, before, engine.scorer())
        if progress is not None:
            progress(engine.step, engine.now)
    evals.finish(engine.step, engine.now, engine.scorer())
    record.summary = {**world.summarise(strategy, record), **engine.summary(record)}
    return record
