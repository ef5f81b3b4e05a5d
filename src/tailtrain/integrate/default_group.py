"""The default process group of a rank that ``tailtrain launch --restart-lost`` started again
(issue 37 item 6): ``tailtrain.init_process_group`` in place of ``dist.init_process_group``.

A rank started again cannot join the job's group (it is broken, and joining it again hangs),
yet a script's unchanged lines need a default group: ``DistributedSampler(dataset)`` asks
``dist.get_rank()`` and ``dist.get_world_size()``, and ``DistributedDataParallel(model)``
checks the parameters' shapes and broadcasts rank 0's state over it. So
:func:`init_process_group` is ``dist.init_process_group`` in every rank of the job, and in a
rank started again (``TAILTRAIN_RESTART``, ``runtime.elastic.store``) it sets up a
:class:`StandIn` default group instead: the job's rank numbers and nominal world size
(``RANK``, ``WORLD_SIZE``), so the sampler deals this rank the shard it had, and a dead rank's
shard is simply not computed while it is out.

The stand-in holds no peers. Its ``allgather`` gives this rank's tensor in every slot and its
``broadcast`` keeps this rank's (what a group of equal ranks gives: DDP's shape check passes,
and its broadcast of rank 0's state is replaced by the heal, which hands over a live peer's
model and optimizer: ``StragglerHookState.heal``); ``barrier`` returns at once;
``all_reduce`` raises one line (:data:`REFUSED`), and the others torch's error for a group
without a backend. The loop's collectives go through the elastic layer's live generation,
never the default group, which after a shrink is broken on every survivor too.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as dist
from torch.futures import Future

from tailtrain.runtime.elastic.store import RESTART

#: the stand-in's backend name (``dist.get_backend()`` in a rank started again)
BACKEND = "tailtrain-standin"
#: what a collective the stand-in cannot answer raises (torch's own error for the others)
REFUSED = (
    "{} on the default group of a rank `tailtrain launch --restart-lost` started again: it "
    "holds no peers (tailtrain.init_process_group); the loop's collectives run over the live "
    "ranks (StragglerHookState.heal)"
)


class Done(dist._Work):
    """A collective that completed as it was called (the stand-in's)."""

    def __init__(self, result: Any) -> None:
        super().__init__()
        self.result = result

    def wait(self, timeout: Any = None) -> bool:
        return True

    def get_future(self) -> Future:
        future: Future = Future()
        future.set_result(self.result)
        return future


class StandIn(dist.ProcessGroup):
    """The default group of a rank started again (module docstring)."""

    def getBackendName(self) -> str:
        return BACKEND

    def allgather(
        self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any = None
    ) -> Done:
        for slots, mine in zip(outputs, inputs, strict=True):
            for slot in slots:
                slot.copy_(mine)
        return Done(outputs)

    def broadcast(self, tensors: list[torch.Tensor], opts: Any = None) -> Done:
        return Done(tensors)

    def barrier(self, opts: Any = None) -> Done:
        return Done(None)

    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> Done:
        raise RuntimeError(REFUSED.format("all_reduce"))


def _create(store: dist.Store, rank: int, size: int, timeout: Any) -> StandIn:
    return StandIn(rank, size)


def init_process_group(backend: str | None = None, **kwargs: Any) -> None:
    """``dist.init_process_group(backend, **kwargs)``; in a rank started again by
    ``tailtrain launch --restart-lost``, the stand-in default group of the job's ``RANK`` and
    ``WORLD_SIZE`` (module docstring), which its ``StragglerHookState.heal`` joins the live
    ranks from."""
    if RESTART not in os.environ:
        dist.init_process_group(backend, **kwargs)
        return
    if BACKEND not in dist.Backend.backend_list:
        dist.Backend.register_backend(BACKEND, _create, devices=["cpu"])
    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    # a store of its own: the stand-in meets nobody
    dist.init_process_group(BACKEND, store=dist.HashStore(), rank=rank, world_size=size)
