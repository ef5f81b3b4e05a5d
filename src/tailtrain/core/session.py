"""How a run is kept, whatever its clock: where its record goes, when it checkpoints, what it
resumes from, which faults it drills and what a non-finite gradient does (:class:`RunControl`),
the interruption that carries a partial record (:class:`RunInterrupted`), and the one keeper
of a run's lifecycle that the simulator and every `train` topology share (:class:`RunKeeper`:
identity, checkpoint-due, record sink, evaluation calls, non-finite accounting, summary)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from tailtrain.core import checkpoint
from tailtrain.core.evaluation import Evaluator
from tailtrain.core.records import RUN_FILES, RecordSink, RunRecord, clear_run, write_json
from tailtrain.errors import UsageError
from tailtrain.faults import FaultPlan

if TYPE_CHECKING:
    from tailtrain.core.scenario import World
    from tailtrain.strategies.base import StepStats, Strategy

#: a run's progress callback, called with ``(step, time)`` after each step
Progress = Callable[[int, float], None]


@dataclass(frozen=True)
class RunControl:
    """How a run is kept. ``folder``: stream the record there (and checkpoints, every
    ``checkpoint_every`` updates), replacing any run it held; ``resume``: a loaded
    checkpoint to go on from; ``faults``: fault drills; ``on_nonfinite``: ``skip`` drops a
    gradient with a NaN or an infinity from its update, ``raise`` stops the run
    (``tailtrain.core.update``)."""

    folder: Path | None = None
    checkpoint_every: int | None = None
    resume: dict[str, Any] | None = None
    faults: FaultPlan = field(default_factory=FaultPlan)
    on_nonfinite: str = "skip"
    #: what started the run (``run.json``), written as a fresh run starts in ``folder``
    run_info: dict[str, Any] | None = None


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C during a run; ``record`` holds what finished, its summary marked partial."""

    def __init__(self, record: RunRecord, step: int) -> None:
        super().__init__(f"interrupted at update {step}")
        self.record = record
        self.step = step


#: the two clocks a run is summarised on: the simulator's, or the measured one of `train`
CLOCKS = ("virtual", "wall")


def run_identity(strategy: Strategy, world: World) -> dict[str, Any]:
    """What a checkpoint must match to be resumed: the rule, the seed and the scenario (of
    the workers the rules act on; with replica groups, also how the ranks were grouped)."""
    scenario = dataclasses.asdict(world.scenario)
    # always 1 and 0 at the engines' level (``Scenario.at_group_level``): left out, so that
    # checkpoints written before replica groups existed still resume
    scenario.pop("group_size", None), scenario.pop("group_cost", None)
    identity = {"strategy": strategy.describe(), "seed": world.seed, "scenario": scenario}
    if "groups" in world.notes:
        identity["groups"] = world.notes["groups"]
    return identity


def check_entry(world: World, ranks: int, servers: int = 0) -> None:
    """What every `train` topology checks as a rank starts: the job's ``ranks`` are the
    scenario's workers plus ``servers`` (a parameter server), and the task has a model."""
    workers = world.scenario.workers
    if ranks != workers + servers and servers:
        raise UsageError(
            f"--workers {workers} needs {workers + servers} ranks (a parameter server and the "
            f"workers) but the job has {ranks}"
        )
    if ranks != workers + servers:
        raise UsageError(f"--workers {workers} but the job has {ranks} ranks")
    if world.partition is None:
        raise UsageError(f"task {world.scenario.task!r} has no model to train; choose e.g. logreg")


def screened(used: np.ndarray, dropped: np.ndarray) -> np.ndarray:
    """The used arrival keys less the screened-out ones (``core.update``): a gradient with a
    NaN or an infinity did not enter the update, so no rule may count it as used."""
    return used[~np.isin(used, dropped)] if dropped.size else used


def nonfinite_total(record: RunRecord) -> int:
    """The run's screened-out gradients: the sum of its rows' ``nonfinite`` columns."""
    return int(sum(row.get("nonfinite", 0) for row in record.steps))


@dataclass
class RunKeeper:
    """The keeping of one run whatever its clock, the one copy the simulator's driver and
    every `train` topology share: what a checkpoint must match (``identity``,
    :meth:`check`), when one is due (:meth:`due`), the record sink of a fresh or resumed run
    (:meth:`open`), the evaluation call sequence (:meth:`begin` / :meth:`stepped` /
    :meth:`end`), the non-finite accounting of a row (:meth:`screen`) and the summary on a
    ``virtual`` or a ``wall`` clock (:meth:`summary`)."""

    identity: dict[str, Any]
    folder: Path | None = None
    every: int | None = None
    clock: str = "virtual"
    faults: FaultPlan = field(default_factory=FaultPlan)
    #: what started the run (``run.json``), written as a fresh run starts in ``folder``
    run_info: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.clock not in CLOCKS:
            raise ValueError(f"clock {self.clock!r}: one of {', '.join(CLOCKS)}")

    # ---- identity and checkpoints --------------------------------------------------------
    def check(self, saved: dict[str, Any], where: Path | None = None) -> None:
        """Refuse a checkpoint of another run (one message for every engine)."""
        of = "the checkpoint" if where is None else f"the checkpoint in {where}"
        for key, value in self.identity.items():
            if saved.get(key) != value:
                raise UsageError(
                    f"{of} is of another run ({key} {saved.get(key)!r}, not {value!r}); "
                    "resume with the flags in the run's run.json"
                )

    def due(self, step: int, since: int | None = None) -> bool:
        """Whether a checkpoint is due after ``step`` updates: at every multiple of
        ``every``; with ``since`` (the steps the last one held), when a multiple was passed
        since then (an engine that snapshots off its main thread may skip one)."""
        every = self.every
        if self.folder is None or every is None:
            return False
        if since is None:
            return step % every == 0
        return step // every > since // every

    # ---- the record ------------------------------------------------------------------------
    def open(self, record: RunRecord, offsets: dict[str, int] | None = None) -> None:
        """Stream ``record`` to the folder: a fresh run (``offsets`` None) clears what an
        earlier run left and writes ``run.json``; a resumed one cuts the files back."""
        if self.folder is None:
            return
        if offsets is None:
            clear_run(self.folder, RUN_FILES)
            if self.run_info is not None:
                write_json(self.folder / "run.json", self.run_info)
        record.sink = RecordSink(self.folder, offsets)

    # ---- evaluations -----------------------------------------------------------------------
    @staticmethod
    def begin(evals: Evaluator, scorer: Callable[[], dict], resumed: bool) -> None:
        """The first evaluation, of the initial model; a resumed run has it already."""
        if not resumed:
            evals.start(scorer)

    @staticmethod
    def stepped(evals: Evaluator, step: int, now: float, before: Callable, after: Callable) -> bool:
        """The evaluations due after ``step`` updates at ``now``; whether any was made."""
        made = len(evals.record.evals)
        evals.after_step(step, now, before, after)
        return len(evals.record.evals) != made

    @staticmethod
    def end(evals: Evaluator, step: int, now: float, scorer: Callable, interrupted: bool) -> None:
        """The final evaluation; an interrupted run is not scored again: it ends now."""
        if not interrupted:
            evals.finish(step, now, scorer)

    # ---- non-finite accounting and the summary ----------------------------------------------
    @staticmethod
    def screen(stats: StepStats, dropped: np.ndarray) -> StepStats:
        """``stats`` without the screened-out gradients among its used arrivals."""
        if not dropped.size:
            return stats
        return dataclasses.replace(stats, used=screened(stats.used, dropped))

    @staticmethod
    def note_nonfinite(row: dict[str, Any], count: int) -> dict[str, Any]:
        """The row's ``nonfinite`` column: present when a gradient was screened out."""
        if count:
            row["nonfinite"] = int(count)
        return row

    def summary(
        self,
        world: World,
        strategy: Strategy,
        record: RunRecord,
        topology: dict[str, Any],
        *,
        partial: bool = False,
    ) -> dict[str, Any]:
        """simulate's summary keys, the topology's own, the non-finite total, the injected
        faults and, after an interrupt, ``partial``; on the wall clock ``virtual_time``
        reads ``wall_time``."""
        summary = {**world.summarise(strategy, record), **topology}
        summary["nonfinite"] = nonfinite_total(record)
        if self.faults.faults:
            summary["injected_faults"] = self.faults.describe()
        if partial:
            summary["partial"] = True
        if self.clock == "wall":
            return {("wall_time" if k == "virtual_time" else k): v for k, v in summary.items()}
        return summary

    def close(self, record: RunRecord, *, partial: bool) -> None:
        """Close the sink and write the summary; a finished run needs no checkpoint."""
        if self.folder is None:
            return
        if record.sink is not None:
            record.sink.close()
            record.sink = None
        write_json(self.folder / "summary.json", record.summary)
        if not partial:
            (self.folder / checkpoint.FILENAME).unlink(missing_ok=True)
