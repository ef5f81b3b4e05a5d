"""Shared plumbing of the reproductions: sizes (quick and full) and runs through the library.

Every number comes from ``tailtrain.sim`` (simulate, compare), ``tailtrain.prediction`` or
``tailtrain.theory``; this module only runs them and averages over seeds.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import numpy as np

from tailtrain.core.records import RunRecord
from tailtrain.core.scenario import Scenario
from tailtrain.reproduce.report import Table
from tailtrain.sim.compare import Comparison, aggregate, compare
from tailtrain.sim.run import simulate
from tailtrain.strategies.registry import parse_strategies, parse_strategy
from tailtrain.tasks.factory import is_factory_spec


@dataclass(frozen=True)
class Sizes:
    """The knobs of an experiment at ``--quick`` and at full size; ``--list`` prints both."""

    quick: dict[str, Any]
    full: dict[str, Any]

    @property
    def takes_task(self) -> bool:
        """Whether the experiment trains a model (``--task`` can replace it)."""
        return "task" in self.quick

    def pick(self, quick: bool) -> SimpleNamespace:
        """The knobs at the size asked, with ``on_task``'s task in place of the own one."""
        return SimpleNamespace(**{**(self.quick if quick else self.full), **(_TASK.get() or {})})

    def describe(self) -> str:
        return f"quick: {_knobs(self.quick)}; full: {_knobs(self.full)}"


#: set by ``on_task`` for one experiment's run: read by ``Sizes.pick``, which every
#: experiment calls first, so the experiments keep their one signature ``(out, quick)``
_TASK: ContextVar[dict[str, Any] | None] = ContextVar("reproduce_task", default=None)


@contextmanager
def on_task(task: str | None) -> Iterator[None]:
    """Within: ``Sizes.pick`` gives ``task`` (a built-in task or ``module:factory``) in place
    of the experiment's own, with the task's own learning rate (the tuned ones are for the
    tasks the experiments name). ``None``: the experiment's own task."""
    token = _TASK.set(None if task is None else {"task": task, "lr": None})
    try:
        yield
    finally:
        _TASK.reset(token)


def eta(knobs: SimpleNamespace) -> str:
    """The learning rate a report names: the experiment's, or under ``--task`` the task's own
    (``lr`` None, which the scenario resolves)."""
    return "the task default" if knobs.lr is None else str(knobs.lr)


#: the built-in tasks that train on scikit-learn's digits (the stand-in for the papers' images)
DIGITS_TASKS = frozenset({"digits-cnn", "digits-mlp", "logreg"})


def stand_in(task: str, paper_data: str) -> str:
    """What a report's task stands in for: ``scikit-learn digits in place of MNIST`` for the
    built-in digits tasks, ``in place of MNIST`` for any other (a ``--task`` of the user's)."""
    name = task.split(":", 1)[0]
    return f"{'scikit-learn digits ' if name in DIGITS_TASKS else ''}in place of {paper_data}"


def task_with(spec: str, key: str, value: Any) -> str:
    """``spec`` with one more ``key=value`` (``digits-mlp`` -> ``digits-mlp:batch=16``,
    ``pkg.mod:make:width=4`` -> ``pkg.mod:make:width=4,batch=16``)."""
    fields = 3 if is_factory_spec(spec) else 2
    joint = "," if len(spec.split(":", fields - 1)) == fields else ":"
    return f"{spec}{joint}{key}={value}"


def _knobs(values: dict[str, Any]) -> str:
    def text(v: Any) -> str:
        return ",".join(map(str, v)) if isinstance(v, tuple | list) else str(v)

    return " ".join(f"{k}={text(v)}" for k, v in values.items())


def run(scenario: Scenario, strategy: str, seed: int = 0) -> RunRecord:
    """One simulated run of ``strategy`` (a spec such as ``k-sync:k=8``)."""
    return simulate(scenario, parse_strategy(strategy), seed)


def runs(scenario: Scenario, strategies: str | Sequence[str], seeds: int) -> Comparison:
    """Every strategy on seeds 0..seeds-1, on common random numbers (``sim.compare``)."""
    text = strategies if isinstance(strategies, str) else ",".join(strategies)
    return compare(scenario, parse_strategies(text), list(range(seeds)))


def mean_of(records: Sequence[RunRecord], key: str) -> float:
    """Mean of a summary value over seeds, ignoring runs where it is missing."""
    if key in _AGGREGATED:
        return none_to_nan(aggregate("", records)[key])
    return _mean(records, key)


_AGGREGATED = ("time_to_target", "final_loss", "final_eval", "mean_k", "mean_iteration_time")


def _mean(records: Sequence[RunRecord], key: str) -> float:
    values = [r.summary.get(key) for r in records]
    finite = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    return float(np.mean(finite)) if finite else math.nan


def none_to_nan(value: float | None) -> float:
    return math.nan if value is None else float(value)


def reached(records: Sequence[RunRecord]) -> str:
    """'2/3': runs that reached the target loss."""
    hits = sum(r.summary.get("time_to_target") is not None for r in records)
    return f"{hits}/{len(records)}"


def eval_at(record: RunRecord, key: str = "eval") -> float:
    """The last evaluation's value of ``key`` (test accuracy, MSE or train loss)."""
    return none_to_nan(record.evals[-1].get(key)) if record.evals else math.nan


def steps_from(record: RunRecord, first: int) -> list[dict[str, Any]]:
    """The step rows from update ``first`` on (e.g. after DropCompute's calibration)."""
    return record.steps[first:]


def target_table(
    caption: str, key: str, cases: dict[Any, Scenario], strategies: Sequence[str], seeds: int
) -> tuple[Table, dict[Any, Comparison]]:
    """Every strategy in every case (e.g. alpha -> scenario): time to the target loss, runs
    that reached it, mean k_t, final loss and test metric, averaged over seeds."""
    table = Table(
        caption,
        [key, "strategy", "time to target (s)", "reached", "mean k_t", "final train loss",
         "final test metric"],
    )  # fmt: skip
    results = {}
    for value, scenario in cases.items():
        results[value] = result = runs(scenario, strategies, seeds)
        for name, records in result.runs.items():
            table.add(
                value, name, mean_of(records, "time_to_target"), reached(records),
                mean_of(records, "mean_k"), mean_of(records, "final_loss"),
                mean_of(records, "final_eval"),
            )  # fmt: skip
    return table, results


def best(result: Comparison, names: Sequence[str]) -> tuple[str, float]:
    """The strategy among ``names`` with the shortest mean time to target (inf if none)."""
    times = {n: mean_of(result.runs[n], "time_to_target") for n in names}
    times = {n: (t if math.isfinite(t) else math.inf) for n, t in times.items()}
    name = min(times, key=times.get)
    return name, times[name]


def name_of(strategy: str) -> str:
    """The name a strategy spec gets in run records and comparisons (its ``describe()``)."""
    return parse_strategy(strategy).describe()
