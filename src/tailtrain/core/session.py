"""How a run is kept, whatever its clock: where its record goes, when it checkpoints, what it
resumes from, which faults it drills and what a non-finite gradient does (:class:`RunControl`),
and the interruption that carries a partial record (:class:`RunInterrupted`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tailtrain.core.records import RunRecord
from tailtrain.faults import FaultPlan

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

    def checkpoint_due(self, step: int) -> bool:
        every = self.checkpoint_every
        return self.folder is not None and every is not None and step % every == 0


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C during a run; ``record`` holds what finished, its summary marked partial."""

    def __init__(self, record: RunRecord, step: int) -> None:
        super().__init__(f"interrupted at update {step}")
        self.record = record
        self.step = step
