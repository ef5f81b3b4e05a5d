"""A straggler probe for an unmodified PyTorch loop: who is slow, measured on every rank.

Two lines in a DDP job (DDP keeps its own allreduce, its overlap and any comm hook; the probe
adds two gradient hooks and two forward pre-hooks)::

    probe = StragglerProbe("runs/probe").watch(ddp)            # after DDP(...)
    for x, y in probe.batches(loader):                         # was: for x, y in loader:
        ...                                                    # the loop, unchanged

and in any other loop ``with probe.step(samples=n):`` around each step and ``with
probe.sync():`` around the collective where ranks wait for each other, ending with
``probe.close()`` on every rank (or ``with StragglerProbe(...) as probe:``); a trainer's
callback, which sees hooks rather than a loop, opens and closes steps with ``begin_step(samples,
data=...)`` and ``end_step()``, timing the data itself (``tailtrain.lightning``,
``tailtrain.hf``). Per rank and
step it measures data (the loader's ``next``), wait (gradients ready to reduction done: a
fast rank waits there for the slow one), compute (the rest) and the samples computed; rank 0
names the slow ranks (persistent / intermittent / healthy) and writes ``trace.csv``, the
trace ``tailtrain advise`` reads. Under DDP a step is one reduction: a loader batch whose
forward ran under ``no_sync`` leaves its step open for the next one, until a backward
reduces or an optimizer steps (a loop that accumulates M batches: one step of M).

Protocol (the ranks; autograd's thread, where the hooks run; rank 0's reporting thread):

* the hooks and ``sync()`` only read the clock (``clocks``); a ``sync()`` inside another is
  part of it, and the DDP hooks mark nothing inside one (a remedy's round runs there);
* at a step count every rank computes alike from the window last taken (``window_steps``),
  or every ``every`` steps, each rank issues one asynchronous all-gather of its window
  between steps and takes it at the next step's close; no other collective (``window``);
* rank 0 reports each window taken between steps on one thread of its own, in order
  (``report``); ``flush`` (the loader's end, ``close``) gathers the rest, waits for the
  reports and raises the first report's error, which changes nothing else (every window is
  still reported and the ranks keep gathering in step); leaving the ``with`` on an exception
  gathers nothing (the other ranks may never reach the gather);
* the probe changes no tensor and holds no model: ``watching`` finds it by a weak table.

The class stands on three layers, each a module: the marks (``clocks``), the gather and its
cadence (``window.Gathering``) and rank 0's report (``report.Reporting``: the verdicts,
``trace.csv``, ``verdicts.jsonl``, TensorBoard), mixed into one object, whose attributes
(``history``, ``last``, ``next_gather``, ...) and steps (``_close_step``, ``_report``, ...)
tests and ``bench/bench_detect.py`` read and wrap.

docs/probe.md tells the whole story: where each mark sits and why, what each remedy's round
shows, the cadence and its cost, the trace's columns and the runs a folder keeps.
"""

from __future__ import annotations

import math
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from tailtrain.integrate.probe.clocks import CudaClock, DdpWatch, HostClock, StepMarks
from tailtrain.integrate.probe.report import (
    TRACE_COLUMNS,
    VERDICT_LEVELS,
    ProbeReport,
    Reporting,
    prepare_trace,
    trace_header,
)
from tailtrain.integrate.probe.window import (
    INTERVAL,
    LIVE_MIN_STEPS,
    MAX_WINDOW,
    SAMPLES,
    SECTIONS,
    Gathering,
    window_steps,
)

__all__ = [
    "INTERVAL",
    "LIVE_MIN_STEPS",
    "MAX_WINDOW",
    "SAMPLES",
    "SECTIONS",
    "TRACE_COLUMNS",
    "VERDICT_LEVELS",
    "ProbeReport",
    "StragglerProbe",
    "batch_samples",
    "prepare_trace",
    "trace_header",
    "watching",
    "window_steps",
]


class StragglerProbe(Gathering, Reporting):
    """Measure every rank's steps and name the slow ranks ([how][inside-the-probe]).

    ``out``: the folder of ``trace.csv`` and ``verdicts.jsonl`` (rank 0 writes, appending a run
    of its own to an earlier one's: [a folder keeps its runs][a-folder-keeps-its-runs]; None:
    write nothing); ``interval``: about the seconds between all-gathers and reports;
    ``every``: steps per all-gather and report instead (None: by ``interval``); ``horizon``:
    the steps a verdict looks back on; ``warmup``: first steps left out of verdicts (DDP's
    first step rebuilds its buckets); ``group``: the process group (None: the default, or the
    watched model's); ``device``: CUDA to time with CUDA events (``watch`` picks it for a CUDA
    model; NCCL then gathers the window there); ``tensorboard``: a folder for the scores (rank
    0); ``on_report``: called on rank 0 with each ``ProbeReport``, in order (on the probe's
    reporting thread, but for the first window's and ``flush``'s); an error it raises is
    logged, and the first one is raised again by ``flush`` / ``close``.

    The last window is gathered by ``flush``: ``batches`` calls it at the loader's end; a loop
    of ``step()`` / ``sync()`` ends with ``close()`` (every rank), or uses the probe as a
    context manager (``with StragglerProbe(...) as probe:``), which closes it on leaving;
    without either, the steps after the last gather are never reported.
    """

    def __init__(
        self,
        out: str | Path | None = None,
        *,
        interval: float = INTERVAL,
        every: int | None = None,
        horizon: int = 200,
        warmup: int = 2,
        group: dist.ProcessGroup | None = None,
        device: torch.device | str | None = None,
        tensorboard: str | Path | None = None,
        on_report: Callable[[ProbeReport], None] | None = None,
    ) -> None:
        if not interval > 0 or (every is not None and every < 1) or horizon < 1 or warmup < 0:
            raise ValueError(
                "StragglerProbe needs interval > 0, every >= 1 (or None), horizon >= 1 and "
                "warmup >= 0"
            )
        self.out = None if out is None else Path(out)
        self.interval, self.every = interval, every
        self.horizon, self.warmup = horizon, warmup
        self.group = group
        self.device = torch.device(device or "cpu")
        self.clock: HostClock | CudaClock = (
            CudaClock() if self.device.type == "cuda" else HostClock()
        )
        self.on_report = on_report
        self.rank = dist.get_rank(group) if dist.is_initialized() else 0
        self.world = dist.get_world_size(group) if dist.is_initialized() else 1
        self.started = time.perf_counter()
        self.steps = 0  # steps closed so far
        self.current: StepMarks | None = None  # the step open, marked so far
        #: when the last step closed (host seconds; None: none yet, or a CUDA clock, whose
        #: marks the host runs ahead of): the next step's ``before``
        self._closed_at: float | None = None
        self._syncing = 0  # depth of ``sync()`` sections: the outermost marks
        #: a sharded job's replica groups (the ranks of each), learnt by ``watch`` from an
        #: HSDP model's mesh or a ``ShardedStep``'s: the reports name a slow rank's group
        self.groups: list[list[int]] | None = None
        #: the remedy the watched hook or step runs (``note_remedy``); None: none seen
        self.remedy: dict[str, Any] | None = None
        #: the most loader batches a step accumulated under DDP's ``no_sync`` (1: none)
        self.accumulates = 1
        self._init_gathering(every, warmup)
        self._init_reporting(self.world, tensorboard)

    # ---- the two lines ---------------------------------------------------------------------
    def watch(self, model: Any) -> StragglerProbe:
        """Time ``model``'s steps: a ``DistributedDataParallel`` model with gradient hooks,
        leaving its reduction as it is (its built-in allreduce or the comm hook you
        registered; a [`StragglerHookState`][tailtrain.StragglerHookState] finds the probe and
        times its round's collectives as the wait); a model ``fully_shard``ed with FSDP2 by
        its own collectives, timed through FSDP's extension points (``probe.fsdp``: CPU
        only); a [`StragglerStep`][tailtrain.StragglerStep] or a
        [`ShardedStep`][tailtrain.ShardedStep] by its own collectives
        ([under a remedy][under-a-remedy]). Watch both a ``ShardedStep`` and its model to see
        the waits inside the group too."""
        from torch.distributed.fsdp import FSDPModule

        from tailtrain.integrate.sharded import ShardedStep
        from tailtrain.integrate.step import StragglerStep  # step.py imports this module

        if isinstance(model, (StragglerStep, ShardedStep)):
            if isinstance(model, ShardedStep):
                self.groups = model.groups
            _WATCHED[model] = self
            return self
        if isinstance(model, FSDPModule):
            from tailtrain.integrate.probe.fsdp import FsdpWatch

            watch = FsdpWatch(self, model)
            self.groups = self.groups or watch.groups
            _WATCHED[model] = self
            return self
        if not isinstance(model, torch.nn.parallel.DistributedDataParallel):
            raise TypeError(
                f"StragglerProbe.watch needs a DistributedDataParallel model, a model "
                f"fully_shard()ed with FSDP2, a StragglerStep or a ShardedStep, got "
                f"{type(model).__name__}; for another loop use probe.step() and probe.sync()"
            )
        if model.device_type == "cuda" and self.device.type != "cuda":
            self.device = torch.device("cuda", torch.cuda.current_device())
            self.clock = CudaClock()
            self._closed_at = None  # host marks: no step's ``before`` on CUDA events
        self._ddp_watch = DdpWatch(self, model)
        _WATCHED[model] = self
        return self

    def batches(self, iterable: Iterable[Any]) -> Iterator[Any]:
        """Yield ``iterable``'s items, one step each (a loop that accumulates under DDP's
        ``no_sync``: one step per reduction, ``end_step``), timing the loader's ``next``; at
        its end the last window is gathered (every rank's loader must end at the same step)."""
        iterator = iter(iterable)
        while True:
            self.end_step()
            began = time.perf_counter()
            try:
                item = next(iterator)
            except StopIteration:
                self.flush()
                return
            self.begin_step(batch_samples(item), data=time.perf_counter() - began)
            yield item

    @contextmanager
    def step(self, samples: int | None = None) -> Iterator[None]:
        """One step, for a loop without a loader to wrap (data loading, between steps, is
        counted as this rank's wait: ``StepMarks.before``); ``samples``: how many this rank
        computes in it (None: not known)."""
        self.begin_step(samples)
        yield
        self.end_step()

    def begin_step(self, samples: int | None = None, *, data: float = 0.0) -> None:
        """Open a step now (closing one still open, or, where that one is accumulating under
        DDP's ``no_sync``, adding this batch to it: ``end_step``): ``step()`` in two calls, for
        a loop whose steps begin and end in different places, as a trainer's callbacks see them
        (``tailtrain.lightning``, ``tailtrain.hf``). ``samples``: how many this rank computes
        in it (None: not known, or told later by ``note_samples``); ``data``: the seconds
        this rank spent getting the step's data just before this call, timed by the caller
        (the step's own marks start here, so they are not its compute; 0: not seen).
        ``batches`` and ``step()`` open their steps with it."""
        current = self.current
        if current is not None and _accumulating(current):
            # a DDP loop accumulating under ``no_sync``: this batch is the step's next
            # micro-batch, its loading data inside the step's span
            current.micro_batches += 1
            current.samples += _or_nan(samples)
            current.data += float(data)
            current.inner += float(data)
            return
        self._close_step(force=True)
        now = time.perf_counter()
        before = 0.0 if self._closed_at is None else max(now - data - self._closed_at, 0.0)
        self.current = StepMarks(float(data), self.clock.mark(), _or_nan(samples), before=before)

    def end_step(self) -> None:
        """Close the step ``begin_step`` opened (nothing when none is open); every rank
        closes the same number of steps, as the gathers count them. A step whose DDP
        forwards ran under ``no_sync`` and that has not reduced yet stays open: the next
        ``begin_step`` adds its batch to it, so a step is one optimizer step of a loop that
        accumulates (``flush`` closes it whatever it holds)."""
        self._close_step()

    @contextmanager
    def sync(self) -> Iterator[None]:
        """The section where this rank waits for the others (its gradients are ready). A
        section inside another is part of it (a ``StragglerStep`` the probe watches opens its
        own inside yours); the DDP gradient hooks mark nothing inside one."""
        outer = self._syncing == 0
        if outer:
            self._mark_ready()
        self._syncing += 1
        try:
            yield
        finally:
            self._syncing -= 1
        if outer:
            self._mark_synced()

    def note_samples(self, samples: int | None) -> None:
        """The samples this rank computed in the current step, in place of the loader's
        batch size (a ``StragglerHookState`` or ``StragglerStep`` the probe watches says how
        many of its micro-batches it computed; None: leave the count as it is)."""
        if self.current is not None and samples is not None:
            self.current.samples = float(samples)

    def note_remedy(self, spec: str, micro_batches: int) -> None:
        """The rule the watched ``StragglerHookState`` or ``StragglerStep`` runs and its
        micro-batches per step: the run's row in ``machine.jsonl`` says so (``remedy``), and
        ``advise`` reads the run as that job, not as one batch a step. The first call of a
        run stands."""
        if self.remedy is None:
            self.remedy = {"spec": spec, "micro_batches": int(micro_batches)}

    def note_accumulation(self, batches: int) -> None:
        """Each step of this run accumulates ``batches`` loader batches: what a trainer's
        callback, which opens one step per optimizer step itself, knows of its loop
        (``accumulate_grad_batches``, ``gradient_accumulation_steps``). The run's row in
        ``machine.jsonl`` says so (``accumulates``), and ``advise`` deals shares of one
        loader batch. A DDP loop wrapped by ``batches`` needs no call: the probe counts its
        ``no_sync`` batches itself."""
        self.accumulates = max(self.accumulates, int(batches))

    def note_wait(self, seconds: float) -> None:
        """Add ``seconds`` this rank spent blocked in a collective to the current step's wait,
        beside its ``sync()`` section: the collectives a sharded model makes inside its
        micro-batches (``probe.fsdp``, ``ShardedStep``'s group lockstep). Nothing outside a
        step, nor inside a ``sync()`` section, whose own span is the wait."""
        if self.current is not None and not self._syncing:
            self.current.waited += seconds

    def flush(self) -> None:
        """Gather the window so far and take it (a collective: every rank calls it at the same
        step); ``batches`` calls it at the loader's end, so the trace and ``last`` are whole.
        Raises the first error of a report since the last flush, once all that is done."""
        self._flush()
        self._raise()

    def close(self) -> None:
        """Flush and close TensorBoard (every rank), then raise the first error of a report."""
        try:
            self._flush()
        finally:
            self._close_board()
            self._unhook()
        self._raise()

    def __enter__(self) -> StragglerProbe:
        return self

    def __exit__(self, kind: type[BaseException] | None, *_: Any) -> None:
        """Close the probe; leaving on an exception, gather nothing (the other ranks may not
        reach the gather, so it could hang) and let that exception through."""
        if kind is None:
            self.close()
            return
        try:
            self._drain()
        finally:
            self._close_board()
            self._unhook()

    def _unhook(self) -> None:
        """Remove the watch's global optimizer hook (``DdpWatch.stepped``) and its forward
        hooks: a closed probe opens no step for them to mark, and the user's model, which
        holds them, need not keep the probe alive."""
        watch = getattr(self, "_ddp_watch", None)
        if watch is not None:
            watch.stepped.remove()
            for handle in watch.forward_hooks:
                handle.remove()

    def _flush(self) -> None:
        self._close_step(force=True)
        if self.flight is not None:
            self._take()
        if self.pending:
            self._gather(wait=True)
        self._drain()

    def _raise(self) -> None:
        """Raise the first failed report's error, once (its traceback is the report's)."""
        error, self.error = self.error, None
        if error is not None:
            raise error

    # ---- marks -----------------------------------------------------------------------------
    def _mark_ready(self) -> None:
        if self.current is not None:
            self.current.ready = self.clock.mark()

    def _mark_synced(self) -> None:
        if self.current is not None:
            self.current.synced = self.clock.mark()

    def _mark_accumulating(self) -> None:
        if self.current is not None and not self._syncing:
            self.current.accumulating = True

    def _close_step(self, force: bool = False) -> None:
        current = self.current
        if current is None or (not force and _accumulating(current)):
            return  # none open, or a step accumulating under ``no_sync`` (``end_step``)
        if current.micro_batches > self.accumulates:  # the job's M, for its machine row
            self.accumulates = current.micro_batches
        current.end = self.clock.mark()
        if isinstance(self.clock, HostClock):
            self._closed_at = current.end
        self.pending.append(current)
        self.current = None
        self.steps += 1
        if self.flight is not None:  # issued at an earlier step's close: done by now
            self._take()
        if self.steps >= self.next_gather:
            self._gather()


#: the probe watching a DDP model or a ``StragglerStep``, for the hook state and the step to
#: find (weak keys: the probe keeps no model alive, and a model dropped frees its entry)
_WATCHED: weakref.WeakKeyDictionary[Any, StragglerProbe] = weakref.WeakKeyDictionary()


def watching(model: Any) -> StragglerProbe | None:
    """The probe that watches ``model`` (a DDP model or a ``StragglerStep``), or None: a
    ``StragglerHookState`` and a ``StragglerStep`` open its ``sync()`` around their round's
    collectives and tell it the samples they computed (docs/probe.md, "Under a remedy")."""
    return _WATCHED.get(model)


def batch_samples(batch: Any) -> int | None:
    """The samples in a batch: the first dimension of the batch if it is a tensor, else of the
    first tensor among a tuple's, a list's or a dict's items (one level: a list of
    micro-batches is no batch of samples); None when there is none (or it is a scalar)."""
    if isinstance(batch, dict):
        batch = list(batch.values())
    if isinstance(batch, (tuple, list)):
        batch = next((item for item in batch if isinstance(item, torch.Tensor)), None)
    if isinstance(batch, torch.Tensor) and batch.dim() > 0:
        return int(batch.shape[0])
    return None


def _accumulating(step: StepMarks) -> bool:
    """Whether ``step`` goes on over the next loader batch: a DDP forward ran in it under
    ``no_sync``, and neither a reduction nor an optimizer step has ended it yet."""
    return step.accumulating and step.synced is None and not step.stepped


def _or_nan(samples: int | None) -> float:
    return math.nan if samples is None else float(samples)
