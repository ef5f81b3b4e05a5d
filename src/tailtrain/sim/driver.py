"""The one driver loop of the simulator, shared by its three topologies.

Each step: the rule plans, the topology's engine plays the step on its virtual clock and offers
the arrivals, the rule selects, the engine applies the Selection through the shared update
path (``tailtrain.core.update``) and reports ``StepStats``, and the rule adapts::

    plan = rule.plan(state) -> engine.play(plan) -> rule.select(state, arrivals)
         -> engine.apply(plan, selection) -> rule.adapt(state, stats)

Engines (``sim.ps``, ``sim.allreduce``, ``sim.partial``) own time, processes and tensors; the
driver owns the loop, the record and the evaluations (``core.evaluation``), and how a run is
kept (:class:`RunControl`): rows streamed to a folder, checkpoints every U updates and a
resume from one (``core.checkpoint``), fault drills and what a non-finite gradient does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from tailtrain.core import checkpoint, envelope
from tailtrain.core.evaluation import Evaluator
from tailtrain.core.records import RunRecord
from tailtrain.core.scenario import World
from tailtrain.core.session import (
    Progress,
    RunControl,
    RunInterrupted,
    RunKeeper,
    run_identity,
)
from tailtrain.core.update import NonFiniteGradient, WeightedUpdate
from tailtrain.strategies.base import ArrivalColumns, Plan, Selection, StepStats, Strategy

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

    #: the update path (deferred term, non-finite screening, fault drills); None: no model
    @property
    def weighted_update(self) -> WeightedUpdate | None: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


def drive(
    engine: Engine,
    strategy: Strategy,
    world: World,
    progress: Progress | None = None,
    control: RunControl | None = None,
) -> RunRecord:
    """Run ``strategy`` on ``engine`` until the scenario's budget; return the run record."""
    control = control or RunControl()
    run = _Run(engine, strategy, world, control)
    try:
        run.loop(progress)
    except KeyboardInterrupt:
        run.close(partial=True)
        raise RunInterrupted(run.record, engine.step) from None
    except NonFiniteGradient as exc:
        run.close(partial=True)
        raise NonFiniteGradient(exc.workers, step=engine.step) from None
    run.close(partial=False)
    return run.record


class _Run:
    """One run's loop; its keeping (record, evaluations, checkpoints, summary) is the
    :class:`RunKeeper`'s, as in every `train` topology."""

    def __init__(self, engine: Engine, strategy: Strategy, world: World, control: RunControl):
        self.engine, self.strategy, self.world, self.control = engine, strategy, world, control
        self.update = engine.weighted_update
        if self.update is not None:
            self.update.on_nonfinite = control.on_nonfinite
            # a rule that never adapts reads no statistics: no pass for the gradient moments
            self.update.moments = not strategy.keeps_state
        self.keeper = RunKeeper(
            run_identity(strategy, world),
            folder=control.folder,
            every=control.checkpoint_every,
            faults=control.faults,
            run_info=control.run_info,
        )
        self.record = RunRecord()
        self.evals = Evaluator(world.scenario.evaluation, self.record, engine.learns)
        self.state = strategy.init(world.context)
        offsets = None
        if control.resume is not None:
            offsets = self._resume(control.resume)
        self.keeper.open(self.record, offsets)
        self.keeper.begin(self.evals, engine.scorer(), resumed=control.resume is not None)

    def loop(self, progress: Progress | None) -> None:
        engine, strategy, state, keeper = self.engine, self.strategy, self.state, self.keeper
        while not engine.finished(plan := strategy.plan(state)):
            before = engine.scorer()
            played = engine.play(plan)
            selection = strategy.select(state, played.candidates)
            if self.update is not None:
                self.update.inject = self.control.faults.at(engine.step)
            stats = engine.apply(plan, selection, played)
            dropped = self._dropped()
            stats = keeper.screen(stats, dropped)  # a screened-out gradient was not used
            state = self.state = strategy.adapt(state, stats)
            row = engine.row(plan, selection, played, stats)
            self.record.add_step(keeper.note_nonfinite(row, dropped.size))
            engine.advance()
            keeper.stepped(self.evals, engine.step, engine.now, before, engine.scorer())
            if progress is not None:
                progress(engine.step, engine.now)
            if keeper.due(engine.step):
                self._save()
        keeper.end(self.evals, engine.step, engine.now, engine.scorer(), interrupted=False)

    def _dropped(self) -> np.ndarray:
        if self.update is None:
            return np.zeros(0, dtype=np.int64)
        return self.update.take_dropped()

    def close(self, *, partial: bool) -> None:
        """The summary (marked partial after an interrupt); written if the run streams."""
        record = self.record
        topology = self.engine.summary(record)
        record.summary = self.keeper.summary(
            self.world, self.strategy, record, topology, partial=partial
        )
        self.keeper.close(record, partial=partial)

    def _save(self) -> None:
        """The run's envelope (``core.envelope``) with its identity; its parts: the engine's
        state and the record files' offsets. The envelope carries every row so far, and the
        engine its own generators (no torch generator is drawn from)."""
        assert self.control.folder is not None and self.record.sink is not None
        engine, steps, evals = self.engine, self.record.steps, self.record.evals
        data = envelope.seal(
            step=engine.step,
            now=engine.now,
            rule=self.strategy.state_dict(self.state),
            evals=self.evals,
            rows=envelope.rows_at(len(steps), steps, len(evals), evals),
            rng=False,
            engine=engine.state_dict(),
            offsets=self.record.sink.offsets(),
        )
        checkpoint.save(self.control.folder / checkpoint.FILENAME, {**self.keeper.identity, **data})

    def _resume(self, saved: dict[str, Any]) -> dict[str, int]:
        """Restore everything a checkpoint holds; return the record files' offsets."""
        self.keeper.check(saved)
        self.engine.load_state_dict(saved["engine"])
        self.state = self.strategy.load_state_dict(saved["rule"])  # a pure rule: state apart
        envelope.unseal(saved, evals=self.evals)
        self.record.steps, self.record.evals = envelope.step_tail(saved), envelope.eval_tail(saved)
        return dict(saved["offsets"])
