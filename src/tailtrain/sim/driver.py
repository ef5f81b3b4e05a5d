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

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from tailtrain.core import checkpoint
from tailtrain.core.evaluation import Evaluator
from tailtrain.core.records import RUN_FILES, RecordSink, RunRecord, clear_run, write_json
from tailtrain.core.scenario import World
from tailtrain.core.session import Progress, RunControl, RunInterrupted
from tailtrain.core.update import NonFiniteGradient, WeightedUpdate
from tailtrain.errors import UsageError
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
    """One run's loop, record, evaluations and checkpoints."""

    def __init__(self, engine: Engine, strategy: Strategy, world: World, control: RunControl):
        self.engine, self.strategy, self.world, self.control = engine, strategy, world, control
        self.update = engine.weighted_update
        if self.update is not None:
            self.update.on_nonfinite = control.on_nonfinite
        self.record = RunRecord()
        self.evals = Evaluator(world.scenario.evaluation, self.record, engine.learns)
        self.state = strategy.init(world.context)
        self.nonfinite = 0
        offsets = None
        if control.resume is not None:
            offsets = self._resume(control.resume)
        if control.folder is not None:
            if offsets is None:  # a fresh start: nothing of an earlier run stays
                clear_run(control.folder, RUN_FILES)
                if control.run_info is not None:
                    write_json(control.folder / "run.json", control.run_info)
            self.record.sink = RecordSink(control.folder, offsets)
        if control.resume is None:
            self.evals.start(engine.scorer())

    def loop(self, progress: Progress | None) -> None:
        engine, strategy, state = self.engine, self.strategy, self.state
        while not engine.finished(plan := strategy.plan(state)):
            before = engine.scorer()
            played = engine.play(plan)
            selection = strategy.select(state, played.candidates)
            if self.update is not None:
                self.update.inject = self.control.faults.at(engine.step)
            stats = engine.apply(plan, selection, played)
            dropped = self._dropped()
            if dropped.size:  # a gradient screened out did not enter the update
                stats = dataclasses.replace(stats, used=stats.used[~np.isin(stats.used, dropped)])
            state = self.state = strategy.adapt(state, stats)
            row = engine.row(plan, selection, played, stats)
            if dropped.size:
                row["nonfinite"] = int(dropped.size)
                self.nonfinite += int(dropped.size)
            self.record.add_step(row)
            engine.advance()
            self.evals.after_step(engine.step, engine.now, before, engine.scorer())
            if progress is not None:
                progress(engine.step, engine.now)
            if self.control.checkpoint_due(engine.step):
                self._save()
        self.evals.finish(engine.step, engine.now, engine.scorer())

    def _dropped(self) -> np.ndarray:
        if self.update is None:
            return np.zeros(0, dtype=np.int64)
        dropped, self.update.dropped = self.update.dropped, np.zeros(0, dtype=np.int64)
        return dropped

    def close(self, *, partial: bool) -> None:
        """The summary (marked partial after an interrupt); written if the run streams."""
        record, engine = self.record, self.engine
        record.summary = {
            **self.world.summarise(self.strategy, record),
            **engine.summary(record),
            "nonfinite": self.nonfinite,
        }
        if self.control.faults.faults:
            record.summary["injected_faults"] = self.control.faults.describe()
        if partial:
            record.summary["partial"] = True
        folder = self.control.folder
        if folder is None:
            return
        if record.sink is not None:
            record.sink.close()
            record.sink = None
        write_json(folder / "summary.json", record.summary)
        if not partial:  # a finished run needs no checkpoint
            (folder / checkpoint.FILENAME).unlink(missing_ok=True)

    def _identity(self) -> dict[str, Any]:
        scenario = dataclasses.asdict(self.world.scenario)
        return {"strategy": self.strategy.describe(), "seed": self.world.seed, "scenario": scenario}

    def _save(self) -> None:
        assert self.control.folder is not None and self.record.sink is not None
        data = {
            **self._identity(),
            "step": self.engine.step,
            "engine": self.engine.state_dict(),
            "strategy_state": self.strategy.state_dict(self.state),
            "evaluator": checkpoint.capture(self.evals, ("schedule", "record", "enabled")),
            "record": checkpoint.pack({"steps": self.record.steps, "evals": self.record.evals}),
            "offsets": self.record.sink.offsets(),
            "nonfinite": self.nonfinite,
        }
        checkpoint.save(self.control.folder / checkpoint.FILENAME, data)

    def _resume(self, saved: dict[str, Any]) -> dict[str, int]:
        """Restore everything a checkpoint holds; return the record files' offsets."""
        for key, value in self._identity().items():
            if saved.get(key) != value:
                raise UsageError(
                    f"the checkpoint is of another run ({key} {saved.get(key)!r}, not "
                    f"{value!r}); resume with the flags in the run's run.json"
                )
        self.engine.load_state_dict(saved["engine"])
        self.state = self.strategy.load_state_dict(saved["strategy_state"])
        checkpoint.restore(self.evals, saved["evaluator"])
        rows = checkpoint.unpack(saved["record"])
        self.record.steps, self.record.evals = rows["steps"], rows["evals"]
        self.nonfinite = int(saved["nonfinite"])
        return dict(saved["offsets"])
