"""The update path every engine shares: a rule's ``Selection`` applied to gradients.

For a step whose gradients are the rows g_i of ``grads`` (keyed by ``(worker, job)``)::

    d_t   = sum_i now_i g_i / now.total + e_{t-1}       e_t = sum_i later_i g_i / later.total
    theta <- theta - lr * lr_scale * d_t

``e`` is LGC's one-step-delayed compensation (LGC Eq. 7); other rules give no ``later``
weights, so ``e`` stays empty. This module touches tensors and never a clock: the simulator's
engines and the torch.distributed runtime apply a Selection through the same code.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from tailtrain.strategies.base import Selection


@dataclass(frozen=True)
class GradientStats:
    """``StepStats``' allreduce scalars over the fresh whole gradients of a step."""

    loss: float = float("nan")
    grad_sq_sum: float = float("nan")
    mean_grad_sq: float = float("nan")


def gradient_stats(losses: torch.Tensor, grads: torch.Tensor) -> GradientStats:
    """Mean loss, sum_i ||g_i||^2 and ||mean_i g_i||^2 over the rows given (DBW Eqs. 10-11)."""
    if grads.shape[0] == 0:
        return GradientStats()
    flat, mean = grads.reshape(-1), grads.mean(0)
    return GradientStats(float(losses.mean()), float(flat @ flat), float(mean @ mean))


class WeightedUpdate:
    """Applies Selections step after step and carries the deferred term ``e`` between them."""

    def __init__(self, lr: float) -> None:
        self.lr = lr
        self.deferred: torch.Tensor | None = None

    def direction(
        self, grads: torch.Tensor, keys: np.ndarray, selection: Selection
    ) -> torch.Tensor:
        """d_t for gradients ``grads`` whose rows have arrival keys ``keys``."""
        now = torch.as_tensor(selection.now.over(keys), dtype=grads.dtype)
        step = now @ grads
        if self.deferred is not None:
            step = step + self.deferred
        self.deferred = None
        if len(selection.later):
            later = torch.as_tensor(selection.later.over(keys), dtype=grads.dtype)
            self.deferred = later @ grads
        return step

    def apply(
        self,
        theta: torch.Tensor,
        grads: torch.Tensor,
        keys: np.ndarray,
        selection: Selection,
        lr_scale: float,
    ) -> torch.Tensor:
        """theta - lr * lr_scale * d_t."""
        return theta - self.lr * lr_scale * self.direction(grads, keys, selection)

    def apply_reduced(
        self, theta: torch.Tensor, weighted_sum: torch.Tensor, divisor: float, lr_scale: float
    ) -> torch.Tensor:
        """The same step when the weighted gradients arrive already summed, sum_i w_i g_i, by
        an allreduce (the runtime's form): theta - lr * lr_scale * (sum / divisor + e)."""
        step = weighted_sum / divisor
        if self.deferred is not None:
            step = step + self.deferred
            self.deferred = None
        return theta - self.lr * lr_scale * step

    def state_dict(self) -> dict[str, Any]:
        return {"lr": self.lr, "deferred": self.deferred}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.lr = float(state["lr"])
        self.deferred = state["deferred"]


def rows_weighed(keys: np.ndarray, selection: Selection) -> np.ndarray:
    """Positions (sorted) of the arrivals a Selection weighs now or later: the only gradients
    an engine has to compute."""
    wanted = np.concatenate([selection.now.keys, selection.later.keys])
    return np.flatnonzero(np.isin(keys, wanted))
