"""``RebalancedTrainer``: rebalance by per-rank batch shares inside ``transformers.Trainer``.

    trainer = RebalancedTrainer(model=model, args=args, train_dataset=data, shares=[14, 2])

A persistently slow rank holds every synchronous step; ``rebalance`` keeps the global batch of
N B samples (B = ``per_device_train_batch_size``) and deals rank n b_n of them, sum b_n = N B
(``tailtrain.integrate.share_loader``, whose rule this reuses, not restates). The Trainer
keeps its loop; the subclass changes three of its documented extension points:

* ``get_train_dataloader``: the Trainer's own loader (its collator, its pruned columns, its
  workers) is rebuilt over a ``DistributedSampler`` of the Trainer's seed (``data_seed``, else
  ``seed``) and order (``train_sampling_strategy`` ``random`` or ``sequential``), dealt by
  ``rebalance_loader`` and prepared by Accelerate, which wraps a batch sampler in its
  ``BatchSamplerShard``: that would deal every other dealt batch to each rank and drop each
  batch that is not B long, so the wrapper is made a passthrough (``passthrough``), as the
  Trainer itself does for its ``BatchRebalanceSampler``. A micro-batch of the Trainer is then
  this rank's share of one global batch; ``gradient_accumulation_steps`` of them make an
  optimizer step of M N B samples, as before. ``len()`` is ``len(dataset) // (N B)`` on every
  rank (the remainder is left out, ``dataloader_drop_last`` or not), and the epoch reaches
  the ``DistributedSampler`` through Accelerate's ``set_epoch``.
* ``training_step``: before the first micro-batch, ``sample_weighted_hook`` is registered
  (once) on the ``DistributedDataParallel`` model Accelerate made, the dealt loader's batch
  sampler as its state: the step's gradient is then sum_n (b_n / N B) g_n, g_n rank n's.
  The micro-batches before the last run under ``no_sync``, so the hook weighs the whole
  accumulated gradient. The loss it returns (what the Trainer logs, averaged over the ranks)
  is weighed by b_n / B, so that the logged loss is the global batch's mean too.
* ``compute_loss``: the hook's weights give the global batch's mean gradient where g_n is the
  mean over rank n's own batch. That is the Trainer's loss when it normalises per rank: a
  model's mean loss divided by the micro-batches of the step, or a loss over
  ``num_items_in_batch`` counted on this rank (``average_tokens_across_devices=False``; the
  ranks' item means are then weighed by samples, the global item mean only where every
  sample has as many items).
  With ``average_tokens_across_devices=True`` (the default, for a model that takes
  ``num_items_in_batch`` or a ``compute_loss_func``) the Trainer instead divides by the items
  counted over every rank and multiplies by N, DDP's mean then giving the global item mean;
  there the training loss is multiplied by B / b_n, which turns the hook's b_n / N B back into
  DDP's 1 / N: the update is the plain Trainer's global item mean, exactly.
  That path is taken only where the model says its loss takes ``num_items_in_batch``
  (``accepts_loss_kwargs = True``) or a ``compute_loss_func`` is given: the Trainer also
  guesses it from any ``**kwargs`` in the forward, which every transformers model has, though
  a sequence classifier's loss is a plain mean that ignores the count (the Trainer then
  scales that mean by N M); on such a guess the subclass passes no count, so each rank's loss
  is its own mean (a causal LM's: its micro-batch's token mean) and the update the samples'
  weighted mean. Declare ``model.accepts_loss_kwargs = True`` for the exact item mean.

Refused in one line when the Trainer is built (``setup_refusal``): shares of the wrong length
or sum (``checked_shares``), a run that is not plain DDP or one process (DeepSpeed, FSDP,
tensor, context or sequence parallelism, ``DataParallel`` over several GPUs), an
``IterableDataset``, a ``train_sampling_strategy`` that batches by length, Accelerate's
``split_batches`` or ``dispatch_batches``, and ``auto_find_batch_size`` (the shares sum to
N B). A loss the model sums over its batch cannot be seen; it would be weighed twice.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from accelerate.utils import DistributedType
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, IterableDataset
from transformers import Trainer
from transformers.trainer_utils import unwrap_peft_model

from tailtrain.errors import UsageError
from tailtrain.integrate.share_loader import (
    CARRIED,
    ShareBatchSampler,
    checked_shares,
    rebalance_loader,
    sample_weighted_hook,
)

#: ``train_sampling_strategy`` -> whether the epoch's order is shuffled; the others batch by
#: length, which dealing a permutation would undo
ORDERS = {"random": True, "sequential": False}


def setup_refusal(trainer: Trainer) -> str | None:
    """Why ``trainer`` cannot deal its training batches by shares, in one line, or None."""
    args, accelerator = trainer.args, trainer.accelerator
    kind = accelerator.distributed_type
    ddp = kind == DistributedType.NO or kind.value.startswith("MULTI_")
    parallel = trainer.get_tp_size() * trainer.get_cp_size() * trainer.get_sp_size()
    sharded = getattr(trainer, "is_distributed_loading_by_transformers", False)  # FSDP2 at load
    dataset = trainer.train_dataset  # None: given later, checked by rebalance_loader then
    unindexed = dataset is not None and (
        isinstance(dataset, IterableDataset) or not hasattr(dataset, "__len__")
    )
    why = [
        (args.n_gpu > 1, f"this process drives {args.n_gpu} GPUs with DataParallel: launch "
                         "one process per GPU (torchrun)"),
        (not ddp or parallel > 1 or sharded,
         f"this run is {kind.value} (model-parallel size {parallel}): the shares' hook weighs "
         "plain DDP's reduction only (no DeepSpeed, FSDP, tensor/context/sequence parallelism)"),
        (unindexed,
         "the train_dataset has no indices to deal (an IterableDataset): give a map-style one"),
        (args.train_sampling_strategy not in ORDERS,
         f"train_sampling_strategy={args.train_sampling_strategy!r} batches by length, which "
         "the deal would undo: use 'random' or 'sequential'"),
        (accelerator.split_batches or accelerator.dispatch_batches,
         "Accelerate would split or dispatch the dealt batches: leave accelerator_config's "
         "split_batches and dispatch_batches off"),
        (args.auto_find_batch_size,
         "the shares sum to N*per_device_train_batch_size, which auto_find_batch_size would "
         "change: set the batch size"),
    ]  # fmt: skip
    return next((f"RebalancedTrainer: {reason}" for refused, reason in why if refused), None)


def passthrough(loader: DataLoader, dealt: ShareBatchSampler) -> None:
    """Make the ``BatchSamplerShard`` that ``accelerator.prepare`` wrapped around ``dealt``
    pass its batches through: one process (so it deals nothing again), no batch size (so a
    share of b_n != B is not dropped as a short batch), and the ``DistributedSampler`` as its
    ``sampler``, so that Accelerate's ``set_epoch`` also reaches it through the
    ``SkipBatchSampler`` of a resumed epoch. One process: ``prepare`` wrapped nothing."""
    shard = getattr(loader, "batch_sampler", None)
    if shard is dealt:
        return
    if getattr(shard, "batch_sampler", None) is not dealt:
        raise UsageError(
            f"RebalancedTrainer: Accelerate prepared the dealt loader as {type(shard).__name__}, "
            "not a BatchSamplerShard around it: leave dispatch_batches off"
        )
    shard.num_processes, shard.process_index, shard.batch_size = 1, 0, None
    shard.sampler = dealt.sampler


def declares_loss_kwargs(model: nn.Module) -> bool:
    """Whether ``model`` (or the model a PEFT wrapper holds) says itself whether its loss takes
    ``num_items_in_batch`` (``accepts_loss_kwargs``, which the Trainer reads, as here, before it
    guesses from the forward's signature)."""
    return hasattr(unwrap_peft_model(model), "accepts_loss_kwargs")


class RebalancedTrainer(Trainer):
    """``transformers.Trainer`` whose every rank computes its share of each global batch, the
    update staying the global batch's mean gradient (module docstring).

    ``shares``: samples per micro-batch for each rank, each >= 1, summing to N x
    ``per_device_train_batch_size`` (``tailtrain advise --for hf`` computes them); every other
    argument is ``Trainer``'s. ``dealt``: the first train loader's batch sampler, the hook's
    state (its ``screened`` counts this rank's buckets left out as non-finite)."""

    def __init__(self, *args: Any, shares: Sequence[int], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        world, batch = self.args.world_size, self.args.per_device_train_batch_size
        self.shares = checked_shares(shares, world, batch)
        refusal = setup_refusal(self)
        if refusal is not None:
            raise UsageError(refusal)
        #: this rank's share over an even one, b_n / B
        self.weight = self.shares[self.args.process_index] / batch
        if self.model_accepts_loss_kwargs and not declares_loss_kwargs(self.model):
            # the Trainer guessed from a ``**kwargs`` forward that the loss divides by
            # num_items_in_batch; a BERT classifier's mean loss does not, and the B / b_n below
            # would then weigh every rank alike: its own mean loss is what the hook weighs right
            self.model_accepts_loss_kwargs = False
        self.dealt: ShareBatchSampler | None = None
        self._hooked: DistributedDataParallel | None = None  # the DDP model holding the hook
        self._stepped: nn.Module | None = None  # the model the last training_step was given

    def get_train_dataloader(self) -> DataLoader:
        """The Trainer's training loader, its ``DistributedSampler``'s global batches dealt by
        the shares and passed through Accelerate unsharded (module docstring)."""
        theirs = super().get_train_dataloader()  # its collator, pruned columns and workers
        args = self.args
        sampler = DistributedSampler(
            theirs.dataset, num_replicas=args.world_size, rank=args.process_index,
            shuffle=ORDERS[args.train_sampling_strategy],
            seed=args.seed if args.data_seed is None else args.data_seed,
        )  # fmt: skip
        kept = {name: getattr(theirs, name) for name in CARRIED if hasattr(theirs, name)}
        plain = DataLoader(theirs.dataset, batch_size=self._train_batch_size, sampler=sampler,
                           **kept)  # fmt: skip
        scaled = self.accelerator.scaler is not None  # fp16: an overflow must reach it
        dealt = rebalance_loader(plain, self.shares, on_nonfinite="propagate" if scaled else "skip")
        assert isinstance(dealt.batch_sampler, ShareBatchSampler)
        loader = self.accelerator.prepare(dealt)
        passthrough(loader, dealt.batch_sampler)
        if self.dealt is None:  # DDP takes one comm hook; a reloaded loader deals the same
            self.dealt = dealt.batch_sampler
        return loader

    def training_step(
        self,
        model: nn.Module,
        inputs: dict[str, torch.Tensor | Any],
        num_items_in_batch: torch.Tensor | int | None = None,
    ) -> torch.Tensor:
        """The Trainer's micro-batch, the hook registered before the first; the loss returned
        for its log weighed by b_n / B (module docstring)."""
        if model is not self._stepped:
            self._hook(model)
        loss = super().training_step(model, inputs, num_items_in_batch)
        return loss * self.weight

    def compute_loss(
        self,
        model: nn.Module,
        inputs: dict[str, torch.Tensor | Any],
        return_outputs: bool = False,
        num_items_in_batch: torch.Tensor | int | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, Any]:
        """The Trainer's loss; in training, where it is normalised over every rank's items and
        multiplied by N, also by B / b_n, so that the hook's weights are DDP's mean again."""
        result = super().compute_loss(
            model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch
        )
        if not (model.training and self._items_across_ranks(num_items_in_batch)):
            return result
        if return_outputs:
            loss, outputs = result
            return loss / self.weight, outputs
        return result / self.weight

    def _items_across_ranks(self, num_items_in_batch: torch.Tensor | int | None) -> bool:
        """The Trainer's own condition for multiplying the loss by N (``compute_loss``)."""
        return bool(
            self.args.average_tokens_across_devices
            and (self.model_accepts_loss_kwargs or self.compute_loss_func)
            and num_items_in_batch is not None
        )

    def _hook(self, model: nn.Module) -> None:
        """``sample_weighted_hook`` on the DDP model the Trainer runs (under
        ``torch.compile``, the one it compiled), once per DDP model: a second ``train()``
        runs the same one. One process has none, and needs none."""
        ddp = getattr(model, "_orig_mod", model)  # torch.compile's module holds the DDP one
        if not isinstance(ddp, DistributedDataParallel):
            if self.args.world_size > 1:
                raise UsageError(
                    f"RebalancedTrainer: the Trainer runs a {type(model).__name__}, not a "
                    "DistributedDataParallel model: the shares need DDP's reduction to weigh"
                )
        elif ddp is not self._hooked:
            assert self.dealt is not None  # the train loader is built before the first step
            ddp.register_comm_hook(self.dealt, sample_weighted_hook)
            self._hooked = ddp
        self._stepped = model
