"""A training task: in-memory data, a model over one flat vector θ ∈ R^D, batched gradients.

Every simulated worker's stochastic gradient (LGC Eq. (2): the mean gradient over its
mini-batch ξ_i) is computed in one batched call for all workers, never in a per-worker loop:
at a shared θ by one forward/backward pass (:mod:`tailtrain.tasks.shared_grads`) when the
model's layers allow, otherwise (and at per-worker θ) by ``torch.func.vmap(grad_and_value)``.
The exception is a model that ``torch.func`` runs slower than a loop (``seq-lstm``'s LSTM):
it is computed worker by worker (``per_worker_loop``).

A task built from a user's factory (``objective="custom"``, :mod:`tailtrain.tasks.factory`)
gets the same three methods, chosen automatically: the shared pass where its layers allow,
``vmap`` where ``torch.func`` runs its model (tried once on two workers), else the loop; the
choice is its ``gradient_method`` and the run summary's ``gradients``. A random training
forward (dropout) is seeded from the run seed and the workers' mini-batch indices, which are
keyed by (seed, worker, job) (``tasks.stream``), so a run stays bit-reproducible.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
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
    #: ``objective="custom"`` (a factory's task): per-example loss, metric and its name
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None
    metric_fn: Callable[[torch.Tensor, torch.Tensor], Any] | None = None
    metric_label: str | None = None
    #: θ_0 when the model's own initialisation is it (a factory's task), else drawn by layout
    initial: torch.Tensor | None = None
    default_lr: float | None = None
    #: the training forward draws random numbers (dropout): seeded per call, see module doc
    random: bool = False
    #: put ``gradients`` in the run summary (the tasks that predate it keep their records)
    report_gradients: bool = False
    train_eval_size: int = TRAIN_EVAL_SIZE
    gradient_method: str = field(init=False, default="none")
    layout: FlatLayout | None = field(init=False, repr=False)
    _train_eval: torch.Tensor = field(init=False, repr=False)
    _shared_fn: Any = field(init=False, repr=False)
    _vmap_shared_fn: Any = field(init=False, repr=False)
    _multi_fn: Any = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.layout = None if self.model is None else FlatLayout.of(self.model)
        n = self.n_train
        rng = np.random.default_rng(self.seed)
        subset = np.sort(rng.choice(n, min(n, self.train_eval_size), replace=False)) if n else []
        self._train_eval = torch.as_tensor(subset, dtype=torch.int64)
        per_worker = grad_and_value(self._loss_fn)
        randomness = "different" if self.random else "error"
        self._vmap_shared_fn = vmap(per_worker, in_dims=(None, 0, 0), randomness=randomness)
        self._shared_fn = self._vmap_shared_fn
        self._multi_fn = vmap(per_worker, in_dims=(0, 0, 0), randomness=randomness)
        if self.objective == "custom" and not self.per_worker_loop:
            self.per_worker_loop = not self._vmap_runs()
        shared = "vmap"
        if supports(self.model):
            self._shared_fn = SharedGrads(self.model, self.layout, self._per_sample, self.l2)
            shared = "shared-pass"
        if self.per_worker_loop:
            self._shared_fn = self._multi_fn = self._loop_grads
            shared = "loop"
        if self.model is not None:
            multi = "loop" if self.per_worker_loop else "vmap"
            self.gradient_method = shared if shared == multi else f"{shared}; per-worker θ: {multi}"

    def _vmap_runs(self) -> bool:
        """Whether ``torch.func`` runs this model: one vmapped gradient on two workers."""
        theta = self.init_params(self.seed)
        x, y = self.data.x_train[:1], self.data.y_train[:1]
        x, y = self.data.trim(x.expand(2, *x.shape)), y.expand(2, *y.shape)
        try:
            with torch.random.fork_rng(devices=[]):
                self._multi_fn(torch.stack([theta, theta]), x, y)
        except Exception:  # any op without a batching rule, data-dependent control flow, ...
            return False
        return True

    @property
    def notes(self) -> dict[str, str]:
        """Summary lines of this task: how its per-worker gradients are computed."""
        return {"gradients": self.gradient_method} if self.report_gradients else {}

    # ---- description -------------------------------------------------------------------
    @property
    def has_model(self) -> bool:
        return self.layout is not None

    @property
    def dim(self) -> int:
        return 0 if self.layout is None else self.layout.dim

    @property
    def metric_name(self) -> str:
        if self.objective == "custom":
            return self.metric_label or "test_loss"
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
        """Deterministic θ_0 (PyTorch's default init law, explicit generator); empty for none.

        A factory's task returns its model's own initialisation, drawn under the run's seed
        when the task was built (``seed`` is that one in every engine)."""
        if self.initial is not None:
            return self.initial.clone()
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
            with self._seeded(idx[part]):
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
        seeds = torch.randint(0, 2**62, (len(y),)) if self.random else None
        for w in range(len(y)):
            if seeds is not None:  # each worker's dropout from its own seed
                torch.manual_seed(int(seeds[w]))
            th = (theta if theta.ndim == 1 else theta[w]).detach().requires_grad_()
            with torch.enable_grad():  # like torch.func.grad, work under an outer no_grad too
                loss = self._loss_fn(th, self.data.trim(x[w]), y[w])
            (grads[w],) = torch.autograd.grad(loss, th)
            losses[w] = loss.detach()
        return grads, losses

    @contextmanager
    def _seeded(self, indices: torch.Tensor) -> Iterator[None]:
        """For a random forward: torch's generator seeded from the run seed and the workers'
        mini-batch indices (keyed by seed, worker and job), restored afterwards."""
        if not self.random:
            yield
            return
        digest = hashlib.blake2b(indices.numpy().tobytes(), digest_size=8, key=b"%d" % self.seed)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int.from_bytes(digest.digest(), "little") >> 1)
            yield

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
        if self.objective == "custom":
            per = self._custom_losses(theta, self.data.x_train[flat], self.data.y_train[flat])[0]
            return per.view(idx.shape).mean(-1) + self._penalty(theta)
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
        if self.objective == "custom":
            return self._custom_evaluate(theta)
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

    def _custom_evaluate(self, theta: torch.Tensor) -> dict[str, float]:
        data, sub = self.data, self._train_eval
        test, metric = self._custom_losses(theta, data.x_test, data.y_test)
        train = self._custom_losses(theta, data.x_train[sub], data.y_train[sub])[0]
        test_loss = float(test.mean())
        return {
            "train_loss": float(train.mean() + self._penalty(theta)),
            "eval": test_loss if metric is None else metric,
            "eval_loss": test_loss,
        }

    def _custom_losses(
        self, theta: torch.Tensor, x: torch.Tensor, y: torch.Tensor
    ) -> tuple[torch.Tensor, float | None]:
        """Per-example losses of a factory's task in evaluation mode (no dropout), chunk by
        chunk (outputs of trimmed chunks may differ in shape), and the metric's mean over
        the chunks weighted by their sizes (None without a metric)."""
        params = self.layout.unflatten(theta)
        losses, metric = [], 0.0
        self.model.eval()
        try:
            with torch.no_grad():
                for part in self._chunks(len(x), 1):
                    out = functional_call(self.model, params, (self.data.trim(x[part]),))
                    losses.append(self.loss_fn(out, y[part]))
                    if self.metric_fn is not None:
                        metric += float(self.metric_fn(out, y[part])) * len(y[part])
        finally:
            self.model.train()
        return _cat(losses), None if self.metric_fn is None else metric / len(x)

    def _forward(self, theta: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        params = self.layout.unflatten(theta)
        chunks = self._chunks(len(x), 1)
        parts = [functional_call(self.model, params, (self.data.trim(x[p]),)) for p in chunks]
        return _cat(parts)

    def _per_sample(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if self.loss_fn is not None:
            return self.loss_fn(out, y)
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
