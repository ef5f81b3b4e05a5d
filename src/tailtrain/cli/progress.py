"""A rich progress bar for long simulations, shown only on a terminal."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from tailtrain.sim.engine import Progress as StepCallback
from tailtrain.sim.scenario import Scenario


@contextmanager
def step_progress(scenario: Scenario, label: str, enabled: bool) -> Iterator[StepCallback | None]:
    """Yield a ``(step, virtual_time)`` callback that advances a bar, or None when hidden."""
    if not enabled or not sys.stderr.isatty():
        yield None
        return
    total = scenario.iterations or scenario.time_budget
    with Progress(
        TextColumn("{task.description}"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
        TimeElapsedColumn(), transient=True,
    ) as bar:
        task = bar.add_task(label, total=total)
        by_steps = scenario.iterations is not None

        def advance(step: int, now: float) -> None:
            bar.update(task, completed=step if by_steps else min(now, total))

        yield advance
