"""Who is slow in a Lightning job: tailtrain's straggler probe as a ``Trainer`` callback.

One line::

    trainer = Trainer(strategy="ddp", callbacks=[StragglerProbeCallback("runs/probe")])

Per rank and optimizer step the callback has a
[`StragglerProbe`][tailtrain.StragglerProbe] measure the data time, the compute, the wait in
DDP's allreduce and the samples, as the probe does in a loop of one's own: the same marks
(gradient hooks on the model Lightning wrapped in ``DistributedDataParallel``), the same
gather, verdicts and ``trace.csv`` (rank 0 writes; ``tailtrain advise`` reads the folder).
What the callback adds is where a step begins and ends, taken from Lightning's hooks, and
where the verdicts go: each report's scores and verdicts reach the trainer's own loggers and
``trainer.callback_metrics`` (``ProbeReport.metrics`` names them), and ``report`` holds the last
report (rank 0).

* A step spans the ``accumulate_grad_batches`` batches of one optimizer step: it opens at the
  first batch's ``on_train_batch_start`` and closes at the ``on_train_batch_end`` of the batch
  whose optimizer step advanced ``trainer.global_step``.
* Its data time is the host seconds from the previous step's close (or the end of a
  validation run, or the start of training) to its first batch's ``on_train_batch_start``:
  what Lightning does between two batches, which is mostly fetching the next batch (its
  loader's ``next``, ``transfer_batch_to_device``), plus its per-batch bookkeeping (logging,
  the other callbacks' batch-end hooks that run after this one, such as a checkpoint saved
  there, and, on several processes, a one-element broadcast of its SIGTERM flag). The time
  between the batches inside an accumulated step is part of the step's compute, but for
  that broadcast.
* Its wait is the probe's: the last gradient ready to DDP's reduction done, the batches under
  Lightning's ``no_sync`` reducing nothing; and the broadcasts inside the step. Lightning
  synchronises the ranks at every batch (that broadcast), so under
  ``accumulate_grad_batches=k`` a fast rank also waits for a slow one there, at the k - 1
  batches that reduce nothing: the callback times it (the loop's method wrapped for the
  fit), so that wait is its wait too, not its compute (docs/lightning.md).
* Rank 0 reports on the probe's own thread; the callback hands each report to the loggers on
  the training thread, at the next batch end or at the end of training, since a logger need
  not be thread safe.

The probe is made at ``on_fit_start``, in the process that trains, after Lightning has wrapped
the model: the callback holds only its settings until then, so a ``ddp_spawn`` trainer pickles
it to the processes it starts. ``on_train_end`` closes the probe on every rank (the last window
gathered: a collective, reached by every rank); an exception gathers nothing more
(``on_exception``), so a rank that failed leaves no other waiting in a gather.
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import Callback
from torch.nn.parallel import DistributedDataParallel

from tailtrain.integrate.probe import (
    INTERVAL,
    ProbeReport,
    StragglerProbe,
    batch_samples,
)

log = logging.getLogger(__name__)


class StragglerProbeCallback(Callback):
    """Measure every rank's optimizer steps in a Lightning ``Trainer`` and name the slow ranks.

    ``out_dir``: the folder of ``trace.csv`` and ``verdicts.jsonl`` (rank 0 writes; None:
    write nothing); ``interval``, ``every``, ``horizon``, ``warmup`` and ``tensorboard``:
    [`StragglerProbe`][tailtrain.StragglerProbe]'s (the cadence of the reports, the steps a
    verdict looks back on and leaves out at first, a folder for the probe's own TensorBoard
    scalars). ``report``: the last ``ProbeReport`` (rank 0, None before the first); ``probe``:
    the probe while fitting (None before and after). On several processes it measures the
    wait only where Lightning wraps the model in ``DistributedDataParallel`` (``"ddp"``,
    ``"ddp_spawn"``, ``"ddp_fork"``, ``DDPStrategy``); under another strategy its wait is 0
    and it says so once.
    """

    def __init__(
        self,
        out_dir: str | Path | None,
        *,
        interval: float = INTERVAL,
        every: int | None = None,
        horizon: int = 200,
        warmup: int = 2,
        tensorboard: str | Path | None = None,
    ) -> None:
        # the probe's own check, now rather than in the processes the trainer starts
        StragglerProbe(None, interval=interval, every=every, horizon=horizon, warmup=warmup)
        self.out_dir = None if out_dir is None else Path(out_dir)
        self.options: dict[str, Any] = {
            "interval": interval, "every": every, "horizon": horizon, "warmup": warmup,
            "tensorboard": tensorboard,
        }  # fmt: skip
        self.report: ProbeReport | None = None
        self.probe: StragglerProbe | None = None
        self._reports: deque[ProbeReport] = deque()  # rank 0: made, not yet logged
        self._first_step = 0  # ``trainer.global_step`` at training start (a resumed run's)
        self._open_at: int | None = None  # global_step when the open step began; None: none
        self._samples: int | None = None  # the open step's samples so far (None: not known)
        self._since = 0.0  # host seconds when the time before the next step began
        #: the loop whose SIGTERM broadcast is timed, the wrapper, and what it replaced
        self._unwrap: tuple[Any, Any, Any] | None = None

    # ---- the probe's life: fit start to train end ----------------------------------------
    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        model = trainer.strategy.model
        device = pl_module.device if pl_module.device.type == "cuda" else None
        self._reports.clear()
        self.report = None
        probe = StragglerProbe(
            self.out_dir, device=device, on_report=self._reports.append, **self.options
        )
        if isinstance(model, DistributedDataParallel):
            probe.watch(model)
        elif trainer.world_size > 1:
            log.warning(
                "StragglerProbeCallback: %s does not wrap the model in DistributedDataParallel, "
                "so the probe times each rank's steps but not its wait in the reduction",
                type(trainer.strategy).__name__,
            )
        probe.note_accumulation(trainer.accumulate_grad_batches)  # a step is M batches
        self.probe = probe
        self._open_at = None

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Training begins: a resumed run's ``global_step`` is restored by now (after
        ``on_fit_start``), and the sanity check's validation is over."""
        self._first_step = trainer.global_step
        self._time_the_sigterm_broadcast(trainer)
        self._since = time.perf_counter()

    def _time_the_sigterm_broadcast(self, trainer: Trainer) -> None:
        """Lightning (2.6) broadcasts rank 0's SIGTERM flag before every batch: under
        ``accumulate_grad_batches=k`` a fast rank waits there for a slow one at the k - 1
        batches that reduce nothing, inside the step. Timed, that wait is the step's wait, not
        its compute (``StragglerProbe.note_wait``). No callback hook surrounds it, so the
        loop's method is wrapped (as ``StragglerStrategy`` wraps it) until the fit ends; the
        broadcast before a step's first batch is no step's, and stays in its data time."""
        loop = trainer.fit_loop.epoch_loop
        broadcast = getattr(loop, "_broadcast_sigterm_tensor", None)
        if broadcast is None or trainer.world_size < 2:
            return

        def timed() -> None:
            began = time.perf_counter()
            try:
                broadcast()
            finally:
                probe = self.probe
                if probe is not None and probe.current is not None:
                    probe.note_wait(time.perf_counter() - began)

        owned = "_broadcast_sigterm_tensor" in vars(loop)
        loop._broadcast_sigterm_tensor = timed
        self._unwrap = (loop, timed, broadcast if owned else None)

    def _restore_the_sigterm_broadcast(self) -> None:
        """Put back what :meth:`_time_the_sigterm_broadcast` wrapped, unless something else
        has wrapped it since (a strategy's own, which then keeps calling ours: harmless)."""
        if self._unwrap is None:
            return
        (loop, timed, before), self._unwrap = self._unwrap, None
        if vars(loop).get("_broadcast_sigterm_tensor") is not timed:
            return
        if before is None:
            del loop._broadcast_sigterm_tensor  # the class's method again
        else:
            loop._broadcast_sigterm_tensor = before

    def on_train_batch_start(
        self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self.probe is None:
            return
        samples = batch_samples(batch)
        if self._open_at is None:
            self.probe.begin_step(samples, data=time.perf_counter() - self._since)
            self._open_at, self._samples = trainer.global_step, samples
        elif self._samples is not None:  # a later batch of an accumulated step
            self._samples = None if samples is None else self._samples + samples

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any,
        batch_idx: int,
    ) -> None:  # fmt: skip
        probe = self.probe
        if probe is None or self._open_at is None or trainer.global_step == self._open_at:
            self._publish(trainer)
            return  # no optimizer step yet: the step goes on over the next batch
        if probe.current is not None:
            # the step's samples, over its batches (NaN as soon as one batch's is unknown)
            probe.current.samples = math.nan if self._samples is None else float(self._samples)
        probe.end_step()  # may gather: every rank steps its optimizer at the same batch
        self._open_at = None
        self._since = time.perf_counter()
        self._publish(trainer)

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """A validation run between steps is no step's data time."""
        self._since = time.perf_counter()

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Close the probe on every rank: the last window is gathered and reported."""
        self._restore_the_sigterm_broadcast()
        probe, self.probe = self.probe, None
        if probe is None:
            return
        try:
            probe.close()
        finally:
            _unwatch(probe)
            self._publish(trainer)

    def on_exception(
        self, trainer: Trainer, pl_module: LightningModule, exception: BaseException
    ) -> None:
        """Leave the probe as its ``with`` does on an exception: no gather (the other ranks may
        never reach it), the reporting thread ended and TensorBoard closed."""
        self._leave(exception)

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        """A fit that ended without ``on_train_end`` (nothing to train) leaves no thread."""
        self._leave(None)

    def _leave(self, exception: BaseException | None) -> None:
        self._restore_the_sigterm_broadcast()
        probe, self.probe = self.probe, None
        if probe is None:
            return
        try:  # never the probe's ``close``: a gather that another rank may not reach
            kind = RuntimeError if exception is None else type(exception)
            probe.__exit__(kind, exception, None)
        finally:
            _unwatch(probe)

    # ---- the reports, to the trainer's loggers (rank 0, the training thread) --------------
    def _publish(self, trainer: Trainer) -> None:
        while self._reports:
            report = self._reports.popleft()
            self.report = report
            metrics = report.metrics()
            step = self._first_step + report.step
            for logger in trainer.loggers:
                logger.log_metrics(metrics, step=step)
            trainer.callback_metrics.update(
                {name: torch.tensor(value) for name, value in metrics.items()}
            )

    def __getstate__(self) -> dict[str, Any]:
        """The settings and the last report; a probe is never pickled (``ddp_spawn`` pickles
        the callback before the fit, with none)."""
        state = dict(self.__dict__)
        state["probe"], state["_reports"], state["_unwrap"] = None, deque(), None
        return state


def _unwatch(probe: StragglerProbe) -> None:
    """Take the probe's gradient hooks off the LightningModule's parameters: Lightning drops
    its DDP wrapper after the fit, but the module (and a later fit of it) keeps them."""
    watch = getattr(probe, "_ddp_watch", None)
    if watch is not None:
        for handle in watch.handles:
            handle.remove()
        watch.handles = []
