"""``--on-rank-loss shrink``'s refusals, written once for every rank host (review E3).

Shrinking is refused in one line, before any process starts or any round runs, where it
cannot work:

* a topology that does not shrink: the parameter server (its own liveness drops a silent
  worker, ``runtime.ps.liveness``);
* nccl or CUDA tensors: every new generation is a ``ProcessGroupGloo`` on CPU tensors
  (``group.GroupCollectives``, ``partial.regroup.generation_groups``), and a rank on a GPU
  would hand gloo its CUDA buffers. No GPU run has shown a shrink there, so it is refused for
  every host alike, until one does;
* a launch whose job does not survive a rank's death (torchrun's agent stops every rank);
* a rule that cannot follow a smaller world (``Strategy.follow_refusal``: DropCompute's
  ``compensate=larger-batch``, rebalance's ``defer=true``, ``dbw-quorum``'s estimates).

``train`` asks :func:`check_shrink` (``runtime.launching.checks.validate``), whichever topology it
runs; a user's loop (``integrate``: ``StragglerStep``, ``ShardedStep``, the DDP hook's state)
asks :func:`check_on_rank_loss`, which adds to :func:`check_gloo_cpu` and :func:`check_follows`
what only a loop can get wrong: the launcher, the process group, per-rank shares, a deal on
demand that its step cannot deal again.
"""

from __future__ import annotations

import dataclasses
import os
from typing import TYPE_CHECKING, Any

from tailtrain.errors import UsageError
from tailtrain.runtime.control import RuleDriver
from tailtrain.strategies.base import Context, Strategy, Topology

if TYPE_CHECKING:
    from tailtrain.runtime.reduce import Collectives

#: the topologies that shrink, and what a refused rule's line adds for each
SHRINKS = {
    Topology.ALLREDUCE: "",
    Topology.PARTIAL_COLLECTIVE: "the partial collective shrinks under eager (solo, majority, "
    "quorum); ",
}


def check_shrink(
    strategy: Any,
    topology: str,
    *,
    local: bool,
    ctx: Context | None = None,
    backend: str = "gloo",
    on_cuda: bool = False,
) -> None:
    """``train --on-rank-loss shrink``'s one-line refusals (module docstring), before any
    process starts: ``topology`` the strategy's, ``local`` a local launch (not torchrun),
    ``backend`` and ``on_cuda`` where the ranks' collectives keep their buffers."""
    option = "--on-rank-loss shrink"
    if topology not in SHRINKS:
        raise UsageError(
            f"{option} is for the allreduce and partial-collective topologies; "
            f"{strategy.describe()!r} runs on {topology}: use --on-rank-loss stop"
        )
    check_gloo_cpu(
        option,
        backend=backend,
        on_cuda=on_cuda,
        fix="drop --backend nccl / --device cuda, or use --on-rank-loss stop",
    )
    if not local:
        raise UsageError(
            f"{option} needs a local launch (--workers N): torchrun's agent stops the job when "
            "any rank dies; use --on-rank-loss stop under torchrun"
        )
    fix = f"{SHRINKS[Topology(topology)]}use --on-rank-loss stop for this one"
    check_follows(strategy, ctx, option, fix)


def check_gloo_cpu(option: str, *, backend: str, on_cuda: bool, fix: str) -> None:
    """Shrinking runs on gloo with CPU tensors only (module docstring): ``backend`` the job's
    process group's, ``on_cuda`` whether the ranks' buffers are on a GPU; ``fix`` what to do."""
    if backend != "gloo" or on_cuda:
        raise UsageError(
            f"{option} forms each new generation's groups with gloo on CPU tensors (no GPU run "
            f"has shown a shrink on nccl or CUDA): {fix}"
        )


def check_follows(strategy: Any, ctx: Context | None, option: str, fix: str) -> None:
    """A rule that cannot follow a world one rank smaller (``Strategy.follow_world``) refuses
    shrinking in one line: ``option`` names what asked for it, ``fix`` what to do instead.
    ``ctx``: the job's context (None: two ranks)."""
    ctx = ctx if ctx is not None else Context(n_workers=2)
    n = max(1, ctx.n_workers - 1)
    smaller = dataclasses.replace(ctx, n_workers=n, live=tuple(range(n)))
    # no plan is asked here: the topology's shape and asking do not matter
    if RuleDriver(strategy, ctx, shape=None, remember=False).followed(smaller) is None:
        raise UsageError(
            f"{option}: {strategy.describe()!r} cannot follow a smaller world: "
            f"{strategy.follow_refusal()}; {fix}"
        )


def check_on_rank_loss(
    on_rank_loss: str,
    strategy: Strategy,
    group: Any,
    comm: Collectives,
    lr: float,
    env: Any = os.environ,
    *,
    rejoining: bool = False,
    deals_again: bool = False,
) -> bool:
    """Whether a user's loop shrinks (``StragglerStep``, ``ShardedStep``, the DDP hook's
    state: ``on_rank_loss``); one-line refusals before any round, on the job's default
    ``group`` only (None). ``rejoining``: a rank started again, in no process group (its
    backend is gloo's); ``deals_again``: a round redone deals the same stream positions on
    demand again (``integrate.demand``; ``ShardedStep``'s groups do not yet)."""
    # torch's modules only here: ``train``'s checks import this module before any rank starts
    import torch.distributed as dist

    from tailtrain.runtime.elastic.shrink import OnRankLoss
    from tailtrain.runtime.elastic.store import LAUNCHED

    if on_rank_loss not in tuple(OnRankLoss):
        raise UsageError(
            f"on_rank_loss must be one of {', '.join(OnRankLoss)}, got {on_rank_loss!r}"
        )
    if on_rank_loss == OnRankLoss.STOP:
        return False
    option = 'on_rank_loss="shrink"'
    if env.get(LAUNCHED) != OnRankLoss.SHRINK:
        raise UsageError(
            f"{option} needs ranks whose death the job survives: start the script with "
            "`tailtrain launch --nproc-per-node N --on-rank-loss shrink script.py` (torchrun "
            "stops every rank when one exits)"
        )
    if group is not None:
        raise UsageError(f"{option} shrinks the job's default group: leave process_group unset")
    check_gloo_cpu(
        option,
        backend="gloo" if rejoining else dist.get_backend(),
        on_cuda=comm.device.type != "cpu",
        fix='dist.init_process_group("gloo") and a model on the CPU, or on_rank_loss="stop"',
    )
    if "demand" in strategy.needs and not deals_again:
        raise UsageError(
            f"{option}: this step does not deal {strategy.describe()!r} again after a shrink "
            "yet; use sync, dropcompute or local-sgd, or StragglerStep for deal=demand"
        )
    if strategy.needs and "demand" not in strategy.needs:
        raise UsageError(
            f"{option}: {strategy.describe()!r} deals per-rank shares the loader draws, and a "
            "round redone after a shrink would need another draw; use sync, dropcompute or "
            "rebalance:deal=demand (its rounds deal positions of a stream)"
        )
    ctx = Context(n_workers=comm.world_size, lr=lr)
    check_follows(strategy, ctx, option, 'use on_rank_loss="stop" for this one')
    return True
