"""Your own model in every mode: a factory that `--task examples.my_model:make` names.

    tailtrain compare --task examples.my_model:make --strategies sync,k-sync:k=12,dbw \
        --workers 16 --time-budget 60 --seeds 0
    tailtrain train --task examples.my_model:make:channels=8 --strategy dbw --workers 2 \
        --iterations 60

Run them from the repository's root (the module is imported from the current directory).
The factory returns `TaskParts`: the model (its own initialisation, drawn under the run's
seed, is the starting point), a per-example loss, train and test tensors, and optionally a
metric, a batch size and a learning rate. Keys after the factory's name arrive as keyword
arguments (`make:channels=8,dropout=0.1`).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from tailtrain import TaskParts


def lenet(channels: int, dropout: float) -> nn.Sequential:
    """A LeNet-style CNN for 8x8 digits: two 3x3 convolutions, a pool, two linear layers."""
    layers: list[nn.Module] = [
        nn.Conv2d(1, channels, 3, padding=1), nn.ReLU(),
        nn.Conv2d(channels, 2 * channels, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(2 * channels * 4 * 4, 64), nn.ReLU(), nn.Linear(64, 10),
    ]  # fmt: skip
    if dropout:
        layers.insert(-1, nn.Dropout(dropout))
    return nn.Sequential(*layers)


def digits() -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    """scikit-learn's bundled 8x8 digits (nothing downloaded): 1,500 to train, 297 to test."""
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    order = np.random.default_rng(0).permutation(len(y))  # a fixed split, whatever the seed
    x = torch.from_numpy((x[order] / 16.0).astype(np.float32)).view(-1, 1, 8, 8)
    y = torch.from_numpy(y[order].astype(np.int64))
    return (x[:1500], y[:1500]), (x[1500:], y[1500:])


def per_example(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits, labels, reduction="none")


def accuracy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return (logits.argmax(-1) == labels).float().mean()


def make(channels: int = 16, dropout: float = 0.0, batch: int = 32, lr: float = 0.6) -> TaskParts:
    train, test = digits()
    return TaskParts(
        model=lenet(channels, dropout),
        loss=per_example,
        train=train,
        test=test,
        metric=accuracy,
        metric_name="accuracy",
        batch_size=batch,
        lr=lr,
    )
