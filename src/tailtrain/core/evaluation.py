"""When a run evaluates its model, and the time at which it first reaches a target loss.

Two schedules:

* a **virtual-time grid** (``--eval-interval SECONDS``; by default 1/100 of ``--time-budget``):
  evaluations at t = 0, I, 2I, … up to the budget. The model scored at grid time g is the one
  in force at g, i.e. the latest update at or before g. Every strategy of a ``compare`` is
  thus scored at the same instants, whatever the length of its steps, so time to target is
  not rounded up by a strategy's own step length.
* a **step grid** (``--eval-every U`` updates, the default under ``--iterations``): after every
  U-th update, at that update's time, and after the last one.

Time to target is interpolated linearly between the two evaluations that bracket the target.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tailtrain.core.records import RunRecord

#: evaluations on the default virtual-time grid of a time-budgeted run
DEFAULT_GRID_POINTS = 100

Scores = Callable[[], dict[str, Any]]


@dataclass(frozen=True)
class EvalSchedule:
    """``interval`` virtual seconds between evaluations, or every ``every`` updates."""

    interval: float | None = None
    every: int | None = None
    budget: float | None = None

    @classmethod
    def of(
        cls,
        *,
        eval_interval: float | None,
        eval_every: int | None,
        time_budget: float | None,
    ) -> EvalSchedule:
        """The schedule a scenario asks for (see the module docstring for the defaults)."""
        if eval_interval is not None:
            return cls(interval=eval_interval, budget=time_budget)
        if eval_every is not None or time_budget is None:
            return cls(every=eval_every or 10)
        return cls(interval=time_budget / DEFAULT_GRID_POINTS, budget=time_budget)

    @property
    def on_time_grid(self) -> bool:
        return self.interval is not None


class Evaluator:
    """Adds evaluation rows to a record as a run advances; ``scores`` evaluates lazily.

    Engines call :meth:`start` once, :meth:`after_step` after every update, and
    :meth:`finish` at the end. A model is scored at most once per call, however many grid
    points its interval covers.
    """

    def __init__(self, schedule: EvalSchedule, record: RunRecord, enabled: bool) -> None:
        self.schedule = schedule
        self.record = record
        self.enabled = enabled
        self._next = 0  # index of the next grid point (time grid)

    def _grid(self, index: int) -> float:
        assert self.schedule.interval is not None
        return index * self.schedule.interval

    def _add(self, step: int, time: float, scores: dict[str, Any]) -> None:
        self.record.add_eval({"step": step, "time": time, **scores})

    def start(self, scores: Scores) -> None:
        if not self.enabled:
            return
        self._add(0, 0.0, scores())
        self._next = 1

    def after_step(self, step: int, now: float, before: Scores, after: Scores) -> None:
        """``step`` updates are done and the last one happened at ``now``.

        ``before`` scores the model the last update replaced (in force until ``now``),
        ``after`` the model it made.
        """
        if not self.enabled:
            return
        if not self.schedule.on_time_grid:
            assert self.schedule.every is not None
            if step % self.schedule.every == 0:
                self._add(step, now, after())
            return
        scores = None
        while self._grid(self._next) < now and self._within_budget(self._next):
            scores = scores or before()
            self._add(step - 1, self._grid(self._next), scores)
            self._next += 1

    def _within_budget(self, index: int) -> bool:
        budget = self.schedule.budget
        return budget is None or self._grid(index) <= budget * (1 + 1e-12)

    def finish(self, step: int, now: float, scores: Scores) -> None:
        """The final model: at the remaining grid points up to the budget, or at ``now``."""
        if not self.enabled:
            return
        if not self.schedule.on_time_grid:
            if step % self.schedule.every != 0:  # type: ignore[operator]
                self._add(step, now, scores())
            return
        last = None
        while self._grid(self._next) <= now and self._within_budget(self._next):
            last = last or scores()
            self._add(step, self._grid(self._next), last)
            self._next += 1
        if self.schedule.budget is None and self.record.evals[-1]["time"] < now:
            self._add(step, now, last or scores())


def time_to_target(record: RunRecord, target: float | None) -> float | None:
    """Virtual time at which the evaluated train loss reaches ``target``.

    Linear interpolation between the last evaluation above the target and the first at or
    below it; the time of the first evaluation if that one is already at or below.
    """
    if target is None:
        return None
    previous = None
    for row in record.evals:
        loss = row.get("train_loss", math.inf)
        if loss is not None and loss <= target:
            if previous is None:
                return float(row["time"])
            t0, l0 = previous
            share = (l0 - target) / (l0 - loss) if l0 > loss else 1.0
            return float(t0 + share * (row["time"] - t0))
        if loss is not None and math.isfinite(loss):
            previous = (float(row["time"]), float(loss))
    return None
