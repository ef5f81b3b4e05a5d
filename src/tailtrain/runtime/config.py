"""What one rank needs to run one training job: the scenario, the rule, the process group.

A ``TrainConfig`` is plain, picklable data: the launcher hands the same one to every rank,
and each rank rebuilds its own task, data partition, delay process and strategy state from it
with the seed, exactly as the simulator does (``core.scenario.World.build``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tailtrain.core.records import RunRecord
from tailtrain.core.scenario import Scenario, World
from tailtrain.errors import UsageError
from tailtrain.faults import FaultPlan
from tailtrain.strategies.base import Strategy
from tailtrain.strategies.registry import parse_strategy

BACKENDS = ("gloo", "nccl")
#: where a rank's collectives keep their tensors; None: the backend's own (nccl: cuda)
DEVICES = ("cpu", "cuda")
#: ``--on-rank-loss``: stop (census, exit, restart) or shrink in place
ON_RANK_LOSS = ("stop", "shrink")


@dataclass(frozen=True)
class TrainConfig:
    """One training job. ``inject`` says whether ``scenario.delay``/``pattern`` are injected.

    ``faults`` are ``--inject-fault`` drills (``tailtrain.faults``: NaN gradients, killed,
    frozen and raising ranks); ``on_nonfinite`` is ``skip`` or ``raise``, as in
    ``tailtrain.core.update``.
    ``timeout`` (seconds) bounds every collective and the rendezvous; ``worker_timeout``
    (seconds, None: automatic) is how long a parameter server waits on a silent worker before
    it suspects it hung (``runtime.ps.liveness``). ``out`` receives rank 0's
    run record and ``trace.csv``; each rank also writes its own ``trace-rank{r}.csv`` there.
    ``out`` is also the run folder (``runtime.keep``): rank 0 checkpoints there every
    ``checkpoint_every`` rounds, the survivors of a failure checkpoint the last completed round,
    and ranks that find a checkpoint there go on from it. ``max_restarts``: how often the local
    launcher's elastic agent restarts a failed group. ``report``: where the survivors of a
    failure leave their note for the launcher (set by ``launch``).
    ``device`` is where a rank's collectives keep their buffers: None for the backend's own
    (gloo: ``cpu``, nccl: ``cuda``), or ``cuda`` with gloo (gloo reduces CUDA tensors too, so
    several ranks can share one GPU; each rank takes GPU ``LOCAL_RANK`` modulo the GPUs).
    ``tensorboard`` receives rank 0's step and evaluation scalars as they are recorded
    (``telemetry.run_record``); with ``progress``, rank 0 draws a progress bar of the rounds
    as they are recorded, when its standard error is a terminal.
    ``on_rank_loss``: what the allreduce topology's survivors do when a rank dies or hangs:
    ``stop`` (the default: census, checkpoint, exit, and ``max_restarts`` restarts of the
    whole group, ``runtime.keep``) or ``shrink`` (go on without it, in place:
    ``runtime.elastic.shrink``). ``stop`` stays the default: shrink changes what a run
    computes after a loss (fewer ranks a step), which a user asks for. ``restart_lost``:
    under shrink, how often a local rank that died is started again; it rejoins the live ranks
    at a step boundary, healed from a live peer.
    """

    scenario: Scenario
    #: the rule, parsed once where the job is defined (a spec string is parsed here) and
    #: carried to every rank by pickle: no rank parses it again
    strategy: Strategy
    seed: int = 0
    inject: bool = False
    backend: str = "gloo"
    timeout: float = 300.0
    out: Path | None = None
    threads: int = 1
    verbose: bool = False
    faults: FaultPlan = field(default_factory=FaultPlan)
    on_nonfinite: str = "skip"
    checkpoint_every: int | None = None
    max_restarts: int = 0
    report: Path | None = None
    worker_timeout: float | None = None
    tensorboard: Path | None = None
    progress: bool = False
    device: str | None = None
    on_rank_loss: str = "stop"
    restart_lost: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.strategy, str):  # a frozen dataclass: set the parsed rule in place
            object.__setattr__(self, "strategy", parse_strategy(self.strategy))
        if self.backend not in BACKENDS:
            known = ", ".join(BACKENDS)
            raise UsageError(f"unknown --backend {self.backend!r}; use one of {known}")
        if self.device is not None and self.device not in DEVICES:
            known = ", ".join(DEVICES)
            raise UsageError(f"unknown device {self.device!r}; use one of {known}")
        if self.backend == "nccl" and self.device == "cpu":
            raise UsageError("nccl reduces CUDA tensors only; use device cuda, or gloo for cpu")
        if not 0 < self.timeout < math.inf:
            raise UsageError(f"--timeout must be finite seconds > 0, got {self.timeout}")
        if self.worker_timeout is not None and not 0 < self.worker_timeout < math.inf:
            raise UsageError(
                f"--worker-timeout must be finite seconds > 0, got {self.worker_timeout}"
            )
        if self.on_rank_loss not in ON_RANK_LOSS:
            known = ", ".join(ON_RANK_LOSS)
            raise UsageError(f"--on-rank-loss must be one of {known}, got {self.on_rank_loss!r}")
        if self.restart_lost < 0 or (self.restart_lost and self.on_rank_loss != "shrink"):
            raise UsageError(
                f"--restart-lost {self.restart_lost}: give a count >= 0, with --on-rank-loss shrink"
            )
        if self.on_nonfinite not in ("skip", "raise"):
            raise UsageError(f"--on-nonfinite must be skip or raise, got {self.on_nonfinite!r}")
        if self.threads < 1:
            raise UsageError(f"--threads must be >= 1, got {self.threads}")
        if self.checkpoint_every is not None and self.checkpoint_every < 1:
            raise UsageError(f"--checkpoint-every must be >= 1 rounds, got {self.checkpoint_every}")
        if self.max_restarts < 0:
            raise UsageError(f"--max-restarts must be >= 0, got {self.max_restarts}")
        if self.out is None and (self.checkpoint_every or self.max_restarts):
            flag = "--checkpoint-every" if self.checkpoint_every else "--max-restarts"
            raise UsageError(f"{flag} needs --out DIR, the folder the run is kept in")

    @property
    def on_cuda(self) -> bool:
        """Whether the ranks' collectives keep their buffers on a GPU."""
        return self.backend == "nccl" or self.device == "cuda"


@dataclass(frozen=True)
class RankResult:
    """What a rank hands back to the launcher: the run record (rank 0's has evals and the
    summary) and the final parameters."""

    rank: int
    record: RunRecord
    theta: np.ndarray


def build_world(config: TrainConfig, task: Any = None) -> tuple[World, Strategy]:
    """The rule and the world every rank rebuilds from the seed, as ``simulate`` builds them:
    same task, data partition and delay process (with room for the rule's micro-batches).
    ``task`` replaces the scenario's (a user's own model: ``runtime.launching.own_model``)."""
    strategy = config.strategy
    scenario = config.scenario
    capacity = strategy.micro_batch_capacity(scenario.micro_batches)
    return World.build(scenario, config.seed, task=task, micro_batches=capacity), strategy
