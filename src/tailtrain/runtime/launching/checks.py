"""What runs where, and every check of ``tailtrain train`` that needs no other process.

Checked before anything starts (``launching.launch.train`` calls :func:`validate`): the
strategy's topology and its own checks with the job's worker count (``Strategy.init``), the
scenario, task and delays (by building them once), the number of local ranks (at most
``MAX_LOCAL_WORKERS`` and ``WORKERS_PER_CORE`` per CPU core: each rank is a whole Python
process with its own copy of the data), the on-rank-loss refusals, the backend and CUDA for
nccl. Those errors are one-line ``UsageError``\\ s.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import torch

from tailtrain.core.machine import MAX_LOCAL_WORKERS, WORKERS_PER_CORE, max_local_workers
from tailtrain.core.session import check_entry
from tailtrain.errors import TailtrainError, UsageError
from tailtrain.runtime.config import TrainConfig, build_world
from tailtrain.runtime.control import RuleDriver
from tailtrain.runtime.elastic.refusals import check_shrink
from tailtrain.runtime.launching.topologies import TopologySpec, spec_of
from tailtrain.strategies.base import Context, Strategy, Topology

TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "MASTER_ADDR")


def in_torchrun(env: Mapping[str, str] = os.environ) -> bool:
    """Whether this process is a rank of a job someone else launched (torchrun, env://)."""
    return all(name in env for name in TORCHRUN_VARIABLES)


def default_backend() -> str:
    return "nccl" if torch.cuda.is_available() else "gloo"


def validate(config: TrainConfig, *, local: bool) -> None:
    """Every check that needs no other process (module docstring)."""
    scenario = config.scenario
    spec = spec_of(config.strategy)
    if scenario.group_size != 1 or scenario.group_cost != 0:  # a library Scenario's fields
        raise UsageError(
            "train runs every worker as one DDP rank: replica groups (group_size) are for "
            "simulate, compare and predict"
        )
    if config.checkpoint_every is not None and not spec.checkpoints:
        raise UsageError(
            f"the {spec.topology} topology keeps no checkpoints; drop --checkpoint-every"
        )
    if local and scenario.workers > max_local_workers():
        raise UsageError(
            f"--workers {scenario.workers} local processes is too many: at most "
            f"{max_local_workers()} here ({WORKERS_PER_CORE} per CPU core, "
            f"{MAX_LOCAL_WORKERS} in all); use torchrun across machines for more"
        )
    world, strategy = build_world(config)  # loads the task and reads trace files
    # every rank's own entry check (a task with no model, among others), before any starts
    check_entry(world, spec.processes(scenario.workers), servers=spec.extra_ranks)
    check_rule(strategy, spec, world.context, local=local)
    if config.on_rank_loss == "shrink":  # before the GPUs are counted: the same line anywhere
        check_shrink(
            strategy,
            str(spec.topology),
            local=local,
            ctx=world.context,
            backend=config.backend,
            on_cuda=config.on_cuda,
        )
    if config.backend == "nccl":
        check_cuda(scenario.workers if local else 1)
    elif config.on_cuda:
        check_cuda(1, "device cuda")


def check_rule(strategy: Strategy, spec: TopologySpec, ctx: Context, *, local: bool) -> None:
    """The rule's own checks with the job's workers (``Strategy.init``, as every rank runs
    it), and its first plan as its topology takes it; where the topology has ranks of its own
    (a parameter server's rank 0), the refusal says which ranks are the workers."""
    try:
        driver = RuleDriver(strategy, ctx, remember=False)  # init, as every rank runs it
        if spec.topology is Topology.ALLREDUCE:
            driver.plan()  # as the allreduce takes it (``as_allreduce``)
    except TailtrainError as exc:
        if not spec.extra_ranks:
            raise UsageError(str(exc)) from None
        n = ctx.n_workers
        job = f"with --workers {n}" if local else f"of torchrun's {n + 1} ranks"
        raise UsageError(
            f"{exc}: {job}, rank 0 is the parameter server and ranks 1-{n} are its {n} workers"
        ) from None


def check_cuda(gpus: int, asked: str = "--backend nccl") -> None:
    if not torch.cuda.is_available():
        raise UsageError(f"{asked} needs CUDA GPUs and none is available; use gloo on cpu")
    if torch.cuda.device_count() < gpus:
        raise UsageError(
            f"--backend nccl runs one rank per GPU: {gpus} ranks but "
            f"{torch.cuda.device_count()} GPUs; use fewer --workers or gloo"
        )
