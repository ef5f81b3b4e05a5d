"""A straggler probe for an unmodified PyTorch loop: who is slow, measured on every rank.

Two lines in a DDP job (DDP keeps its own C++ allreduce and its overlap, and any comm hook you
registered: the probe adds no comm hook, only two gradient hooks and a forward pre-hook)::

    probe = StragglerProbe("runs/probe").watch(ddp)            # after DDP(...)
    for x, y in probe.batches(loader):                         # was: for x, y in loader:
        ...                                                    # the loop, unchanged

and in any other loop, ``with probe.sync():`` around the collective that makes ranks wait for
each other (an allreduce), or ``with probe.step(samples=n):`` in place of ``probe.batches``
when there is no loader to wrap. Such a loop ends with ``probe.close()`` (on
every rank), or runs inside ``with StragglerProbe(...) as probe:``, which closes it: the last
window is gathered only then (``batches`` gathers it at the loader's end by itself)::

    with StragglerProbe("runs/probe", every=10) as probe:
        for x, y in pairs:
            with probe.step():
                ...                                            # forward, backward
                with probe.sync():
                    ...                                        # the allreduce

Per rank and step it measures, on the host clock (``time.perf_counter``) or, for a CUDA model,
with CUDA events read back once per window (no synchronisation in a step):

* **data**: the seconds inside the loader's ``next`` (where the loader is wrapped);
* **wait**: from the moment this rank's gradients are all ready (DDP: the gradient produced
  last has been accumulated; any loop: entering ``sync()``) until the reduction is done (DDP:
  the end of ``backward()``, after DDP's reducer has waited for every bucket and written the
  gradients back; leaving ``sync()``). A fast rank waits there for the slow one;
* **compute**: the rest of the step (forward, backward up to its last gradient, the
  optimizer). The last gradient, not the first bucket, ends it: while the first bucket
  reduces, backward is still computing the others, and a rank slow only in backward must show
  in its compute;
* **samples**: the samples the rank computed: the batch's first dimension where the loader is
  wrapped (:func:`batch_samples`: the batch if it is a tensor, else the first tensor of its
  tuple, list or dict), ``probe.step(samples=n)`` otherwise, or what a remedy says it
  computed (:meth:`StragglerProbe.note_samples`, below); unknown when none of these tells.

**Under a remedy** the probe keeps seeing (``tests/integrate/test_probe_remedy.py``: the fast
rank's wait is the injected skew within 10% under each of these):

* DDP's built-in allreduce, or a comm hook in Python that reduces in DDP's backward (torch's
  ``allreduce_hook``, ``sample_weighted_hook`` behind ``rebalance_loader``): the gradient hooks
  below, as they are; the per-rank batches ``rebalance_loader`` deals are the samples.
* :class:`~tailtrain.integrate.StragglerHookState` with ``weighted_allreduce_hook``: its
  micro-batches run under ``no_sync`` (no wait there) and its round's collectives after them
  (the agreement's gather, where the fast rank waits, the zero backward that fires the hook,
  the closing gather). ``watch(ddp)`` enters the model in a weak table (:func:`watching`), where
  the hook state finds the probe and runs those collectives inside ``probe.sync()``: they are
  the wait, the micro-batches the compute, and the gradient hooks mark nothing inside a sync
  section, so the zero backward is not taken for the step's gradients being ready. The hook
  state tells the probe the samples of the micro-batches computed (a cut one never is).
* :class:`~tailtrain.integrate.StragglerStep`: ``probe.watch(step)``, and each call runs its
  round's collectives (gather, weighted allreduce, gather) inside ``probe.sync()`` and tells
  the samples it computed, likewise. A ``sync()`` inside another is part of the outer one, so a
  ``with probe.sync():`` of yours around a call does not shift the marks (it does make the
  whole call a wait: leave it out).

In a DDP job the first backward learns which parameter's gradient comes first and which last
(hooks on every parameter, then only those two kept): the last one's
``register_post_accumulate_grad_hook`` marks "ready", the first one's queues the end-of-backward
mark on autograd's final callbacks (queued from a final callback, so it runs after DDP's reducer
finalises). A comm hook in Python instead (as the probe first did) made DDP call back into
Python on gloo's thread for every bucket, which cost about 3% of a step on a loaded machine
(``bench/bench_detect.py --only overhead`` at commit 1b9c0bd). Micro-batches under ``no_sync()``
reduce nothing: all their time is compute. A step whose last-learned gradient was not produced
(``find_unused_parameters``, a branch not taken) shows no wait (its wait counts as compute).

About every ``interval`` seconds (default :data:`INTERVAL`) the ranks all-gather those four
numbers of the window's steps: one all-gather of one small tensor, issued between steps outside
any timed section without waiting for it (``async_op``), and taken at the next step's close,
when it has long arrived; no other collective. Waiting for it at once made every rank sit
through its round trips, which on six ranks sharing one loaded core cost 2-3% of a 100 ms step
at a gather every 13 steps (interleaved blocks as in ``bench/bench_detect.py --only overhead``,
at a load of 14-18), where the probe's own CPU time is about 0.15% of a step. When to gather
next is a number of steps every rank computes alike from the window last taken
(:func:`window_steps`: the interval over the window's mean step, in integer microseconds, so no
rounding can set two ranks apart), hence the ranks agree without a word more; the first window
is the steps a first verdict needs (``warmup`` + :data:`LIVE_MIN_STEPS`), taken at once. A
cadence in seconds, not steps, keeps the cost and the verdict's delay alike for 1 ms steps and
for 10 s steps. ``every=K`` gathers every K steps instead (reports at known steps, as tests
want).

Rank 0 reports a window taken between steps on a thread of its own (one, in order; ``flush``
waits for it), so that its milliseconds of judging do not make it, and every rank waiting for
it, late for the next reduction: it appends the window to ``trace.csv``
(``iteration,worker,seconds,noncompute[,samples],run``, the format ``trace:path=`` and
``tailtrain advise`` read, written by ``delays.trace.write_trace_rows``: seconds = data +
compute; noncompute = the wait, which is the rank's step less its seconds, the meaning ``train``
gives it, so a replay's T^c, the least noncompute of a step, is the slowest rank's wait and max
seconds + T^c the step; ``samples`` when every step of the run's first window knew them, a later
step that did not is written as 0, with a warning; ``run`` the run's number), judges the last
``horizon`` steps (``tailtrain.persistence``, the rule ``advise`` applies to a trace: score,
persistent / intermittent / healthy; no verdict before :data:`LIVE_MIN_STEPS` steps; seconds per
sample when the ranks computed different samples, ``persistence.per_sample_times``, so a slow
rank dealt a smaller share stays persistent), logs the verdicts through ``logging`` (logger
``tailtrain.probe``), appends them to ``verdicts.jsonl`` (each line with its ``run``) and, with
``tensorboard=``, logs the scores. A folder keeps its runs: a probe that finds an earlier run's
``trace.csv`` appends its rows as run last + 1 (rank 0 decides at its first write,
:func:`prepare_trace`, which rewrites an earlier probe's trace without a ``run`` column once, as
run 0, and moves a trace of other columns aside whole), so ``advise`` on the folder compares the
job before and after a remedy. The probe changes no tensor: its hooks only read the clock. A
report that fails (``on_report`` raising, a full disk) is logged at once and changes nothing
else: every window still enters ``history`` (rank 0 keeps the last ``horizon`` steps, all a
verdict reads; ``reported`` counts them all) and ``trace.csv``, and the ranks keep gathering in
step (rank 0 raising between steps would skip a gather the others issue); the first such error
is raised again by ``flush`` or ``close``, after the last window is taken, the reporting thread
ended and TensorBoard closed.
"""

from __future__ import annotations

import csv
import json
import logging
import math
import os
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from tailtrain.delays.trace import read_trace, write_trace_rows
from tailtrain.errors import UsageError
from tailtrain.persistence import Slowness, classify_workers, per_sample_times

log = logging.getLogger("tailtrain.probe")

#: the seconds of a probe's window, per rank and step; a last column holds its samples
SECTIONS = ("data", "compute", "wait")
SAMPLES = len(SECTIONS)  #: the window's column of samples per step (NaN: not known)
#: what a probe trace's rows hold (:func:`trace_header`; ``samples`` where they are known)
TRACE_COLUMNS = ("iteration", "worker", "seconds", "noncompute", "samples", "run")
LIVE_MIN_STEPS = 8  #: fewer steps to judge (after the warm-up): no verdict yet
INTERVAL = 2.0  #: seconds between the ranks' gathers (and rank 0's reports), by default
MAX_WINDOW = 1000  #: most steps per window (fast steps): bounds the marks held between gathers


def window_steps(window: np.ndarray, interval: float) -> int:
    """Steps until the next gather: ``interval`` over the mean wall seconds of a step in the
    gathered ``window`` (steps x ranks x :data:`SECTIONS`; a step's wall time is the longest
    over the ranks of data + compute + wait; a samples column after them is not a time), in
    1..:data:`MAX_WINDOW`. Every rank holds the same window after the gather and computes in
    integer microseconds (exact on any machine), so every rank gets the same number: the
    ranks agree on the next gather without communicating."""
    seconds = np.asarray(window, dtype=np.float64)[:, :, : len(SECTIONS)]
    micros = np.rint(seconds * 1e6).astype(np.int64)
    total = int(micros.sum(axis=2).max(axis=1).sum())  # wall microseconds of the window
    target = round(interval * 1e6) * micros.shape[0]
    return max(1, min(MAX_WINDOW, target // total if total > 0 else MAX_WINDOW))


@dataclass(frozen=True)
class ProbeReport:
    """Rank 0's view after a window: per-rank verdicts over the last steps, and the medians
    of each section (seconds per step, ranks in order). ``per_sample``: the verdicts judged
    seconds per sample (the ranks computed different samples per step:
    ``persistence.per_sample_times``), so their ``median_seconds`` is per sample; ``run``:
    the run's number in the folder's ``trace.csv`` (None: no folder)."""

    step: int  # steps gathered so far
    elapsed: float  # wall seconds since the probe started
    verdicts: list[Slowness]  # ``worker`` is the rank
    sections: dict[str, list[float]] = field(default_factory=dict)
    per_sample: bool = False
    run: int | None = None

    def named(self) -> dict[int, str]:
        """The ranks that are not healthy, and their verdicts."""
        return {v.worker: v.verdict for v in self.verdicts if v.verdict != "healthy"}

    def as_dict(self) -> dict[str, Any]:
        return {
            "run": self.run,
            "step": self.step,
            "elapsed": self.elapsed,
            "sections": self.sections,
            "per_sample": self.per_sample,
            "ranks": [v.as_dict() for v in self.verdicts],
        }


class _HostClock:
    """Host seconds: a mark is ``perf_counter``."""

    def mark(self) -> Any:
        return time.perf_counter()

    def settle(self, last: Any) -> None:
        pass

    def span(self, start: Any, end: Any) -> float:
        return end - start


class _CudaClock:
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
class _Flight:
    """A gather on its way: its work (None on one rank), what it sends and where it lands."""

    work: Any
    sent: torch.Tensor
    parts: list[torch.Tensor]
    waited: bool = False  # taken at once (flush, the first gather), not between steps


@dataclass
class _Step:
    """One step's marks: host seconds of data loading, clock marks of its start, of the
    gradients being ready, of the reduction done, of its end; the samples it computed (NaN:
    not known)."""

    data: float
    start: Any
    samples: float = math.nan
    ready: Any = None
    synced: Any = None
    end: Any = None


class StragglerProbe:
    """Measure every rank's steps and name the slow ranks (see the module docstring).

    ``out``: the folder of ``trace.csv`` and ``verdicts.jsonl`` (rank 0 writes, appending a run
    of its own to an earlier one's: module docstring; None: write nothing); ``interval``: about
    the seconds between all-gathers and reports; ``every``: steps per all-gather and report
    instead (None: by ``interval``); ``horizon``: the steps a verdict looks back on; ``warmup``:
    first steps left out of verdicts (DDP's first step rebuilds its buckets); ``group``: the
    process group (None: the default, or the watched model's); ``device``: CUDA to time with
    CUDA events (``watch`` picks it for a CUDA model; NCCL then gathers the window there);
    ``tensorboard``: a folder for the scores (rank 0); ``on_report``: called on rank 0 with each
    :class:`ProbeReport`, in order (on the probe's reporting thread, but for the first window's
    and ``flush``'s); an error it raises is logged, and the first one is raised again by
    ``flush`` / ``close``.

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
        self.clock: _HostClock | _CudaClock = (
            _CudaClock() if self.device.type == "cuda" else _HostClock()
        )
        self.on_report = on_report
        self.rank = dist.get_rank(group) if dist.is_initialized() else 0
        self.world = dist.get_world_size(group) if dist.is_initialized() else 1
        self.started = time.perf_counter()
        self.steps = 0  # steps closed so far
        #: the step count at which the ranks next gather (the same on every rank)
        self.next_gather = every or warmup + LIVE_MIN_STEPS
        self.pending: list[_Step] = []  # closed steps of the window, not yet gathered
        self.flight: _Flight | None = None  # the gather issued, not yet taken
        self.taken: np.ndarray | None = None  # the window last taken: plans the next gather
        #: rank 0: reports of windows taken between steps, made in order on one thread
        self.reporter: ThreadPoolExecutor | None = None
        self.reports: list[Future[None]] = []
        self.error: BaseException | None = None  # rank 0: the first report that failed
        self.current: _Step | None = None
        #: rank 0: the last ``horizon`` steps (steps x ranks x sections), all a verdict reads:
        #: kept whole, a long run's history would grow without bound and be copied at every
        #: report (``trace.csv`` has every step)
        self.history = np.empty((0, self.world, len(SECTIONS) + 1))
        self.reported = 0  # rank 0: steps reported so far
        self.last: ProbeReport | None = None
        #: rank 0: this run's number in ``trace.csv`` and whether its rows have ``samples``,
        #: both decided at the first write (:func:`prepare_trace`)
        self.run: int | None = None
        self.with_samples = False
        self._unknown_noted = False  # rank 0: a step without samples in a run with them, logged
        self._syncing = 0  # depth of ``sync()`` sections: the outermost marks
        self.board = self._board(tensorboard) if self.rank == 0 else None
        if self.out is not None and self.rank == 0:
            self.out.mkdir(parents=True, exist_ok=True)

    # ---- the two lines ---------------------------------------------------------------------
    def watch(self, model: Any) -> StragglerProbe:
        """Time ``model``'s steps: a ``DistributedDataParallel`` model with gradient hooks,
        leaving its reduction as it is (its built-in allreduce or the comm hook you
        registered; a :class:`~tailtrain.integrate.StragglerHookState` finds the probe and
        times its round's collectives as the wait); a
        :class:`~tailtrain.integrate.StragglerStep` by its own collectives (module
        docstring)."""
        from tailtrain.integrate.step import StragglerStep  # step.py imports this module

        if isinstance(model, StragglerStep):
            _WATCHED[model] = self
            return self
        if not isinstance(model, torch.nn.parallel.DistributedDataParallel):
            raise TypeError(
                f"StragglerProbe.watch needs a DistributedDataParallel model or a "
                f"StragglerStep, got {type(model).__name__}; for another loop use probe.step() "
                "and probe.sync()"
            )
        if model.device_type == "cuda" and self.device.type != "cuda":
            self.device = torch.device("cuda", torch.cuda.current_device())
            self.clock = _CudaClock()
        self._ddp_watch = _DdpWatch(self, model)
        _WATCHED[model] = self
        return self

    def batches(self, iterable: Iterable[Any]) -> Iterator[Any]:
        """Yield ``iterable``'s items, one step each, timing the loader's ``next``; at its end
        the last window is gathered (every rank's loader must end at the same step)."""
        iterator = iter(iterable)
        while True:
            self._close_step()
            began = time.perf_counter()
            try:
                item = next(iterator)
            except StopIteration:
                self.flush()
                return
            loaded = time.perf_counter() - began
            self.current = _Step(loaded, self.clock.mark(), _or_nan(batch_samples(item)))
            yield item

    @contextmanager
    def step(self, samples: int | None = None) -> Iterator[None]:
        """One step, for a loop without a loader to wrap (data loading is not seen);
        ``samples``: how many this rank computes in it (None: not known)."""
        self._close_step()
        self.current = _Step(0.0, self.clock.mark(), _or_nan(samples))
        yield
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

    def _flush(self) -> None:
        self._close_step()
        if self.flight is not None:
            self._take()
        if self.pending:
            self._gather(wait=True)
        self._drain()

    def _close_board(self) -> None:
        if self.board is not None:
            self.board.close()
            self.board = None

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

    def _close_step(self) -> None:
        if self.current is None:
            return
        self.current.end = self.clock.mark()
        self.pending.append(self.current)
        self.current = None
        self.steps += 1
        if self.flight is not None:  # issued at an earlier step's close: done by now
            self._take()
        if self.steps >= self.next_gather:
            self._gather()

    def _window(self) -> torch.Tensor:
        """(steps, 4): seconds of data, compute and wait of the pending steps, and their
        samples (NaN: not known); sent in the one gather, so no collective is added."""
        self.clock.settle(self.pending[-1].end)
        rows = []
        for s in self.pending:
            total = self.clock.span(s.start, s.end)
            wait = 0.0
            if s.ready is not None and s.synced is not None:
                wait = max(self.clock.span(s.ready, s.synced), 0.0)
            rows.append((s.data, max(total - wait, 0.0), wait, s.samples))
        self.pending = []
        return torch.tensor(rows, dtype=torch.float64)

    def _wire(self) -> torch.device:
        """Where the window travels: the GPU for NCCL, which gathers nothing else; the host
        for gloo, even when CUDA events time the steps."""
        nccl = self.world > 1 and dist.get_backend(self.group) == "nccl"
        return self.device if nccl else torch.device("cpu")

    def _gather(self, wait: bool = False) -> None:
        """Issue the all-gather of the window without waiting for it (``wait``: take it at
        once, as the first gather and ``flush`` do), and plan the next one."""
        window = self._window().to(self._wire())
        if self.world > 1:
            parts = [torch.empty_like(window) for _ in range(self.world)]
            work = dist.all_gather(parts, window, group=self.group, async_op=True)
            self.flight = _Flight(work, window, parts)
        else:
            self.flight = _Flight(None, window, [window])
        if wait or self.taken is None:
            self.flight.waited = True
            self._take()
        # every rank plans from the same window, taken at the same step: no extra collective
        self.next_gather = self.steps + (self.every or window_steps(self.taken, self.interval))

    def _take(self) -> None:
        """Wait for the gather in flight (long done, but for ``flush`` and the first) and hand
        its window to rank 0's report: made on the reporting thread when taken between steps
        (rank 0 would be late for the next step's reduction by the report's milliseconds, and
        every rank with it), at once by ``flush`` and the first gather."""
        flight, self.flight = self.flight, None
        if flight.work is not None:
            flight.work.wait()
        self.taken = torch.stack(flight.parts, dim=1).cpu().numpy()
        if self.rank != 0:
            return
        if flight.waited:
            self._drain()
            self._report_kept(self.taken)
            return
        self.reports = [f for f in self.reports if not f.done()]
        self.reporter = self.reporter or ThreadPoolExecutor(1, "tailtrain-probe")
        self.reports.append(self.reporter.submit(self._report_kept, self.taken))

    def _drain(self) -> None:
        """Wait for rank 0's reports so far and end the thread (``_report_kept`` keeps their
        errors: none raises here)."""
        reports, self.reports = self.reports, []
        try:
            for report in reports:
                error = report.exception()  # waits; None but for what _report_kept lets by
                if error is not None and self.error is None:
                    self.error = error
        finally:
            if self.reporter is not None:
                self.reporter.shutdown()
                self.reporter = None

    # ---- rank 0 ----------------------------------------------------------------------------
    def _report_kept(self, window: np.ndarray) -> None:
        """``_report``, its error logged and the first one kept for ``flush`` / ``close``:
        raised between steps, it would come at a later gather than the one that failed, drop
        that window and, caught by the loop, leave rank 0 one gather behind the others."""
        try:
            self._report(window)
        except Exception as error:
            log.error("probe: the report at step %d failed: %r", self.reported, error)
            log.debug("probe: the failed report's traceback", exc_info=error)
            if self.error is None:
                self.error = error

    def _report(self, window: np.ndarray) -> None:
        first, self.reported = self.reported, self.reported + window.shape[0]
        self.history = np.concatenate([self.history, window])[-self.horizon :]
        if self.out is not None:
            self._write_trace(first, window)
        # the last ``horizon`` steps after the warm-up, by step count (history[0] is step
        # reported - len(history))
        kept_from = self.reported - self.history.shape[0]
        recent = self.history[max(self.warmup, self.reported - self.horizon) - kept_from :]
        # seconds per sample where the ranks computed different samples (after rebalance
        # deals a slow rank less, its seconds per step no longer show it slow)
        own, per_sample = per_sample_times(recent[:, :, 0] + recent[:, :, 1], recent[:, :, SAMPLES])
        sections = {name: np.median(recent[:, :, i], axis=0).tolist()
                    for i, name in enumerate(SECTIONS)}  # fmt: skip
        enough = own.shape[0] >= LIVE_MIN_STEPS and own.shape[1] >= 2
        verdicts = classify_workers(own) if enough else []
        elapsed = time.perf_counter() - self.started
        report = ProbeReport(self.reported, elapsed, verdicts, sections, per_sample, self.run)
        self.last = report
        self._log(report)
        if self.on_report is not None:
            self.on_report(report)

    def _write_trace(self, first: int, window: np.ndarray) -> None:
        """Append the window's rows ``iteration,worker,seconds,noncompute[,samples],run``:
        seconds = data + compute, noncompute = the wait (the step's wall seconds on that
        rank less its seconds, as ``train`` writes it). The run's first write decides its
        number and whether it has ``samples`` (every step of its first window known), and
        makes room for it in the folder (:func:`prepare_trace`)."""
        assert self.out is not None
        samples = window[:, :, SAMPLES]
        if self.run is None:
            self.with_samples = not np.isnan(samples).any()
            self.run = prepare_trace(self.out, self.with_samples)
        if self.with_samples and np.isnan(samples).any():
            if not self._unknown_noted:
                log.warning(
                    "probe: some steps after step %d have no sample count (probe.step() without "
                    "samples=, or a batch without a tensor); trace.csv has 0 samples for them",
                    first,
                )
                self._unknown_noted = True
            samples = np.nan_to_num(samples, nan=0.0)
        steps, ranks, _ = window.shape
        step, rank = np.meshgrid(first + np.arange(steps), np.arange(ranks), indexing="ij")
        columns = [step, rank, window[:, :, 0] + window[:, :, 1], window[:, :, 2]]
        columns += [samples] * self.with_samples + [np.full((steps, ranks), self.run)]
        table = np.column_stack([c.ravel() for c in columns])
        write_trace_rows(
            self.out / "trace.csv", table, per_micro_batch=False, append=True,
            noncompute=True, samples=self.with_samples, run=True,
        )  # fmt: skip

    def _log(self, report: ProbeReport) -> None:
        if not report.verdicts:
            return
        wait = report.sections["wait"]
        unit = "sample" if report.per_sample else "step"
        for v in report.verdicts:
            if v.verdict != "healthy":
                log.warning(
                    "probe step %d: rank %d %s, score %.2f (%.2fx the others' median own time, "
                    "slower in %.0f%% of steps; own %.3g ms per %s, wait %.1f ms per step; "
                    "stalled %d steps in a row)",
                    report.step, v.worker, v.verdict, v.score, v.slowdown, 100 * v.slower_share,
                    1e3 * v.median_seconds, unit, 1e3 * wait[v.worker], v.longest_stall,
                )  # fmt: skip
        healthy = [v for v in report.verdicts if v.verdict == "healthy"]
        if healthy:
            log.info(
                "probe step %d: %d rank(s) healthy, scores %.2f..%.2f",
                report.step, len(healthy), min(v.score for v in healthy),
                max(v.score for v in healthy),
            )  # fmt: skip
        if self.out is not None:
            with (self.out / "verdicts.jsonl").open("a") as handle:
                handle.write(json.dumps(report.as_dict()) + "\n")
        if self.board is not None:
            scalars = {f"probe/score/rank{v.worker}": v.score for v in report.verdicts}
            scalars |= {f"probe/wait_s/rank{r}": w for r, w in enumerate(wait)}
            self.board.add_scalars(scalars, report.step, time.time())

    @staticmethod
    def _board(folder: str | Path | None) -> Any:
        if folder is None:
            return None
        from tailtrain.tensorboard import TensorBoardLog  # optional dependency, on demand

        return TensorBoardLog(Path(folder))


class _DdpWatch:
    """The probe's hooks on a DDP model. A forward pre-hook notes whether this backward will
    reduce (DDP's own test: grad enabled and not in ``no_sync``). The first backward hooks
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
        ddp.register_forward_pre_hook(self._forward)

    def _hook(self, index: int) -> Any:
        return self.params[index].register_post_accumulate_grad_hook(
            lambda _param: self._grad(index)
        )

    def _forward(self, ddp: Any, _inputs: Any) -> None:
        self.reduces = torch.is_grad_enabled() and ddp.require_backward_grad_sync

    def _grad(self, index: int) -> None:
        if self.probe._syncing:  # a hook state's zero backward (``flush_buckets``): no step's
            return  # gradients, inside the sync section that times its round as the wait
        if self.order is not None:
            self.order.append(index)
        if not self.queued:
            self.queued = True
            _queue_callback(self._backward_ending)
        if self.reduces and (self.order is not None or index == self.last):
            self.probe._mark_ready()

    def _backward_ending(self) -> None:
        _queue_callback(self._backward_ended)  # runs after every callback queued so far

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


def _queue_callback(callback: Callable[[], None]) -> None:
    """Run ``callback`` when the current backward ends (autograd's final callbacks, where DDP
    queues its finalise; a private hook of autograd's engine, as FSDP uses it)."""
    torch.autograd.Variable._execution_engine.queue_callback(callback)


#: the probe watching a DDP model or a ``StragglerStep``, for the hook state and the step to
#: find (weak keys: the probe keeps no model alive, and a model dropped frees its entry)
_WATCHED: weakref.WeakKeyDictionary[Any, StragglerProbe] = weakref.WeakKeyDictionary()


def watching(model: Any) -> StragglerProbe | None:
    """The probe that watches ``model`` (a DDP model or a ``StragglerStep``), or None: a
    ``StragglerHookState`` and a ``StragglerStep`` open its ``sync()`` around their round's
    collectives and tell it the samples they computed (module docstring)."""
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


def _or_nan(samples: int | None) -> float:
    return math.nan if samples is None else float(samples)


def trace_header(samples: bool) -> list[str]:
    """A probe trace's columns: :data:`TRACE_COLUMNS`, ``samples`` only where known."""
    return [c for c in TRACE_COLUMNS if samples or c != "samples"]


def prepare_trace(out: Path, samples: bool) -> int:
    """Make room in ``out`` for a run's rows and return its number (rank 0, at its first
    write): one more than the last run of ``trace.csv`` and ``verdicts.jsonl`` (a file or
    line without a ``run`` holds run 0), 0 in an empty folder. ``trace.csv`` is kept:

    * with this run's columns (:func:`trace_header`): the rows are appended;
    * lacking only ``run`` or ``noncompute`` (an earlier probe's): rewritten once with run 0
      and noncompute NaN (the format's "not recorded"), to a temporary file then
      ``os.replace``, so a crash leaves the old file or the new, whole;
    * other columns (a ``train`` trace with ``micro_batch``; ``samples`` in one run and not in
      the other, which no row can be given unseen) or unreadable: moved aside whole, to the
      first free ``trace.N.csv``, with a warning naming it."""
    path = out / "trace.csv"
    runs = [_last_verdict_run(out / "verdicts.jsonl")]
    header = trace_header(samples)
    if path.exists():
        try:
            found, old = read_trace(path), _header(path)
        except UsageError:
            found, old = None, []
        missing, extra = {*header} - {*old}, {*old} - {*header}
        if found is not None and old == header:
            runs.append(found.runs[-1])
        elif found is not None and not extra and missing <= {"run", "noncompute"}:
            _rewrite(path, found, samples)
            runs.append(found.runs[-1])
        else:
            moved = next(out / f"trace.{n}.csv" for n in range(1, 10**6)
                         if not (out / f"trace.{n}.csv").exists())  # fmt: skip
            os.replace(path, moved)
            log.warning(
                "probe: %s has columns %s, not a probe run's %s: moved it to %s (kept whole)",
                path, ",".join(old) or "(unreadable)", ",".join(header), moved,
            )  # fmt: skip
    known = [r for r in runs if r is not None]
    return max(known) + 1 if known else 0


def _header(path: Path) -> list[str]:
    with path.open(newline="") as handle:
        return [name.strip() for name in next(csv.reader(handle), [])]


def _rewrite(path: Path, found: Any, samples: bool) -> None:
    """``path`` again with run 0 and noncompute NaN where it had none (atomically)."""
    rows = found.seconds.size
    noncompute = found.noncompute if found.noncompute is not None else np.full(rows, np.nan)
    run = found.run if found.run is not None else np.zeros(rows)
    columns = [found.iteration, found.worker, found.seconds, noncompute]
    columns += [found.samples] * samples + [run]
    temporary = path.with_name(f".{path.name}.tmp")
    write_trace_rows(
        temporary, np.column_stack(columns), per_micro_batch=False, noncompute=True,
        samples=samples, run=True,
    )  # fmt: skip
    os.replace(temporary, path)


def _last_verdict_run(path: Path) -> int | None:
    """The run of ``verdicts.jsonl``'s last readable line (0 for a line without one), or
    None without any."""
    if not path.exists():
        return None
    last = None
    for line in path.read_text(errors="replace").splitlines():
        try:
            last = int(json.loads(line).get("run") or 0)
        except (ValueError, AttributeError, TypeError):
            continue  # a line cut short by a crash
    return last
