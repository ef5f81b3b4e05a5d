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
runs; ``integrate.StragglerStep`` asks :func:`check_gloo_cpu` and :func:`check_follows` with its own
option's name (``integrate.step.check_on_rank_loss`` adds what only a user's loop can get
wrong: the launcher, the process group, per-rank shares).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from tailtrain.errors import UsageError
from tailtrain.runtime.control import RuleDriver
from tailtrain.strategies.base import Context, Topology

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
