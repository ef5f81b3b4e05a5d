"""A simulated scenario (what the user asked for) and its world (what a seed makes of it)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from tailtrain.core.evaluation import EvalSchedule, time_to_target
from tailtrain.core.records import RunRecord
from tailtrain.delays import DelayProcess, parse_delay, parse_pattern
from tailtrain.delays.comm import parse_comm_time
from tailtrain.delays.groups import (
    GroupedDelays,
    check_grouping,
    groups_note,
    time_scheduled_refusal,
)
from tailtrain.delays.schedule import DelaySource, JobDurations
from tailtrain.errors import UsageError
from tailtrain.network import parse_network
from tailtrain.strategies.base import Context, Strategy
from tailtrain.tasks.partition import parse_partition

DEFAULT_LR = 0.1


@dataclass(frozen=True)
class Scenario:
    """Everything but the strategy and the seed. Iterations or a virtual-time budget bound it."""

    task: str = "digits-cnn"
    workers: int = 16
    delay: str = "shifted-exp:shift=0,scale=1"
    pattern: str = "iid"
    micro_batches: int | None = None
    comm_time: str | None = None
    network: str | None = None
    partition: str = "iid"
    data: str | None = None
    lr: float | None = None
    iterations: int | None = None
    time_budget: float | None = None
    eval_every: int | None = None
    eval_interval: float | None = None
    target_loss: float | None = None
    #: ranks per replica group (hybrid sharding, ``delays.groups``): the rules act on the
    #: workers / group_size groups, a group's micro-batch the max over its ranks + group_cost
    group_size: int = 1
    #: seconds of within-group collectives per group micro-batch (``delays.groups``)
    group_cost: float = 0.0

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise UsageError(f"--workers must be >= 1, got {self.workers}")
        check_grouping(self.workers, self.group_size, self.group_cost)
        if self.group_size > 1 and parse_pattern(self.pattern).time_scheduled:
            raise UsageError(time_scheduled_refusal(self.pattern))
        if (self.iterations is None) == (self.time_budget is None):
            raise UsageError("give exactly one of --iterations and --time-budget")
        if self.iterations is not None and self.iterations < 1:
            raise UsageError(f"--iterations must be >= 1, got {self.iterations}")
        if self.time_budget is not None and not 0 < self.time_budget < math.inf:
            raise UsageError(f"--time-budget must be finite seconds > 0, got {self.time_budget}")
        if self.lr is not None and not 0 < self.lr < math.inf:
            raise UsageError(f"--lr must be finite and > 0, got {self.lr}")
        if self.target_loss is not None and not math.isfinite(self.target_loss):
            raise UsageError(f"--target-loss must be a finite number, got {self.target_loss}")
        parse_comm_time(self.comm_time)
        parse_network(self.network)
        if self.time_budget is not None and not parse_delay(self.delay).mean > 0:
            raise UsageError(
                f"delay {self.delay!r} takes no time, so the virtual clock never reaches "
                "--time-budget; give --iterations or a delay with a positive mean"
            )
        if self.micro_batches is not None and self.micro_batches < 1:
            raise UsageError(f"--micro-batches must be >= 1, got {self.micro_batches}")
        if self.eval_every is not None and self.eval_every < 1:
            raise UsageError(f"--eval-every must be >= 1, got {self.eval_every}")
        if self.eval_interval is not None and not 0 < self.eval_interval < math.inf:
            raise UsageError(
                f"--eval-interval must be finite virtual seconds > 0, got {self.eval_interval}"
            )
        if self.eval_every is not None and self.eval_interval is not None:
            raise UsageError("give one of --eval-every and --eval-interval, not both")

    @property
    def groups(self) -> int:
        """The workers the rules act on: replica groups of ``group_size`` ranks (all the
        workers when ``group_size`` is 1)."""
        return self.workers // self.group_size

    def at_group_level(self) -> Scenario:
        """This scenario as its engines run it: ``groups`` workers, no grouping left (the
        grouping is in the delays, ``delays.groups.GroupedDelays``)."""
        if self.group_size == 1 and self.group_cost == 0:
            return self
        return replace(self, workers=self.groups, group_size=1, group_cost=0.0)

    @property
    def evaluation(self) -> EvalSchedule:
        """When the run evaluates its model (``core.evaluation``)."""
        return EvalSchedule.of(
            eval_interval=self.eval_interval,
            eval_every=self.eval_every,
            time_budget=self.time_budget,
        )

    def with_replayed_comm(self) -> Scenario:
        """This scenario with the T^c a replay of its delay charges (``delays.trace.
        replayed_comm``): ``comm_time`` when given, else the rounds' ``noncompute`` seconds a
        trace delay recorded, else none. The one resolution of T^c that ``simulate``,
        ``compare`` and ``predict`` apply, on the command line and in the library alike, so
        one trace prices the same sync everywhere."""
        from tailtrain.delays.trace import replayed_comm

        comm_time = replayed_comm(self.delay, self.comm_time)
        return self if comm_time == self.comm_time else replace(self, comm_time=comm_time)


def budget_spent(scenario: Scenario, step: int, now: float, iteration_scale: float = 1.0) -> bool:
    """Whether a run's budget is spent: the one rule of every engine and topology.

    ``iterations`` updates, stretched by a plan's ``iteration_scale`` (DropCompute Sec. 4.5's
    extra steps; 1 elsewhere), or ``time_budget`` seconds of the engine's clock (virtual in
    the simulator, wall in the runtime).
    """
    if scenario.iterations is None:
        return now >= scenario.time_budget
    return step >= math.ceil(scenario.iterations * iteration_scale - 1e-9)


@dataclass(frozen=True)
class World:
    """What a seed makes of a scenario, whatever the topology: the task, its data partition,
    the delay process, the rule's context and the learning rate. Each topology's engine builds
    its own clock and model store from it, and nothing else."""

    scenario: Scenario
    seed: int
    task: Any
    process: DelaySource
    partition: Any  # the task's PartitionState; None when timing only
    context: Context
    lr: float
    #: one-line trace notes for the summary (``trace_mapping``, ``trace_warning``), if any
    notes: dict[str, str] = field(default_factory=dict)

    @classmethod
    def build(
        cls,
        scenario: Scenario,
        seed: int,
        *,
        task: Any = None,
        delays: DelaySource | None = None,
        micro_batches: int | None = None,
    ) -> World:
        """Seed everything; ``task`` and ``delays`` replace the scenario's (tests, own models).

        ``micro_batches`` is the most micro-batches a step may use (``Strategy.
        micro_batch_capacity``); by default the scenario's.

        With replica groups (``group_size`` > 1) the delays are drawn for the scenario's
        ``workers`` ranks (``delays`` then replaces the ranks' process) and grouped
        (``delays.groups.GroupedDelays``), and the world is that of the groups: its scenario
        is :meth:`Scenario.at_group_level`, the same world as ``groups`` workers fed the
        grouped delays.
        """
        if task is None:  # the registry loads every built-in task: only when one is built
            from tailtrain.tasks.registry import parse_task

            task = parse_task(scenario.task, data=scenario.data, seed=seed)
        ranks = scenario.workers
        process = delays or DelayProcess(
            parse_delay(scenario.delay),
            parse_pattern(scenario.pattern),
            seed,
            ranks,
            scenario.micro_batches if micro_batches is None else micro_batches,
        )
        grouped: dict[str, str] = {}
        if scenario.at_group_level() is not scenario:
            process = GroupedDelays(process, scenario.group_size, scenario.group_cost)
            grouped["groups"] = groups_note(ranks, scenario.group_size, scenario.group_cost)
            scenario = scenario.at_group_level()
        n = scenario.workers
        lr = scenario.lr or getattr(task, "default_lr", None) or DEFAULT_LR
        partition = None
        per_epoch = 1
        if task.has_model:
            rng = np.random.default_rng(seed)
            partition = parse_partition(scenario.partition).assign(task, n, rng)
            per_epoch = max(1, math.ceil(task.n_train / (n * task.batch_size)))
        ctx = Context(
            n_workers=n,
            lr=lr,
            iterations_per_epoch=per_epoch,
            seed=seed,
            micro_batches=scenario.micro_batches or 1,
        )
        # trace notes, then the task's own (how a factory's task computes its gradients)
        notes = {**getattr(process, "notes", {}), **getattr(task, "notes", {}), **grouped}
        return cls(scenario, seed, task, process, partition, ctx, lr, notes)

    def durations(self, *, round_trips: bool) -> JobDurations:
        """Each worker's successive job durations. ``round_trips``: a job is a parameter-server
        round trip (pull, compute, push) and lasts compute + T^c, T^c drawn per job; engines
        with collectives leave it off and charge T^c per collective themselves."""
        comm = parse_comm_time(self.scenario.comm_time) if round_trips else None
        return JobDurations(self.process, self.scenario.workers, comm, self.seed)

    def finished(self, step: int, now: float, iteration_scale: float = 1.0) -> bool:
        """The run's budget (``budget_spent``)."""
        return budget_spent(self.scenario, step, now, iteration_scale)

    def summarise(self, strategy: Strategy, record: RunRecord) -> dict[str, Any]:
        times = record.column("time") if record.steps else np.zeros(1)
        last = record.evals[-1] if record.evals else {}
        return {
            "strategy": strategy.describe(),
            "seed": self.seed,
            "iterations": len(record.steps),
            "virtual_time": float(times[-1]),
            "mean_iteration_time": float(times[-1] / max(1, len(record.steps))),
            "mean_k": float(record.column("k").mean()) if record.steps else math.nan,
            "final_loss": last.get("train_loss", math.nan),
            "final_eval": last.get("eval", math.nan),
            "eval_metric": getattr(self.task, "metric_name", None),
            "time_to_target": time_to_target(record, self.scenario.target_loss),
            "target_loss": self.scenario.target_loss,
            **self.notes,
        }
