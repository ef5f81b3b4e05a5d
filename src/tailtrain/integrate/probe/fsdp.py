"""The probe's marks in a sharded (FSDP2) model: the seconds each rank waits in FSDP's own
collectives.

Under DDP a rank waits at one place, the gradient reduction at the end of its backward
(``clocks.DdpWatch``). In a model ``fully_shard``ed over a group of ranks it waits inside
every FSDP unit: the parameters' all-gather before the unit's forward and backward meets the
group's slowest rank, and so do the gradients' reduce-scatter after it and, under HSDP (a 2-D
mesh), the all-reduce across the replica groups. ``FsdpWatch`` times those calls through
FSDP2's public extension points on every FSDP module of the model:

* ``set_custom_all_gather`` / ``set_custom_reduce_scatter``: timed collectives that call
  ``torch.distributed``'s ``all_gather_single`` / ``reduce_scatter_single``, as FSDP's
  defaults do, into buffers from ``torch.empty``; on gloo FSDP calls them synchronously, so
  the seconds inside the call are the seconds this rank was blocked (waiting for the group's
  slowest rank, and the transfer itself, as the DDP probe counts the reduction);
* ``set_all_reduce_hook``: FSDP calls it right after HSDP's all-reduce across the groups (or
  right after the reduce-scatter without one), so its time less the reduce-scatter's end is
  the all-reduce's.

Each blocked second adds to the open step's wait (``StragglerProbe.note_wait``); the rest of
the step is its compute, so a rank that is slow inside its group shows more compute and less wait
than its partners, and the probe's verdicts name it. Nothing is timed outside a step, nor
inside a ``sync()`` section (whose own span is the wait). The watch keeps no reference to
the model. Refused on CUDA (host clocks do not see NCCL's streams, and no run here has
proven an event-based timing): use ``probe.step()`` and ``probe.sync()`` there. The watch
takes FSDP's custom-collective and all-reduce-hook slots; a model that fills them itself
keeps its own only if it is not watched.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule

# the interfaces set_custom_all_gather / set_custom_reduce_scatter take, which torch 2.13
# exports from this module only
from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather, ReduceScatter

from tailtrain.errors import UsageError
from tailtrain.integrate.mesh import replica_groups

if TYPE_CHECKING:
    from tailtrain.integrate.probe import StragglerProbe


class FsdpWatch:
    """The probe's timed collectives on every FSDP module of a model (module docstring)."""

    def __init__(self, probe: StragglerProbe, model: torch.nn.Module) -> None:
        units = [m for m in model.modules() if isinstance(m, FSDPModule)]
        if any(p.device.type == "cuda" for p in model.parameters()):
            raise UsageError(
                "StragglerProbe.watch times FSDP2's collectives on CPU (gloo) only: on CUDA "
                "no run has proven it; use probe.step() and probe.sync() there"
            )
        self.probe = probe
        self.scattered = 0.0  # the clock when the last reduce-scatter returned
        gather, scatter = TimedAllGather(self), TimedReduceScatter(self)
        for unit in units:
            unit.set_custom_all_gather(gather)
            unit.set_custom_reduce_scatter(scatter)
            unit.set_all_reduce_hook(self._reduced)
        #: the replica groups of an HSDP model (its parameters' 2-D mesh); None for FSDP over
        #: one group (the ranks of a ``ShardedStep``'s groups come from its mesh)
        self.groups: list[list[int]] | None = None
        mesh = next((p.device_mesh for p in model.parameters() if hasattr(p, "device_mesh")), None)
        if mesh is not None and mesh.ndim == 2:
            self.groups = replica_groups(mesh, 0)  # FSDP's HSDP replicates along dim 0

    def _reduced(self, _output: torch.Tensor) -> None:
        # FSDP calls this right after HSDP's all-reduce (or right after the reduce-scatter)
        self.probe.note_wait(max(time.perf_counter() - self.scattered, 0.0))


class Timed:
    """A timed collective of the watch's: its buffers as FSDP's default allocates them."""

    def __init__(self, watch: FsdpWatch) -> None:
        self.watch = watch

    def allocate(
        self, size: Sequence[int | torch.SymInt], *, dtype: torch.dtype, device: torch.device
    ) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)


class TimedAllGather(Timed, AllGather):
    """FSDP's all-gather, timed: ``dist.all_gather_single`` (FSDP's default) into a
    ``torch.empty`` buffer (the default allocation)."""

    def __call__(
        self,
        output_tensor: torch.Tensor,
        input_tensor: torch.Tensor,
        group: dist.ProcessGroup,
        async_op: bool = False,
    ) -> Any:
        began = time.perf_counter()
        work = dist.all_gather_single(output_tensor, input_tensor, group=group, async_op=async_op)
        self.watch.probe.note_wait(time.perf_counter() - began)
        return work


class TimedReduceScatter(Timed, ReduceScatter):
    """FSDP's reduce-scatter, timed: ``dist.reduce_scatter_single`` into a ``torch.empty``
    buffer; its end starts the all-reduce's span (``FsdpWatch._reduced``)."""

    def __call__(
        self,
        output_tensor: torch.Tensor,
        input_tensor: torch.Tensor,
        group: dist.ProcessGroup,
        op: Any,
        async_op: bool = False,
    ) -> Any:
        began = time.perf_counter()
        work = dist.reduce_scatter_single(
            output_tensor, input_tensor, op=op, group=group, async_op=async_op
        )
        self.watch.scattered = time.perf_counter()
        self.watch.probe.note_wait(self.watch.scattered - began)
        return work
