"""``StragglerProbeCallback``: tailtrain's straggler probe inside ``transformers.Trainer``.

The Trainer runs the loop; its callbacks see each optimizer step begin (``on_step_begin``,
after the step's micro-batches are fetched) and end (``on_step_end``, after the optimizer),
and that is the probe's step (``StragglerProbe.begin_step`` / ``end_step``), gradient
accumulation included. What the probe measures there, per rank and step:

* **data**: from the Trainer's last event before the step (the previous step's end, a log,
  an evaluation, a checkpoint, an epoch's start) to its ``on_step_begin``: the Trainer's
  ``get_batch_samples``, which fetches all the step's micro-batches (and, where the loss is
  averaged over tokens across ranks, gathers their count);
* **wait** and **compute**: the probe's own DDP marks (``StragglerProbe.watch``). The
  callback is handed the Trainer's unwrapped model (``kwargs["model"]`` is
  ``trainer.model``; the ``DistributedDataParallel`` Accelerate wraps it in is
  ``trainer.model_wrapped``, which no callback is given), so at ``on_train_begin`` it
  registers a global forward pre-hook (``torch.nn.modules.module.
  register_module_forward_pre_hook``, the profiling hook torch offers) that takes the first
  DDP module whose module holds that model, has the probe watch it and removes itself: a
  step's first forward, at most, passes through it. The watch's own pre-hook arms from the
  DDP's second forward on, so the first step (in the warm-up) shows no wait. No DDP found
  by the first step's end (one process, FSDP, DeepSpeed): the hook goes, a warning says so,
  and the wait stays part of compute. On CUDA (``args.device``) the probe times with CUDA
  events from the first step on (the watch, made at a forward, would switch clocks within
  a step);
* **samples**: the first dimension of the first tensor among the inputs of each training
  forward of the model in the step (``batch_samples``: ``input_ids`` for a Trainer's
  batch dict), ``per_device_train_batch_size`` for a forward whose inputs hold none.

Rank 0 writes ``trace.csv`` and ``verdicts.jsonl`` (the probe's) and logs each report's
numbers (``ProbeReport.metrics``) through the Trainer's ``log``, so they reach its reporters
(TensorBoard, W&B, ...) and ``trainer.state.log_history``. No callback is handed the
Trainer, and the reporters are callbacks before this one (``Trainer(callbacks=...)``
appends after them), so only ``trainer.log`` reaches them: given ``trainer=``, the callback
calls it; without, it appends the same numbers to ``state.log_history`` (and so to
``trainer_state.json``), which no reporter reads. Reports arrive on the probe's reporting
thread; they are logged on the training thread at the next step's end. At the last step
(``control.should_training_stop``, set by the Trainer's flow callback at ``max_steps``) the
probe gathers its last window, so the last report is logged before the Trainer's final log;
``on_train_end`` closes the probe (every rank).
"""

from __future__ import annotations

import inspect
import logging
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from tailtrain.integrate.probe import ProbeReport, StragglerProbe, batch_samples

log = logging.getLogger("tailtrain.hf")


class StragglerProbeCallback(TrainerCallback):
    """Measure every rank's optimizer steps in a ``transformers.Trainer`` run and name the
    slow ranks, as [`StragglerProbe`][tailtrain.StragglerProbe] does in a loop of one's own.

    ``out_dir``: the folder of ``trace.csv`` and ``verdicts.jsonl`` (rank 0 writes; the
    folder ``tailtrain advise`` reads); ``trainer``: the Trainer, whose ``log`` then carries
    each report's numbers to its reporters (without it they go to ``state.log_history``
    only: the module docstring says why); ``probe_kwargs``: ``StragglerProbe``'s options
    (``interval``, ``every``, ``horizon``, ``warmup``, ``tensorboard``, ``on_report``...).
    ``probe``: the probe of the current or last ``train()`` (``probe.last``: its last
    ``ProbeReport``); each ``train()`` starts one, appending a run to the folder's trace."""

    def __init__(
        self, out_dir: str | Path | None, *, trainer: Any = None, **probe_kwargs: Any
    ) -> None:
        inspect.signature(StragglerProbe).bind(out_dir, **probe_kwargs)  # a misspelt option
        self.out_dir = out_dir
        self.trainer = trainer
        self.probe_kwargs = probe_kwargs
        self.probe: StragglerProbe | None = None
        self._reports: deque[ProbeReport] = deque()  # rank 0: reported, not yet logged
        self._between = 0.0  # the Trainer's last event before a step (perf_counter)
        self._in_step = False
        self._samples = 0.0  # this step's samples so far
        self._batch = 1  # per_device_train_batch_size: a forward's samples where none show
        self._finder: Any = None  # the global forward pre-hook looking for the DDP model
        self._counter: Any = None  # the model's forward pre-hook counting samples

    # ---- the Trainer's events ------------------------------------------------------------
    def on_train_begin(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        model: torch.nn.Module | None = None,
        **kwargs: Any,
    ) -> None:
        assert model is not None  # the Trainer hands every callback its model
        options = {**self.probe_kwargs, "on_report": self._on_report}
        if args.device.type == "cuda":  # CUDA events from the first step's start on
            options.setdefault("device", args.device)
        self.probe = StragglerProbe(self.out_dir, **options)
        self.probe.note_accumulation(args.gradient_accumulation_steps)  # a step is M batches
        self._reports.clear()
        self._batch = args.per_device_train_batch_size
        self._counter = model.register_forward_pre_hook(self._count, with_kwargs=True)
        if dist.is_initialized() and dist.get_world_size() > 1:
            self._finder = torch.nn.modules.module.register_module_forward_pre_hook(
                self._finding(model)
            )
        self._mark()

    def on_step_begin(self, args: TrainingArguments, state: TrainerState,
                      control: TrainerControl, **kwargs: Any) -> None:  # fmt: skip
        assert self.probe is not None
        self._samples, self._in_step = 0.0, True
        self.probe.begin_step(data=time.perf_counter() - self._between)

    def on_step_end(self, args: TrainingArguments, state: TrainerState,
                    control: TrainerControl, **kwargs: Any) -> None:  # fmt: skip
        assert self.probe is not None
        self._in_step = False
        self.probe.note_samples(self._samples or None)
        self.probe.end_step()
        if self._finder is not None:  # the first step's forwards passed no DDP model
            self._finder.remove()
            self._finder = None
            log.warning(
                "StragglerProbeCallback: the Trainer's model runs in no DistributedDataParallel "
                "(one process, FSDP or DeepSpeed): each rank's wait stays part of its compute"
            )
        if control.should_training_stop:  # the last step: its report before the final log
            self.probe.flush()
        self._log_reports(state, control)
        self._mark()

    def on_log(self, *_: Any, **__: Any) -> None:
        self._mark()

    def on_evaluate(self, *_: Any, **__: Any) -> None:
        self._mark()

    def on_save(self, *_: Any, **__: Any) -> None:
        self._mark()

    def on_epoch_begin(self, *_: Any, **__: Any) -> None:
        self._mark()

    def on_train_end(self, args: TrainingArguments, state: TrainerState,
                     control: TrainerControl, **kwargs: Any) -> None:  # fmt: skip
        for handle in (self._finder, self._counter):
            if handle is not None:
                handle.remove()
        self._finder = self._counter = None
        if self.probe is not None:
            try:
                self.probe.close()
            finally:
                self._log_reports(state, control)

    # ---- the marks between the events ----------------------------------------------------
    def _mark(self) -> None:
        self._between = time.perf_counter()

    def _count(self, module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        """A forward of the Trainer's model: count its samples if it trains in a step."""
        if self._in_step and module.training and torch.is_grad_enabled():
            seen = batch_samples(args)
            seen = batch_samples(kwargs) if seen is None else seen
            self._samples += self._batch if seen is None else seen

    def _finding(self, model: torch.nn.Module) -> Callable[[torch.nn.Module, tuple], None]:
        """The global pre-hook: the first DDP module holding ``model`` is watched."""

        def find(module: torch.nn.Module, _inputs: tuple) -> None:
            if not isinstance(module, DistributedDataParallel) or self.probe is None:
                return
            if any(inner is model for inner in module.module.modules()):
                self.probe.watch(module)
                if self._finder is not None:
                    self._finder.remove()
                    self._finder = None

        return find

    # ---- rank 0's reports ----------------------------------------------------------------
    def _on_report(self, report: ProbeReport) -> None:
        """On the probe's reporting thread: the user's ``on_report``, then queue the report
        for the training thread to log (``Trainer.log`` runs the callbacks: not from here)."""
        user = self.probe_kwargs.get("on_report")
        if user is not None:
            user(report)
        self._reports.append(report)

    def _log_reports(self, state: TrainerState, control: TrainerControl) -> None:
        """Log the reports queued (rank 0). ``Trainer.log`` clears ``control.should_log``
        (its callback handler's ``on_log`` does): kept cleared, this step's own log of the
        Trainer would be skipped on rank 0 alone, and with it the loss's all-gather the
        other ranks make there, leaving the ranks' collectives out of step (gloo: "Received
        data size doesn't match expected size"), so it is put back."""
        while self._reports:
            logs = self._reports.popleft().metrics()
            if self.trainer is None:
                state.log_history.append({**logs, "step": state.global_step})
                continue
            should_log = control.should_log
            self.trainer.log(logs)
            control.should_log = should_log
