"""Several strategies on the same scenario and seeds: common random numbers make it fair.

Worker w's j-th job lasts the same time under every strategy for a given seed (see
``delays.schedule``), so differences between rows come from the strategies, not from luck.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tailtrain.core.records import RunRecord
from tailtrain.core.scenario import Scenario
from tailtrain.errors import UsageError
from tailtrain.sim.run import simulate
from tailtrain.strategies.base import Strategy

METRICS = ("time_to_target", "final_loss", "final_eval", "mean_k", "mean_iteration_time")


@dataclass(frozen=True)
class Comparison:
    """The runs of every (strategy, seed) pair and their per-strategy aggregate rows."""

    scenario: Scenario
    seeds: tuple[int, ...]
    runs: dict[str, list[RunRecord]]

    def rows(self) -> list[dict[str, Any]]:
        return [aggregate(name, records) for name, records in self.runs.items()]


class CompareInterrupted(KeyboardInterrupt):
    """Ctrl-C during a comparison: ``comparison`` holds the runs that finished, and
    ``strategy`` / ``seed`` name the run that was cut short."""

    def __init__(self, comparison: Comparison, strategy: str, seed: int) -> None:
        super().__init__(f"interrupted during {strategy} seed {seed}")
        self.comparison = comparison
        self.strategy = strategy
        self.seed = seed


def compare(
    scenario: Scenario,
    strategies: Sequence[Strategy],
    seeds: Sequence[int],
    on_run: Callable[[str, int], Callable[[int, float], None] | None] | None = None,
    on_done: Callable[[str, int, RunRecord], None] | None = None,
) -> Comparison:
    """Every strategy on every seed. ``on_done`` sees each run as it finishes (to keep it
    at once); Ctrl-C raises ``CompareInterrupted`` with the runs that finished."""
    runs: dict[str, list[RunRecord]] = {}
    names = [s.describe() for s in strategies]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise UsageError(f"strategy {twice[0]!r} is given twice in --strategies; drop one")
    again = sorted({s for s in seeds if list(seeds).count(s) > 1})
    if again:
        raise UsageError(f"seed {again[0]} is given twice in --seeds; each seed runs once")
    for strategy, name in zip(strategies, names, strict=True):
        for seed in seeds:
            try:
                record = simulate(scenario, strategy, seed, on_run(name, seed) if on_run else None)
            except KeyboardInterrupt:
                done = Comparison(scenario, tuple(seeds), runs)
                raise CompareInterrupted(done, name, seed) from None
            runs.setdefault(name, []).append(record)
            if on_done is not None:
                on_done(name, seed, record)
    return Comparison(scenario, tuple(seeds), runs)


def aggregate(name: str, records: Sequence[RunRecord]) -> dict[str, Any]:
    """Mean and sample standard deviation over seeds (time to target: over seeds that got there)."""
    row: dict[str, Any] = {"strategy": name, "seeds": len(records)}
    for metric in METRICS:
        values = np.array([nan_if_none(r.summary.get(metric)) for r in records], dtype=float)
        ok = values[np.isfinite(values)]
        row[metric] = float(ok.mean()) if ok.size else None
        row[f"{metric}_std"] = float(ok.std(ddof=1)) if ok.size > 1 else None
        if metric == "time_to_target":
            row["reached_target"] = int(ok.size)
    return row


def nan_if_none(value: Any) -> float:
    return math.nan if value is None else float(value)
