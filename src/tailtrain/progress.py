"""A rich progress bar of a run's steps, shown only on a terminal: ``simulate`` and
``compare`` advance it from the simulator's driver, ``train``'s rank 0 from its run record
(``runtime.telemetry``)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tailtrain.core.scenario import Scenario
    from tailtrain.core.session import Progress as StepCallback


@contextmanager
def step_progress(
    scenario: Scenario, label: str, enabled: bool, runs: int = 1
) -> Iterator[Callable[[int], StepCallback] | None]:
    """Yield ``for_run(i)`` giving run i's ``(step, virtual_time)`` callback, or None if hidden.

    One bar covers ``runs`` consecutive runs of the same scenario.
    """
    if not enabled or not sys.stderr.isatty():
        yield None
        return
    # rich only when a bar is shown: the CLI's parser imports this module (``--help`` stays light)
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    per_run = scenario.iterations or scenario.time_budget
    total = per_run * runs
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.percentage:>3.0f}%"),
        TimeElapsedColumn(),
        transient=True,
    ) as bar:
        task = bar.add_task(label, total=total)
        by_steps = scenario.iterations is not None

        def for_run(index: int) -> StepCallback:
            def advance(step: int, now: float) -> None:
                done = step if by_steps else min(now, per_run)
                bar.update(task, completed=index * per_run + done)

            return advance

        yield for_run
