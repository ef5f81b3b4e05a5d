"""What one rank needs to run one training job: the scenario, the rule, the process group.

A :class:`TrainConfig` is plain, picklable data: the launcher hands the same one to every rank,
and each rank rebuilds its own task, data partition, delay process and strategy state from it
with the seed, exactly as the simulator does (``sim.scenario.World.build``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from tailtrain.errors import UsageError
from tailtrain.sim.scenario import Scenario, World
from tailtrain.strategies.base import Strategy
from tailtrain.strategies.registry import parse_strategy

BACKENDS = ("gloo", "nccl")


@dataclass(frozen=True)
class Fault:
    """Fault injection (torchft's ``fail_at``): rank ``rank`` raises at the start of ``step``."""

    rank: int
    step: int


@dataclass(frozen=True)
class TrainConfig:
    """One training job. ``inject`` says whether ``scenario.delay``/``pattern`` are injected.

    ``timeout`` (seconds) bounds every collective and the rendezvous. ``out`` receives rank 0's
    run record and ``trace.csv``; each rank also writes its own ``trace-rank{r}.csv`` there.
    ``tensorboard`` receives rank 0's step and evaluation scalars as they are recorded
    (``telemetry.run_record``).
    """

    scenario: Scenario
    strategy: str
    seed: int = 0
    inject: bool = False
    backend: str = "gloo"
    timeout: float = 300.0
    out: Path | None = None
    threads: int = 1
    verbose: bool = False
    fault: Fault | None = None
    tensorboard: Path | None = None

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            known = ", ".join(BACKENDS)
            raise UsageError(f"unknown --backend {self.backend!r}; use one of {known}")
        if not 0 < self.timeout < math.inf:
            raise UsageError(f"--timeout must be finite seconds > 0, got {self.timeout}")
        if self.threads < 1:
            raise UsageError(f"--threads must be >= 1, got {self.threads}")


def build_world(config: TrainConfig) -> tuple[World, Strategy]:
    """The rule and the world every rank rebuilds from the seed, as ``simulate`` builds them:
    same task, data partition and delay process (with room for the rule's micro-batches)."""
    strategy = parse_strategy(config.strategy)
    scenario = config.scenario
    capacity = strategy.micro_batch_capacity(scenario.micro_batches)
    return World.build(scenario, config.seed, micro_batches=capacity), strategy
