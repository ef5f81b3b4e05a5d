"""The two-rank job behind tests/hf/test_hf_rebalance.py (run under torchrun, gloo, CPU).

One process group, one ``RebalancedTrainer(shares=SHARES)`` run per loss in ``MODELS``, each
``EPOCHS`` epochs of plain SGD (no momentum, constant learning rate, no clipping) with
``gradient_accumulation_steps=ACCUMULATE`` over ``SAMPLES`` rows of ``L`` positions, some
positions' labels ``-100`` (so an item mean and a sample mean differ):

* ``sample``: ``PerSample``, its loss the mean over its micro-batch's samples (the Trainer
  divides it by the step's micro-batches);
* ``item``: ``PerItem``, which takes ``num_items_in_batch`` (``accepts_loss_kwargs``), the
  Trainer counting the labelled positions over every rank (``average_tokens_across_devices``,
  its default) and multiplying the loss by N;
* ``kwargs``: ``KwargsMean``, ``PerSample``'s loss behind a ``**kwargs`` forward, from which
  the Trainer guesses a loss over the count that it is not.

Rank r writes ``rank{r}.json`` in the folder given as the first argument: per run the
parameters before and after, the dataset indices of each micro-batch grouped by optimizer
step (a callback opens a group at each ``on_step_begin``), the Trainer's logged losses and
its ``training_loss``.
"""

from __future__ import annotations

import gc
import json
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import Dataset
from transformers import TrainerCallback, TrainingArguments

from tailtrain.hf import RebalancedTrainer

N, B, ACCUMULATE, EPOCHS, SEED = 2, 4, 2, 2, 5
SHARES = [6, 2]
#: 7 global batches of N B an epoch (2 samples left out), so its last step has 1 micro-batch
SAMPLES, L, D, LR = 58, 3, 4, 0.05
X = torch.randn(SAMPLES, L, D, generator=torch.Generator().manual_seed(0))
Y = torch.randn(SAMPLES, L, generator=torch.Generator().manual_seed(1))
LABELLED = (torch.arange(SAMPLES)[:, None] + torch.arange(L)) % 4 != 0
LABELS = Y.where(LABELLED, torch.tensor(-100.0))


class Rows(Dataset):
    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"x": X[i], "labels": LABELS[i], "idx": torch.tensor(i)}


class PerSample(nn.Module):
    """A linear map per position; its loss the mean over its batch's samples of the squared
    error summed over a sample's labelled positions, over ``L``."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(3)
        self.linear = nn.Linear(D, 1)
        self.seen: list[list[list[int]]] = []  # per optimizer step, per micro-batch

    def errors(self, x: torch.Tensor, labels: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        if self.training and torch.is_grad_enabled():
            self.seen[-1].append(idx.tolist())
        labelled = labels != -100
        return (self.linear(x).squeeze(-1) - labels.where(labelled, 0.0)) ** 2 * labelled

    def forward(self, x: torch.Tensor, labels: torch.Tensor, idx: torch.Tensor) -> dict:
        return {"loss": self.errors(x, labels, idx).sum() / labels.numel()}


class PerItem(PerSample):
    """The squared error summed over the labelled positions, over ``num_items_in_batch``."""

    accepts_loss_kwargs = True

    def forward(  # type: ignore[override]
        self, x: torch.Tensor, labels: torch.Tensor, idx: torch.Tensor,
        num_items_in_batch: torch.Tensor | None = None,
    ) -> dict:  # fmt: skip
        items = (labels != -100).sum() if num_items_in_batch is None else num_items_in_batch
        return {"loss": self.errors(x, labels, idx).sum() / items}


class KwargsMean(PerSample):
    """``PerSample``'s mean loss behind a forward that takes ``**kwargs``, as every
    transformers model's does, so that the Trainer guesses it takes ``num_items_in_batch``; it
    ignores the count, as a BERT classifier's loss does."""

    def forward(self, x: torch.Tensor, labels: torch.Tensor, idx: torch.Tensor, **_: Any) -> dict:
        return super().forward(x, labels, idx)


MODELS = {"sample": PerSample, "item": PerItem, "kwargs": KwargsMean}


class Steps(TrainerCallback):
    """A new group of micro-batches at each optimizer step."""

    def on_step_begin(self, args: Any, state: Any, control: Any, model: Any = None, **_: Any):
        model.seen.append([])


def flat(model: nn.Module) -> list[float]:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).tolist()


def train(folder: Path, name: str) -> dict[str, Any]:
    args = TrainingArguments(
        output_dir=str(folder / name), use_cpu=True, ddp_backend="gloo", report_to="none",
        save_strategy="no", num_train_epochs=EPOCHS, per_device_train_batch_size=B,
        gradient_accumulation_steps=ACCUMULATE, optim="sgd", learning_rate=LR,
        lr_scheduler_type="constant", max_grad_norm=0.0, weight_decay=0.0, logging_steps=1,
        dataloader_num_workers=0, disable_tqdm=True, seed=SEED,
    )  # fmt: skip
    model = MODELS[name]()
    initial = flat(model)
    trainer = RebalancedTrainer(
        model=model, args=args, train_dataset=Rows(), callbacks=[Steps()], shares=SHARES
    )
    output = trainer.train()
    run = {
        "initial": initial,
        "final": flat(model),
        "seen": model.seen,
        "logged": [log["loss"] for log in trainer.state.log_history if "loss" in log],
        "training_loss": output.training_loss,
        "global_step": trainer.state.global_step,
        "screened": trainer.dealt.screened,
    }
    del trainer  # its DDP model holds a comm hook: gone before the process group
    gc.collect()
    return run


def main(folder: Path) -> None:
    torch.set_num_threads(1)
    runs = {name: train(folder, name) for name in MODELS}
    (folder / f"rank{dist.get_rank()}.json").write_text(json.dumps(runs))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
