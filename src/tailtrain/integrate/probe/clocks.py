"""The probe's marks: the clocks that time a step and the hooks that mark a DDP step.

A step is marked at its start, when this rank's gradients are ready, when the reduction is
done and at its end (``StepMarks``); its wait is ready to done, its compute the rest. The
marks are host seconds (``HostClock``) or, for a CUDA model, CUDA events recorded on the
current stream and read back once per window (``CudaClock``: no synchronisation in a step).

In a DDP job ``DdpWatch`` marks "ready" and "done" from gradient hooks, leaving DDP's
reduction (its built-in allreduce or any comm hook) as it is; the hooks run on autograd's
thread and only read the clock. docs/probe.md tells why the marks sit where they do.
"""

from __future__ import annotations

import math
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

if TYPE_CHECKING:
    from tailtrain.integrate.probe import StragglerProbe


class HostClock:
    """Host seconds: a mark is ``perf_counter``."""

    def mark(self) -> Any:
        return time.perf_counter()

    def settle(self, last: Any) -> None:
        pass

    def span(self, start: Any, end: Any) -> float:
        return end - start


class CudaClock:
    """GPU seconds: a mark is a CUDA event recorded on the current stream, read back at the
    end of a window (one ``synchronize`` per window)."""

    def mark(self) -> Any:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def settle(self, last: Any) -> None:
        last.synchronize()

    def span(self, start: Any, end: Any) -> float:
        return start.elapsed_time(end) / 1e3


@dataclass
class StepMarks:
    """One step's marks: host seconds of data loading, clock marks of its start, of the
    gradients being ready, of the reduction done, of its end; the samples it computed (NaN:
    not known); the seconds blocked in a sharded model's collectives."""

    data: float
    start: Any
    samples: float = math.nan
    ready: Any = None
    synced: Any = None
    end: Any = None
    #: host seconds blocked in a sharded model's own collectives (``fsdp.FsdpWatch``), wait
    #: beside the span from ready to synced
    waited: float = 0.0
    #: DDP forwards under ``no_sync`` (grad enabled) ran in it: its backward only
    #: accumulates, so the step goes on over the next loader batches to the one that reduces
    accumulating: bool = False
    #: an optimizer stepped in it: a loop that runs every forward under ``no_sync`` and
    #: reduces by hand (or not at all: local SGD) ends its step there, reduced or not
    stepped: bool = False
    #: the loader batches it spans (1 but for a step accumulated under ``no_sync``)
    micro_batches: int = 1
    #: host seconds of data loading inside its span (the later batches of an accumulated
    #: step): data, not compute
    inner: float = 0.0
    #: host seconds from the previous step's end to this one's data loading: the loop's
    #: time outside every step (between epochs: ``set_epoch``, an evaluation, the probe's
    #: flush), this rank's wait, never its compute, so that a rank's rows tile its time
    before: float = 0.0


class DdpWatch:
    """The probe's hooks on a DDP model. A forward pre-hook notes whether this backward will
    reduce (DDP's own test: grad enabled and not in ``no_sync``; one under ``no_sync`` marks
    the step accumulating, so the loader's next batch goes on in it). A second forward
    pre-hook, on the wrapped module, ends DDP's own part of the forward: its buffer broadcast
    from rank 0 (``broadcast_buffers``, the default, for any model with buffers) and its
    bucket rebuild are collectives where a rank waits for one that came late (slow outside
    its forward: its data, its optimizer, a sleep), so on host seconds that span is this
    rank's wait (``note_wait``), not its compute. The first backward hooks
    every parameter to learn which gradient is accumulated first and which last, then keeps
    only those two hooks: the last marks "ready"; whichever of them fires first queues a final
    callback that queues another, which marks "synced" once DDP's finalise (queued when its
    last bucket became ready, so before ours) has waited for every bucket.

    It keeps no reference to the DDP model (the forward pre-hook is handed it): the probe
    outlives the loop, and a model it kept would keep DDP's reducer and with it the process
    group alive past ``destroy_process_group``, gloo's threads running into the process's
    exit, where a rank may abort ("terminate called without an active exception")."""

    def __init__(self, probe: StragglerProbe, ddp: torch.nn.parallel.DistributedDataParallel):
        self.probe = probe
        self.params = [p for p in ddp.module.parameters() if p.requires_grad]
        self.reduces = False  # the coming backward reduces (set at each forward)
        self.queued = False  # this backward's end-of-backward callback is queued
        self.order: list[int] | None = []  # first backward: the parameters in grad order
        self.first = self.last = -1
        self.handles = [self._hook(i) for i in range(len(self.params))]
        #: when DDP's forward began (host seconds), until its wrapped module's began
        self.entered: float | None = None
        self.forward_hooks = [
            ddp.register_forward_pre_hook(self._forward),
            # first among the module's pre-hooks: those are the model's forward, not DDP's
            ddp.module.register_forward_pre_hook(self._module_forward, prepend=True),
            # DDP may call the module's forward past its hooks (``_delay_all_reduce_all_params``):
            # a mark left set would charge the time to a later direct call of the module
            ddp.register_forward_hook(self._forward_done),
        ]
        # any optimizer's step ends an accumulating step (``StepMarks.stepped``); the hook
        # is global and holds the probe weakly, so a probe dropped unhooked costs a lookup
        self.stepped = register_optimizer_step_post_hook(_stepped(weakref.ref(probe)))

    def _hook(self, index: int) -> Any:
        return self.params[index].register_post_accumulate_grad_hook(
            lambda _param: self._grad(index)
        )

    def _forward(self, ddp: Any, _inputs: Any) -> None:
        self.reduces = torch.is_grad_enabled() and ddp.require_backward_grad_sync
        if torch.is_grad_enabled() and not ddp.require_backward_grad_sync:
            self.probe._mark_accumulating()  # under ``no_sync``: the step is not over
        self.entered = time.perf_counter()

    def _forward_done(self, _ddp: Any, _inputs: Any, _output: Any) -> None:
        self.entered = None

    def _module_forward(self, _module: Any, _inputs: Any) -> None:
        entered, self.entered = self.entered, None
        # the module called by itself (an evaluation of ``ddp.module``) is no DDP forward;
        # on CUDA events the host runs ahead of the broadcast, which the events time
        if entered is not None and isinstance(self.probe.clock, HostClock):
            self.probe.note_wait(time.perf_counter() - entered)

    def _grad(self, index: int) -> None:
        if self.probe._syncing:  # a hook state's zero backward (``flush_buckets``): no step's
            return  # gradients, inside the sync section that times its round as the wait
        if self.order is not None:
            self.order.append(index)
        if not self.queued:
            self.queued = True
            queue_callback(self._backward_ending)
        if self.reduces and (self.order is not None or index == self.last):
            self.probe._mark_ready()

    def _backward_ending(self) -> None:
        queue_callback(self._backward_ended)  # runs after every callback queued so far

    def _backward_ended(self) -> None:
        self.queued = False
        if self.reduces:
            self.probe._mark_synced()
        if self.order:  # the first backward: keep the first and the last gradient's hooks
            self.first, self.last = self.order[0], self.order[-1]
            self.order = None
            for handle in self.handles:
                handle.remove()
            self.handles = [self._hook(i) for i in {self.first, self.last}]


def _stepped(probe: weakref.ref[StragglerProbe]) -> Callable[..., None]:
    """The optimizer step post-hook of ``DdpWatch``: the probe's open step has stepped."""

    def hook(_optimizer: Any, _args: Any, _kwargs: Any) -> None:
        found = probe()
        if found is not None and found.current is not None:
            found.current.stepped = True

    return hook


def queue_callback(callback: Callable[[], None]) -> None:
    """Run ``callback`` when the current backward ends (autograd's final callbacks, where DDP
    queues its finalise; a private hook of autograd's engine, as FSDP uses it)."""
    torch.autograd.Variable._execution_engine.queue_callback(callback)
