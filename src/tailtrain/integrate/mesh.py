"""A hybrid-sharded model's 2-D mesh as tailtrain reads it: the replica groups, the check that
``fully_shard`` put the parameters on the shard dimension alone, each rank's local shards, the
equal start of every group and the replicate group's collectives with one row per group
(``ShardedStep``; the FSDP2 probe names the groups from here).
"""

from __future__ import annotations

import datetime
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from tailtrain.errors import UsageError
from tailtrain.runtime.elastic.group import GroupCollectives
from tailtrain.runtime.reduce import Collectives, RankRow


def check_mesh(mesh: Any, replicate_dim: str) -> str:
    """The shard dimension's name of a 2-D mesh with ``replicate_dim``; one line otherwise."""
    names = getattr(mesh, "mesh_dim_names", None)
    if names is None or len(names) != 2 or replicate_dim not in names:
        raise UsageError(
            "ShardedStep needs mesh=, a 2-D DeviceMesh with named dimensions (replicate x "
            f"shard), one of them {replicate_dim!r}: init_device_mesh(device, (R, S), "
            f'mesh_dim_names=("{replicate_dim}", "shard")), got {mesh!r}'
        )
    return names[1] if names[0] == replicate_dim else names[0]


def replica_groups(mesh: Any, replicate_dim: str | int = 0) -> list[list[int]]:
    """The global ranks of each replica group of a 2-D ``mesh``, in group order: the rows of
    its layout along ``replicate_dim`` (a name, or the index: FSDP's HSDP meshes replicate
    along dim 0)."""
    names = mesh.mesh_dim_names
    dim = names.index(replicate_dim) if isinstance(replicate_dim, str) else replicate_dim
    layout = mesh.mesh.movedim(dim, 0)
    return [[int(r) for r in row.flatten()] for row in layout]


def check_sharded(params: list[torch.Tensor], shard_dim: str) -> None:
    """Every trainable parameter is a DTensor that ``fully_shard`` put on the shard dimension
    alone; one line otherwise (module docstring)."""
    from torch.distributed.tensor import DTensor

    if not params:
        raise UsageError("ShardedStep: the model has no trainable parameters")
    for p in params:
        names = p.device_mesh.mesh_dim_names if isinstance(p, DTensor) else None
        if names != (shard_dim,):
            raise UsageError(
                f"ShardedStep needs the model fully_shard-ed over mesh[{shard_dim!r}] alone "
                f"(fully_shard(module, mesh=mesh[{shard_dim!r}])); found a parameter "
                + ("that is not sharded" if names is None else f"on the mesh dimensions {names}")
                + ": over the 2-D mesh FSDP would average the replicas itself, unweighted"
            )


def local(t: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a DTensor (the same storage), or ``t`` itself."""
    to_local = getattr(t, "to_local", None)
    return t if to_local is None else to_local()


def local_grad(p: torch.Tensor) -> torch.Tensor:
    """This rank's shard of ``p``'s gradient; zeros where it has none (its group computed no
    micro-batch, and joins the reduction with weight 0)."""
    return torch.zeros_like(local(p)) if p.grad is None else local(p.grad)


def start_equal(
    model: nn.Module,
    params: list[torch.Tensor],
    shard_group: dist.ProcessGroup,
    replicate_group: dist.ProcessGroup,
) -> None:
    """Every group starts from group 0's shards (rank (n, s) from rank (0, s)), and every
    rank from rank (0, 0)'s buffers, as DDP starts from rank 0 (FSDP broadcasts nothing)."""
    with torch.no_grad():
        for p in params:
            dist.broadcast(local(p), group=replicate_group, group_src=0)
        for b in model.buffers():
            for group in (shard_group, replicate_group):
                dist.broadcast(local(b), group=group, group_src=0)


class ReplicaCollectives(GroupCollectives):
    """The replicate group's collectives with one row per replica GROUP: ``gather`` first
    reduces this rank's row by MAX over its group (``within``, the shard group), so the rows
    of a group's ranks, and what the rule decides from them, are the same on all of them.
    ``group`` is the mesh's replicate group, or after a shrink a generation's own
    ``ProcessGroupGloo`` that torch.distributed does not know (give ``rank`` and ``size``)."""

    def __init__(
        self,
        within: Collectives,
        group: Any,
        device: torch.device,
        timeout: datetime.timedelta | None = None,
        *,
        rank: int | None = None,
        size: int | None = None,
    ) -> None:
        #: the mesh's group, which torch.distributed knows (on its device: nccl's is a GPU)
        self.registered = rank is None
        rank = dist.get_rank(group) if rank is None else rank
        size = dist.get_world_size(group) if size is None else size
        super().__init__(rank, size, device, group=group, timeout=timeout)
        self.within = within

    def gather(self, row: RankRow) -> np.ndarray:
        row = self.within.reduce_row(row, dist.ReduceOp.MAX)
        if self.registered:  # Collectives' two hops, on the group's device
            return Collectives.gather(self, row)
        return super().gather(row)  # a generation's own gloo group: a block all-reduce

    def barrier(self) -> None:
        if self.registered:  # on the group's device (nccl's is a GPU), as ``gather``
            Collectives.barrier(self)
        else:
            super().barrier()
