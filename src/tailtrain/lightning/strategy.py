"""DropCompute inside Lightning's automatic optimization: a ``DDPStrategy`` whose micro-batches are
``accumulate_grad_batches``.

    trainer = Trainer(
        accelerator="cpu", devices=2, accumulate_grad_batches=4,
        strategy=StragglerStrategy("dropcompute:threshold=auto", process_group_backend="gloo"),
    )

Lightning owns the iteration over a step's micro-batches, so the round of
``tailtrain.integrate.rounds`` is pushed one micro-batch at a time (``Rounds.open``, ``admit``,
``unit_done``, ``seal``: the same calls its ``units`` generator makes) and the round's end is
``StragglerHookState.reduce``, the plain DDP loop's agreement and weighted reduction:

* ``training_step``: the first micro-batch of a step opens the round; before each, the
  threshold (DropCompute Algorithm 1, between units) decides whether it may start. One it
  forbids is not computed: the strategy returns a zero loss in place of the module's
  ``training_step`` and ``backward`` passes it by (Lightning refuses a ``None`` loss under
  DDP). One it allows runs its forward under ``no_sync``, so its backward only accumulates.
* ``optimizer_step``: Lightning calls the step's last micro-batch inside the optimizer
  closure; the strategy runs that closure first, then the round's end: a zero backward fires
  ``weighted_allreduce_hook`` on every bucket, which reduces ``lr_scale * sum_n w_n G_n``
  (DropCompute Eq. (1)), the first bucket carrying every rank's counts and times, on which
  the rule's weights are then checked; then Lightning's own step (gradient clipping, the
  optimizer), or none when no rank's gradient entered (``StepRecord.empty``). Lightning
  divides each loss by ``accumulate_grad_batches``; the reduction divides it out again, so
  the update is the mean over the counted micro-batches exactly as ``StragglerStep``'s (also
  in a shorter last window of an epoch, where plain DDP would scale the update by its
  fraction of a window).

``DDPStrategy._register_ddp_hooks`` registers a comm hook only on CUDA (a torch 1.8
limitation); this strategy registers tailtrain's hook on every device, gloo included.

``StragglerStrategy("rebalance", shares=[b_0, ..., b_N-1])`` instead deals Lightning's train
loader by fixed per-rank batch shares (``integrate.share_loader``: its ``DistributedSampler``'s
global batches of N B samples, rank n computing b_n of them) and registers
``sample_weighted_hook``, so each update is the global batch's mean gradient; the loop stays
Lightning's own (no round, no threshold).

What cannot run is refused in one line when the strategy is built (in the ``Trainer(...)``
line, before any process starts): rules that average models after local steps
(``local-sgd``), rules of another topology (``k-sync``, ``async``, ...), ``rebalance``
without ``shares`` (its adaptive shares would deal each rank a different number of
micro-batches, and Lightning runs ``accumulate_grad_batches`` on every rank), a comm hook of
the user's own, and a launch that shrinks (``tailtrain launch --on-rank-loss shrink``);
manual optimization is refused at ``fit``, when the module is known.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import numpy as np
import torch
from lightning.pytorch.strategies import DDPStrategy
from lightning.pytorch.trainer.states import TrainerFn
from torch.nn.parallel import DistributedDataParallel

from tailtrain.errors import UsageError
from tailtrain.integrate.ddp import StragglerHookState, weighted_allreduce_hook
from tailtrain.integrate.rounds import RoundProgress, StepRecord
from tailtrain.integrate.share_loader import (
    ShareBatchSampler,
    rebalance_loader,
    sample_weighted_hook,
)
from tailtrain.runtime.elastic.shrink import OnRankLoss
from tailtrain.runtime.elastic.store import LAUNCHED
from tailtrain.strategies.base import AllreducePlan, Strategy
from tailtrain.strategies.entries import LIGHTNING, SHARE_LOADER
from tailtrain.strategies.registry import parse_strategy

#: the checkpoint key holding the rule's state (``StragglerHookState.state_dict``)
CHECKPOINT_KEY = "tailtrain_straggler"
#: DDPStrategy arguments this strategy owns
OWN_HOOK = ("ddp_comm_hook", "ddp_comm_state", "ddp_comm_wrapper", "model_averaging_period")


def checked_rule(spec: str | Strategy, shares: Sequence[int] | None = None) -> Strategy:
    """The rule of ``spec``, or a one-line ``UsageError`` where Lightning's DDP strategy cannot
    run it: with ``shares``, plain ``rebalance`` (``strategies.entries.SHARE_LOADER``);
    without, what tailtrain's comm hook runs (``strategies.entries.LIGHTNING``)."""
    rule = parse_strategy(spec) if isinstance(spec, str) else spec
    if shares is not None:
        refusal = SHARE_LOADER.refusal(rule)
        if refusal is not None:
            raise UsageError(f"shares= deal per-rank batches: {refusal}")
        return rule
    refusal = LIGHTNING.refusal(rule)
    if refusal is not None and "shares" in rule.needs:
        refusal = (
            f"{rule.describe()!r} under Lightning deals fixed per-rank batch shares: give "
            "shares=[b_0, ..., b_N-1] summing to N*batch_size (tailtrain advise computes them)"
        )
    if refusal is not None:
        raise UsageError(refusal)
    return rule


def sigterm_per_step(trainer: Any) -> None:
    """Lightning (2.6) broadcasts rank 0's SIGTERM flag before every batch, a collective that
    holds every rank to the slowest at each micro-batch, so a fast rank would wait out a slow
    one's cut micro-batches and DropCompute could save nothing. Keep the broadcast, once per
    optimizer step (before its first micro-batch): the ranks still stop together, at a step
    boundary. A Lightning without that per-batch broadcast is left as it is."""
    loop = trainer.fit_loop.epoch_loop
    broadcast = getattr(loop, "_broadcast_sigterm_tensor", None)
    if broadcast is None or getattr(broadcast, "per_step", False):
        return

    def at_step_start() -> None:
        if loop.batch_progress.current.ready % trainer.accumulate_grad_batches == 0:
            broadcast()

    at_step_start.per_step = True  # type: ignore[attr-defined]
    loop._broadcast_sigterm_tensor = at_step_start


class StragglerStrategy(DDPStrategy):
    """Lightning's ``DDPStrategy`` running tailtrain's rule ``spec`` over each optimizer step's
    ``accumulate_grad_batches`` micro-batches (module docstring).

    ``spec``: ``"dropcompute:threshold=auto"`` (Algorithm 2's tau after ``calibrate`` steps),
    ``"dropcompute:threshold=0.5"`` (seconds), ``"dropcompute:drop-rate=0.1"``, ``"sync"``, or
    a ``Strategy``. ``log_metrics``: write ``tailtrain/drop_rate``, ``tailtrain/threshold``,
    ``tailtrain/ranks`` (how many entered) and ``tailtrain/completed/<rank>`` (its counted
    micro-batches) to the trainer's loggers every ``log_every_n_steps`` steps. ``keep``: how
    many step records ``records`` holds. ``shares``: with ``spec="rebalance"``, each rank's
    samples per step, summing to N x the loader's ``batch_size`` (``advise`` computes them);
    the train loader is dealt by them (module docstring).
    Every other keyword is ``DDPStrategy``'s (``process_group_backend="gloo"``, ...), except
    the comm hook's, which this strategy sets.
    """

    def __init__(
        self,
        spec: str | Strategy = "dropcompute:threshold=auto",
        *,
        log_metrics: bool = True,
        keep: int = 1000,
        shares: Sequence[int] | None = None,
        **ddp_kwargs: Any,
    ) -> None:
        given = [name for name in OWN_HOOK if ddp_kwargs.get(name) is not None]
        if given:
            raise UsageError(
                f"StragglerStrategy registers tailtrain's weighted comm hook itself: drop "
                f"{', '.join(f'{name}=' for name in given)}"
            )
        if os.environ.get(LAUNCHED) == OnRankLoss.SHRINK:
            raise UsageError(
                "StragglerStrategy does not shrink (Lightning's DDP cannot regroup): launch "
                "without --on-rank-loss shrink, or use tailtrain.StragglerHookState in an own loop"
            )
        self.rule = checked_rule(spec, shares)
        #: ``rebalance``'s samples per step for each rank (None: DropCompute's rounds)
        self.shares = None if shares is None else list(shares)
        #: the train loader's batch sampler under ``shares`` (the hook's state)
        self.dealt: ShareBatchSampler | None = None
        super().__init__(**ddp_kwargs)
        self.log_metrics = log_metrics
        #: the rule, its state and the comm hook's state (built once the group exists)
        self.state: StragglerHookState | None = None
        #: the latest optimizer steps' records, oldest first
        self.records: deque[StepRecord] = deque(maxlen=keep)
        self._restored: dict[str, Any] | None = None
        self._round: tuple[AllreducePlan, RoundProgress] | None = None
        #: the micro-batch in flight: its slot in the round and its start (None: cut)
        self._unit: tuple[int, float] | None = None

    @property
    def on_nonfinite(self) -> str:
        """What the hook does with a non-finite bucket: ``"propagate"`` under a precision
        that scales the loss (``16-mixed``'s ``GradScaler``), so that an overflow reaches the
        scaler, which skips the step on every rank and lowers its scale; else ``"skip"``."""
        scaler = getattr(self.precision_plugin, "scaler", None)
        return "skip" if scaler is None else "propagate"

    @property
    def last(self) -> StepRecord | None:
        """The latest optimizer step's record (None before the first)."""
        return self.records[-1] if self.records else None

    # ---- set-up ---------------------------------------------------------------------------
    def setup_environment(self) -> None:
        super().setup_environment()  # the process group
        if self.shares is None and self.state is None:
            timeout = self._timeout if isinstance(self._timeout, timedelta) else None
            self.state = StragglerHookState(
                self.rule, None, timeout, self.root_device, on_rank_loss=OnRankLoss.STOP,
                on_nonfinite=self.on_nonfinite,
            )  # fmt: skip
        if self._restored is not None and self.state is not None:
            self.state.load_state_dict(self._restored)
            self._restored = None

    def setup(self, trainer: Any) -> None:
        module = self.lightning_module
        if module is not None and not module.automatic_optimization:
            raise UsageError(
                "StragglerStrategy runs inside Lightning's automatic optimization (it reduces "
                "at the optimizer step); with automatic_optimization=False use "
                "tailtrain.StragglerHookState around your manual_backward calls"
            )
        super().setup(trainer)
        if trainer.state.fn == TrainerFn.FITTING:
            sigterm_per_step(trainer)

    def _register_ddp_hooks(self) -> None:
        # DDPStrategy registers hooks on CUDA only (a torch 1.8 limit); gloo runs them today.
        # Under ``shares`` the hook's state is the train loader's sampler: ``process_dataloader``
        assert isinstance(self.model, DistributedDataParallel)
        if self.state is not None:
            self.model.register_comm_hook(self.state, weighted_allreduce_hook)

    def process_dataloader(self, dataloader: Any) -> Any:
        """Under ``shares``: the train loader, its ``DistributedSampler``'s global batches
        dealt by the shares (``rebalance_loader``), and the sample-weighted hook on the DDP
        model, so that each update is the mean gradient over the global batch."""
        dataloader = super().process_dataloader(dataloader)
        if self.shares is None or not self.lightning_module.trainer.training:
            return dataloader
        dealt_loader = rebalance_loader(dataloader, self.shares, on_nonfinite=self.on_nonfinite)
        if self.dealt is None:  # DDP takes one comm hook; a reloaded loader deals the same
            assert isinstance(self.model, DistributedDataParallel)
            assert isinstance(dealt_loader.batch_sampler, ShareBatchSampler)
            self.dealt = dealt_loader.batch_sampler
            self.model.register_comm_hook(self.dealt, sample_weighted_hook)
        return dealt_loader

    # ---- one micro-batch ------------------------------------------------------------------
    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        """The module's ``training_step`` under ``no_sync`` if the threshold lets this
        micro-batch start, else a zero loss that ``backward`` passes by."""
        state = self.state
        if state is None:  # ``shares``: Lightning's own accumulation, the hook weighs
            return super().training_step(*args, **kwargs)
        assert isinstance(self.model, DistributedDataParallel)
        if self._round is None:  # the step's first micro-batch
            work = RoundProgress(np.empty(0))
            plan = state.plan(self.lightning_module.trainer.accumulate_grad_batches)
            state.rounds.open(work)
            self._round = (plan, work)
        plan, work = self._round
        slot = len(work.times)
        work.times = np.append(work.times, np.nan)  # Lightning deals the units one at a time
        if not state.rounds.admit(work, plan):
            self._unit = None
            return torch.zeros((), device=self.root_device)
        self._unit = (slot, state.rounds.clock())
        with self.model.no_sync():  # its backward accumulates; the step's end reduces
            return super().training_step(*args, **kwargs)

    def backward(
        self, closure_loss: torch.Tensor, optimizer: Any, *args: Any, **kwargs: Any
    ) -> torch.Tensor:
        if self.state is None:
            return super().backward(closure_loss, optimizer, *args, **kwargs)
        if self._unit is None:  # a micro-batch the threshold cut: nothing was computed
            return closure_loss
        slot, began = self._unit
        self._unit = None
        loss = super().backward(closure_loss, optimizer, *args, **kwargs)
        assert self._round is not None
        _, work = self._round
        self.state.rounds.unit_done(work, slot, began)  # type: ignore[union-attr]
        accumulate = self.lightning_module.trainer.accumulate_grad_batches
        work.loss_sum += float(closure_loss.detach()) * accumulate  # Lightning divided it
        return loss

    # ---- the step's end -------------------------------------------------------------------
    def optimizer_step(
        self,
        optimizer: Any,
        closure: Callable[[], Any],
        model: Any = None,
        **kwargs: Any,
    ) -> Any:
        """The step's last micro-batch (Lightning's closure), the weighted reduction, then
        Lightning's optimizer step, unless no rank's gradient entered."""
        if self.state is None:
            return super().optimizer_step(optimizer, closure, model, **kwargs)
        result = closure()
        record = self._close()
        if record.empty:  # a zero update would still move momentum and weight decay
            return result
        return super().optimizer_step(optimizer, lambda: result, model, **kwargs)

    def _close(self) -> StepRecord:
        state, trainer = self.state, self.lightning_module.trainer
        assert state is not None and self._round is not None
        plan, work = self._round
        self._round = None
        state.rounds.seal(work)
        record = state.reduce(self.model, plan, work, 1.0 / trainer.accumulate_grad_batches)
        self.records.append(record)
        if self.log_metrics:
            self._log(record)
        return record

    def _log(self, record: StepRecord) -> None:
        """The step's decision to the trainer's loggers every ``log_every_n_steps`` steps
        (rank 0 writes, as Lightning's loggers do). Straight to the loggers: the module's
        ``log`` costs milliseconds per value, several times the reduction's own cost."""
        trainer = self.lightning_module.trainer
        if not trainer.loggers or record.step % max(trainer.log_every_n_steps, 1):
            return
        metrics = {
            "tailtrain/drop_rate": record.drop_rate,
            "tailtrain/threshold": record.threshold,
            "tailtrain/ranks": float(len(record.ranks)),
        }
        for rank, done in zip(record.live, record.completed, strict=True):
            metrics[f"tailtrain/completed/{rank}"] = float(done)
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=trainer.global_step)

    # ---- checkpoints: the rule's state (the learned tau, the step count) ------------------
    def save_checkpoint(
        self,
        checkpoint: dict[str, Any],
        filepath: Any,
        storage_options: Any | None = None,
    ) -> None:
        if self.state is not None:
            checkpoint = {**checkpoint, CHECKPOINT_KEY: self.state.state_dict()}
        super().save_checkpoint(checkpoint, filepath, storage_options)

    def load_checkpoint(self, checkpoint_path: Any, weights_only: bool | None = None) -> Any:
        checkpoint = super().load_checkpoint(checkpoint_path, weights_only)
        saved = checkpoint.get(CHECKPOINT_KEY)
        if saved is not None:
            if self.state is not None:
                self.state.load_state_dict(saved)
            else:  # restored before the process group exists: at ``setup_environment``
                self._restored = saved
        return checkpoint

    def teardown(self) -> None:
        self._round, self._unit = None, None
        super().teardown()
