"""The networks of the built-in tasks, built on the ``meta`` device.

They hold no weights of their own: a task keeps its parameters as one flat vector and
runs these modules through ``torch.func.functional_call``. No batch-norm and no dropout,
so a vmapped per-worker call means exactly what a per-worker loop means.
"""

from __future__ import annotations

import torch
from torch import nn

from tailtrain.errors import UsageError


def _on_meta(*layers: nn.Module) -> nn.Sequential:
    return nn.Sequential(*layers).to("meta")


def digits_cnn() -> nn.Sequential:
    """DBW §5's MNIST net adapted to 8×8 digits: the same widths (conv 10, conv 20, fc 50,
    fc 10) and the same 20×4×4 = 320 features into fc 50. On MNIST two 5×5 convs and two
    2×2 pools take 28×28 to 4×4; here two unpadded 3×3 convs take 8×8 to 4×4 without pools."""
    return _on_meta(
        nn.Conv2d(1, 10, 3), nn.ReLU(),
        nn.Conv2d(10, 20, 3), nn.ReLU(),
        nn.Flatten(), nn.Linear(20 * 4 * 4, 50), nn.ReLU(), nn.Linear(50, 10),
    )  # fmt: skip


def mnist_cnn(side: int) -> nn.Sequential:
    """DBW §5's MNIST net: conv 5×5 (10), pool, conv 5×5 (20), pool, fc 50, fc 10."""
    reduced = ((side - 4) // 2 - 4) // 2
    if reduced < 1:
        raise UsageError(f"MNIST images are {side}×{side}; the CNN needs at least 16×16")
    return _on_meta(
        nn.Conv2d(1, 10, 5), nn.MaxPool2d(2), nn.ReLU(),
        nn.Conv2d(10, 20, 5), nn.MaxPool2d(2), nn.ReLU(),
        nn.Flatten(), nn.Linear(20 * reduced * reduced, 50), nn.ReLU(), nn.Linear(50, 10),
    )  # fmt: skip


def cifar_cnn() -> nn.Sequential:
    """A small CIFAR-10 CNN: two padded 3×3 convs (16, 32) with 2×2 pools, fc 64, fc 10."""
    return _on_meta(
        nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 8 * 8, 64), nn.ReLU(), nn.Linear(64, 10),
    )  # fmt: skip


def mlp(inputs: int, hidden: int, outputs: int) -> nn.Sequential:
    """One hidden ReLU layer."""
    return _on_meta(nn.Linear(inputs, hidden), nn.ReLU(), nn.Linear(hidden, outputs))


def linear(inputs: int, outputs: int) -> nn.Sequential:
    """An affine map: softmax regression with cross-entropy, or eager-SGD §7.2.1's
    one-layer MLP (d weights + 1 bias) with MSE."""
    return _on_meta(nn.Linear(inputs, outputs))


class LstmClassifier(nn.Module):
    """A one-layer LSTM over a sequence's frames, then a linear layer on the last valid
    step's hidden state (eager-SGD §2.1's video model, without the CNN feature extractor).

    The input is (..., T, features + 1): zero-padded frames and a last channel that is 1
    on the valid steps, a prefix. The LSTM is causal, so padding after step L - 1 leaves
    h_{L-1} unchanged, and selecting it with the weights m_t - m_{t+1} (1 at t = L - 1,
    exactly 0 elsewhere) gives padding exactly zero gradient, in a form ``vmap`` takes.
    """

    def __init__(self, features: int, hidden: int, classes: int) -> None:
        super().__init__()
        self.lstm = nn.LSTM(features, hidden, batch_first=True)
        self.head = nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        frames, mask = x[..., :-1], x[..., -1]
        out, _ = self.lstm(frames)
        last = mask - torch.cat([mask[..., 1:], torch.zeros_like(mask[..., :1])], -1)
        return self.head((out * last.unsqueeze(-1)).sum(-2))


def lstm_classifier(features: int, hidden: int, classes: int) -> LstmClassifier:
    """:class:`LstmClassifier` on the ``meta`` device, like the other built-in networks."""
    return LstmClassifier(features, hidden, classes).to("meta")
