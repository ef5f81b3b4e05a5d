"""The probe's cross-rank aggregation: a window of steps, gathered by every rank alike.

Protocol: each rank keeps its closed steps' marks (``pending``). At a step count every rank
computes alike it issues one all-gather of one small tensor, the window's seconds of data,
compute and wait per step and its samples, between steps and outside any timed section,
without waiting for it (``async_op``); it takes the gather at the next step's close, when it
has long arrived. No other collective. The next gather's step count comes from the window
taken (``window_steps``, in integer microseconds, so no rounding sets two ranks apart), or
``every`` steps; the first window (``warmup + LIVE_MIN_STEPS`` steps) and ``flush``'s are
taken at once. Rank 0 hands each window taken between steps to its report on one thread of
its own (``reporter``), in order, so that its milliseconds of judging make no rank late for
the next reduction; ``_drain`` waits for those reports and ends the thread. docs/probe.md
tells why (what waiting at once cost, and why a cadence in seconds).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from tailtrain.integrate.probe.clocks import CudaClock, HostClock, StepMarks

#: the seconds of a probe's window, per rank and step; a last column holds its samples
SECTIONS = ("data", "compute", "wait")
SAMPLES = len(SECTIONS)  #: the window's column of samples per step (NaN: not known)
LIVE_MIN_STEPS = 8  #: fewer steps to judge (after the warm-up): no verdict yet
INTERVAL = 2.0  #: seconds between the ranks' gathers (and rank 0's reports), by default
MAX_WINDOW = 1000  #: most steps per window (fast steps): bounds the marks held between gathers


def window_steps(window: np.ndarray, interval: float) -> int:
    """Steps until the next gather: ``interval`` over the mean wall seconds of a step in the
    gathered ``window`` (steps x ranks x ``SECTIONS``; a step's wall time is the longest
    over the ranks of data + compute + wait; a samples column after them is not a time), in
    1..``MAX_WINDOW``. Every rank holds the same window after the gather and computes in
    integer microseconds (exact on any machine), so every rank gets the same number: the
    ranks agree on the next gather without communicating."""
    seconds = np.asarray(window, dtype=np.float64)[:, :, : len(SECTIONS)]
    micros = np.rint(seconds * 1e6).astype(np.int64)
    total = int(micros.sum(axis=2).max(axis=1).sum())  # wall microseconds of the window
    target = round(interval * 1e6) * micros.shape[0]
    return max(1, min(MAX_WINDOW, target // total if total > 0 else MAX_WINDOW))


@dataclass
class Flight:
    """A gather on its way: its work (None on one rank), what it sends and where it lands."""

    work: Any
    sent: torch.Tensor
    parts: list[torch.Tensor]
    waited: bool = False  # taken at once (flush, the first gather), not between steps


class Gathering:
    """The gather layer of ``StragglerProbe``: the window's steps, the all-gather in flight,
    the cadence, and the hand-over of each window to rank 0's report (module docstring).

    The probe calls ``_gather`` at the step counts planned (and ``flush``), ``_take`` at the
    next step's close, ``_drain`` where reports must be done; it hands over through
    ``_report_kept`` (``Reporting``), which keeps an error rather than raising it."""

    # the probe's, read here; ``_report_kept`` is ``Reporting``'s
    clock: HostClock | CudaClock
    rank: int
    world: int
    group: dist.ProcessGroup | None
    device: torch.device
    steps: int
    interval: float
    every: int | None
    error: BaseException | None
    _report_kept: Callable[[np.ndarray], None]

    def _init_gathering(self, every: int | None, warmup: int) -> None:
        #: the step count at which the ranks next gather (the same on every rank)
        self.next_gather = every or warmup + LIVE_MIN_STEPS
        self.pending: list[StepMarks] = []  # closed steps of the window, not yet gathered
        self.flight: Flight | None = None  # the gather issued, not yet taken
        self.taken: np.ndarray | None = None  # the window last taken: plans the next gather
        #: rank 0: reports of windows taken between steps, made in order on one thread
        self.reporter: ThreadPoolExecutor | None = None
        self.reports: list[Future[None]] = []

    def _window(self) -> torch.Tensor:
        """(steps, 4): seconds of data, compute and wait of the pending steps, and their
        samples (NaN: not known); sent in the one gather, so no collective is added."""
        self.clock.settle(self.pending[-1].end)
        rows = []
        for s in self.pending:
            total = self.clock.span(s.start, s.end)
            wait = s.waited
            if s.ready is not None and s.synced is not None:
                wait += max(self.clock.span(s.ready, s.synced), 0.0)
            # loading inside the span is host seconds: on CUDA events it overlaps queued GPU
            # work, so only the host clock takes it out of compute
            inner = s.inner if isinstance(self.clock, HostClock) else 0.0
            rows.append((s.data, max(total - wait - inner, 0.0), wait + s.before, s.samples))
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
            self.flight = Flight(work, window, parts)
        else:
            self.flight = Flight(None, window, [window])
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
