"""A training task: in-memory data, a model over one flat vector θ ∈ R^D, batched gradients.

Every simulated worker's stochastic gradient (LGC Eq. (2): the mean gradient over its
mini-batch ξ_i) is computed in one batched call for all workers, never in a per-worker loop:
at a shared θ by one forward/backward pass (:mod:`tailtrain.tasks.shared_grads`) when the
model's layers allow, otherwise (and at per-worker θ) by ``torch.func.vmap(grad_and_value)``.
The exception is a model that ``torch.func`` runs slower than a loop (``seq-lstm``'s LSTM):
it is computed worker by worker (``per_worker_loop``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad_and_value, vmap

from tailtrain.errors import UsageError
from tailtrain.tasks.data import Dataset
from tailtrain.tasks.flat import FlatLayout
from tailtrain.tasks.partition import PartitionState
from tailtrain.tasks.shared_grads import SharedGrads, supports

#: input elements per batched call: bounds memory at thousands of workers, and on CPU
#: digits-cnn ran fastest per sample with 2k-4k samples a call (bench_batched_grads.py)
ELEMENT_BUDGET = 1 << 18
#: train examples (a fixed random subset) on which evaluate() reports the train loss
TRAIN_EVAL_SIZE = 4096


@dataclass(eq=False)
class Task:
    """One task. ``objective`` is ``"cross_entropy"``, ``"mse"`` or ``"none"`` (timing only).

    ``l2`` adds (l2/2)·‖θ‖² to every loss, which makes ``logreg`` strongly convex.
    ``per_worker_loop`` computes gradients worker by worker with plain autograd instead
    (see :meth:`_loop_grads`), for models that ``torch.func`` would slow down.
    """

    name: str
    data: Dataset | None
    model: nn.Module | None
    batch_size: int
    objective: str
    l2: float = 0.0
    seed: int = 0
    text: str = ""
    per_worker_loop: bool = False
    layout: FlatLayout | None = field(init=False, repr=False)
    _train_eval: torch.Tensor = field(init=False, repr=False)
    _shared_fn: Any = field(init=False, repr=False)
    _vmap_shared_fn: Any = field(init=False, repr=False)
    _multi_fn: Any = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.layout = None if self.model is None else FlatLayout.of(self.model)
        n = self.n_train
        rng = np.random.default_rng(self.seed)
        subset = np.sort(rng.choice(n, min(n, TRAIN_EVAL_SIZE), replace=False)) if n else []
        self._train_eval = torch.as_tensor(subset, dtype=torch.int64)
        per_worker = grad_and_value(self._loss_fn)
        self._vmap_shared_fn = vmap(per_worker, in_dims=(None, 0, 0))
        self._shared_fn = self._vmap_shared_fn
        if supports(self.model):
            self._shared_fn = SharedGrads(self.model, self.layout, self._per_sample, self.l2)
        self._multi_fn = vmap(per_worker, in_dims=(0, 0, 0))
        if self.per_worker_loop:
            self._shared_fn = self._multi_fn = self._loop_grads

    # ---- description -------------------------------------------------------------------
    @property
    def has_model(self) -> bool:
        return self.layout is not None

    @property
    def dim(self) -> int:
        return 0 if self.layout is None else self.layout.dim

    @property
    def metric_name(self) -> str:
        return {"cross_entropy": "accuracy", "mse": "mse"}.get(self.objective, "none")

    @property
    def n_train(self) -> int:
        return 0 if self.data is None else self.data.n_train

    @property
    def n_classes(self) -> int | None:
        return None if self.data is None else self.data.n_classes

    def train_labels(self) -> np.ndarray | None:
        return None if self.data is None else self.data.train_labels()

    # ---- parameters and sampling ------------------------------------------------------
    def init_params(self, seed: int) -> torch.Tensor:
        """Deterministic θ_0 (PyTorch's default init law, explicit generator); empty for none."""
        return torch.zeros(0) if self.layout is None else self.layout.init(seed)

    def module_at(self, theta: torch.Tensor) -> nn.Module:
        """A real ``nn.Module`` holding a copy of θ (for a runtime or a reference loop)."""
        model, layout = self._require_model("build a module")
        return layout.module_at(model, self._check_theta(theta))

    def sample_indices(
        self,
        rng: np.random.Generator,
        workers: np.ndarray,
        partition_state: PartitionState,
        count: int = 1,
    ) -> np.ndarray:
        """Train indices of mini-batches from each worker's shard: (W, B), or (W, count, B)."""
        self._require_model("sample mini-batches")
        return partition_state.sample(rng, workers, self.batch_size, count)

    # ---- gradients ---------------------------------------------------------------------
    def grads(self, theta: torch.Tensor, indices: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-worker mean loss (W,) and gradient (W, D) at one shared θ, for (W, B) indices."""
        self._require_model("compute gradients")
        return self._batched(self._shared_fn, self._check_theta(theta), indices)

    def grads_multi(
        self, thetas: torch.Tensor, indices: np.ndarray
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """As :meth:`grads` but worker w evaluates at its own ``thetas[w]`` (W, D)."""
        self._require_model("compute gradients")
        idx = np.asarray(indices)
        if thetas.ndim != 2 or thetas.shape != (idx.shape[0], self.dim):
            raise ValueError(
                f"thetas must be ({idx.shape[0]}, {self.dim}), got {tuple(thetas.shape)}"
            )
        return self._batched(self._multi_fn, thetas, indices, per_worker_theta=True)

    def _batched(
        self, fn: Any, theta: torch.Tensor, indices: np.ndarray, per_worker_theta: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        idx = self._as_index(indices, ndim=2)
        if idx.shape[0] == 0:
            return torch.zeros(0), torch.zeros(0, self.dim)
        losses, grads = [], []
        for part in self._chunks(idx.shape[0], idx.shape[1]):
            th = theta[part] if per_worker_theta else theta
            x = self.data.trim(self.data.x_train[idx[part]])
            g, v = fn(th, x, self.data.y_train[idx[part]])
            grads.append(g)
            losses.append(v)
        return _cat(losses), _cat(grads)

    def _loop_grads(
        self, theta: torch.Tensor, x: torch.Tensor, y: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The contract of the vmapped functions, worker by worker with plain autograd.

        For ``nn.LSTM``: under ``torch.func`` its fused CPU kernel has no batching rule and
        its backward runs unfused: 8-13x slower than this loop at batch 32. Each worker's input
        is trimmed to its own longest sequence, so its cost follows its own data, as on a
        real rank. ``theta`` is shared (D,) or per worker (W, D).
        """
        grads = torch.empty(len(y), self.dim, dtype=theta.dtype, device=theta.device)
        losses = torch.empty(len(y), dtype=theta.dtype, device=theta.device)
        for w in range(len(y)):
            th = (theta if theta.ndim == 1 else theta[w]).detach().requires_grad_()
            with torch.enable_grad():  # like torch.func.grad, work under an outer no_grad too
                loss = self._loss_fn(th, self.data.trim(x[w]), y[w])
            (grads[w],) = torch.autograd.grad(loss, th)
            losses[w] = loss.detach()
        return grads, losses

    def _loss_fn(self, theta: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        out = functional_call(self.model, self.layout.unflatten(theta), (x,))
        return self._per_sample(out, y).mean() + self._penalty(theta)

    # ---- losses and evaluation -------------------------------------------------------
    def loss(self, theta: torch.Tensor, indices: np.ndarray) -> torch.Tensor:
        """Mean loss of each mini-batch: indices (..., B) give losses of shape (...)."""
        self._require_model("compute a loss")
        theta = self._check_theta(theta)
        idx = self._as_index(indices, ndim=None)
        flat = idx.reshape(-1)
        with torch.no_grad():
            out = self._forward(theta, self.data.x_train[flat])
            per = self._per_sample(out, self.data.y_train[flat])
        return per.view(idx.shape).mean(-1) + self._penalty(theta)

    def evaluate(self, theta: torch.Tensor) -> dict[str, float]:
        """``train_loss`` (objective on a fixed train subset), ``eval`` (test accuracy or
        test MSE) and ``eval_loss`` (test cross-entropy or MSE) on the held-out split."""
        self._require_model("be evaluated")
        theta = self._check_theta(theta)
        data = self.data
        with torch.no_grad():
            out = self._forward(theta, data.x_test)
            test = self._per_sample(out, data.y_test)
            sub = self._train_eval
            train = self._per_sample(self._forward(theta, data.x_train[sub]), data.y_train[sub])
            train_loss = train.mean() + self._penalty(theta)
        if self.objective == "mse":
            metric = test.mean()
        else:
            metric = (out.argmax(-1) == data.y_test).float().mean()
        return {
            "train_loss": float(train_loss),
            "eval": float(metric),
            "eval_loss": float(test.mean()),
        }

    def _forward(self, theta: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        params = self.layout.unflatten(theta)
        chunks = self._chunks(len(x), 1)
        parts = [functional_call(self.model, params, (self.data.trim(x[p]),)) for p in chunks]
        return _cat(parts)

    def _per_sample(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if self.objective == "mse":
            return (out.squeeze(-1) - y).square()
        return F.cross_entropy(out, y, reduction="none")

    def _penalty(self, theta: torch.Tensor) -> torch.Tensor | float:
        return 0.5 * self.l2 * theta.dot(theta) if self.l2 else 0.0

    # ---- checks and helpers -------------------------------------------------------------
    def _chunks(self, workers: int, batch: int) -> Iterator[slice]:
        per_call = max(1, ELEMENT_BUDGET // (batch * self.data.sample_numel))
        return (slice(i, min(i + per_call, workers)) for i in range(0, workers, per_call))

    def _require_model(self, action: str) -> tuple[nn.Module, FlatLayout]:
        if self.model is None or self.layout is None:
            raise UsageError(
                f"task {self.name!r} has no model and cannot {action}: it is for timing-only "
                "runs; choose a model task such as digits-cnn"
            )
        return self.model, self.layout

    def _check_theta(self, theta: torch.Tensor) -> torch.Tensor:
        if theta.shape != (self.dim,):
            raise ValueError(f"theta must have shape ({self.dim},), got {tuple(theta.shape)}")
        return theta

    def _as_index(self, indices: np.ndarray, ndim: int | None) -> torch.Tensor:
        idx = torch.from_numpy(np.ascontiguousarray(indices, dtype=np.int64))
        if (ndim is not None and idx.ndim != ndim) or idx.ndim == 0 or idx.shape[-1] == 0:
            want = "(W, B)" if ndim == 2 else "(..., B)"
            raise ValueError(f"indices must have shape {want} with B >= 1, got {tuple(idx.shape)}")
        return idx


def _cat(parts: list[torch.Tensor]) -> torch.Tensor:
    return parts[0] if len(parts) == 1 else torch.cat(parts)
