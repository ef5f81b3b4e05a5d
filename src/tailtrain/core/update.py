"""The update path every engine shares: a rule's ``Selection`` applied to gradients.

For a step whose gradients are the rows g_i of ``grads`` (keyed by ``(worker, job)``)::

    d_t   = sum_i now_i g_i / now.total + e_{t-1}       e_t = sum_i later_i g_i / later.total
    theta <- theta - lr * lr_scale * d_t

``e`` is LGC's one-step-delayed compensation (LGC Eq. 7); other rules give no ``later``
weights, so ``e`` stays empty. This module touches tensors and never a clock: the simulator's
engines and the torch.distributed runtime apply a Selection through the same code.

A gradient with a NaN or an infinity is screened out before the update (``on_nonfinite``
``skip``): its weights are dropped from the Selection, as if it had not arrived, and the
rest are normalised as the rule says; ``raise`` stops instead (:class:`NonFiniteGradient`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import torch

from tailtrain.errors import TailtrainError
from tailtrain.strategies.base import JOB_BITS, ArrivalColumns, Selection, StepStats, Weighting

#: what to do with a gradient that holds a NaN or an infinity
ON_NONFINITE = ("skip", "raise")


class NonFiniteGradient(TailtrainError):
    """A gradient with a NaN or an infinity, under ``on_nonfinite="raise"``; ``step`` is the
    update it was meant for, when the caller knows it. The CLI exits with status 3: the input
    was fine, the training went wrong."""

    exit_code = 3

    def __init__(self, workers: Any, step: int | None = None) -> None:
        self.workers = [int(w) for w in workers]
        self.step = step
        at = "" if step is None else f" at update {step}"
        super().__init__(
            f"non-finite gradient (NaN or inf) from worker {self.workers[0]}{at}; "
            "--on-nonfinite skip drops such gradients instead of stopping"
        )


def finite_rows(grads: torch.Tensor) -> np.ndarray:
    """Which rows (gradients) hold only finite numbers."""
    rows = grads.reshape(grads.shape[0], -1)
    # a row's sum is finite only if every term is: one pass and no mask of D booleans (a
    # non-finite sum, an overflow included, is settled element by element)
    ok = np.isfinite(rows.sum(dim=1).numpy())
    if not ok.all():
        ok = torch.isfinite(rows).all(dim=1).numpy()
    return ok


def _screen_rows(grads: torch.Tensor) -> tuple[np.ndarray, float | None]:
    """Which rows are finite, and sum_i ||g_i||^2 when all are. A finite sum of squares proves
    every entry finite (as in :func:`screen_own`) and is a statistic the step reports anyway
    (``gradient_stats``); only a non-finite or overflowing one is settled row by row."""
    if not grads.shape[0]:
        return np.ones(0, dtype=bool), None
    flat = grads.reshape(-1)
    sq_sum = float(flat @ flat)
    if math.isfinite(sq_sum):
        return np.ones(grads.shape[0], dtype=bool), sq_sum
    return finite_rows(grads), None


#: below this many comparisons :func:`isin` compares all pairs (np.isin sorts: ~20 us)
SMALL_ISIN = 4096


def isin(values: np.ndarray, among: np.ndarray) -> np.ndarray:
    """``np.isin(values, among)``, fast for the few arrival keys of one step."""
    values, among = np.asarray(values), np.asarray(among)
    if among.size == 0:
        return np.zeros(values.shape, dtype=bool)
    if values.size * among.size > SMALL_ISIN:
        return np.isin(values, among)
    return (values.reshape(-1, 1) == among.reshape(1, -1)).any(axis=1).reshape(values.shape)


class Screened(NamedTuple):
    """A worker's own gradient after :func:`screen_own`, with its squared norm, which the
    screen computes anyway and the round's statistics need (0 when screened out)."""

    grad: torch.Tensor
    loss: float
    screened: bool
    sq_norm: float


def screen_own(
    grad: torch.Tensor, loss: float, on_nonfinite: str, worker: int, step: int
) -> Screened:
    """One worker's own gradient, screened before it joins a collective (the runtime's form of
    :meth:`WeightedUpdate.screen`): with a NaN or an infinity in it or in its loss, ``raise``
    stops, naming ``worker`` and ``step``; ``skip`` gives a zero gradient and a NaN loss, so it
    joins with nothing."""
    # A finite sum of squares proves every entry finite at a sixteenth of isfinite().all()'s
    # cost; only an overflowing or non-finite one needs the exact check.
    sq_norm = float(grad @ grad)
    finite = math.isfinite(sq_norm) or bool(torch.isfinite(grad).all())
    if finite and math.isfinite(loss):
        return Screened(grad, loss, False, sq_norm)
    if on_nonfinite == "raise":
        raise NonFiniteGradient([worker], step)
    return Screened(torch.zeros_like(grad), math.nan, True, 0.0)


def key_workers(keys: np.ndarray) -> np.ndarray:
    """The worker of each arrival key (``strategies.base.arrival_keys``)."""
    return np.asarray(keys, dtype=np.int64) >> JOB_BITS


def without(weighting: Weighting, keys: np.ndarray) -> Weighting:
    """``weighting`` with the given arrivals dropped; a rule's fixed divisor stays."""
    keep = ~isin(weighting.keys, keys)
    if keep.all():
        return weighting
    return Weighting(weighting.keys[keep], weighting.weight[keep], weighting.total)


@dataclass(frozen=True)
class GradientStats:
    """``StepStats``' allreduce scalars over the fresh whole gradients of a step."""

    loss: float = float("nan")
    grad_sq_sum: float = float("nan")
    mean_grad_sq: float = float("nan")


def closed_step_stats(
    step: int,
    k: int,
    time: float,
    arrivals: ArrivalColumns,
    used: np.ndarray,
    scalars: GradientStats,
    lr: float,
    micro_batch_times: np.ndarray | None = None,
    comm_time: float = math.nan,
) -> StepStats:
    """The ``StepStats`` of a closed step, of model ``step + 1``: what every topology's ledger
    (``topology.*``) hands its rule, in the one field order; an allreduce adds each rank's
    unit times and T^c (DropCompute's Algorithm 2 reads them)."""
    return StepStats(
        step=step,
        version=step + 1,
        time=time,
        k=k,
        arrivals=arrivals,
        used=used,
        loss=scalars.loss,
        grad_sq_sum=scalars.grad_sq_sum,
        mean_grad_sq=scalars.mean_grad_sq,
        lr=lr,
        micro_batch_times=micro_batch_times,
        comm_time=comm_time,
    )


def gradient_stats(
    losses: torch.Tensor,
    grads: torch.Tensor,
    finite: np.ndarray | None = None,
    sq_sum: float | None = None,
    *,
    moments: bool = True,
) -> GradientStats:
    """Mean loss, sum_i ||g_i||^2 and ||mean_i g_i||^2 over the rows given (DBW Eqs. 10-11);
    rows with a non-finite gradient or loss are left out, as the update leaves them out.
    ``finite``: which rows are finite, when the caller knows it (the update just checked);
    ``sq_sum``: sum_i ||g_i||^2 of these very rows, when the caller has it (the update's
    screen computes it: :attr:`WeightedUpdate.sq_sum`); ``moments`` False: the loss only,
    the two gradient moments NaN (:attr:`WeightedUpdate.moments`: no rule will read them)."""
    if finite is None:
        finite = finite_rows(grads) if grads.shape[0] else np.ones(0, dtype=bool)
    ok = finite
    if not ok.all():
        if losses.shape[:1] == grads.shape[:1]:  # one loss per gradient: drop it with it
            losses = losses[torch.from_numpy(ok)]
        grads = grads[torch.from_numpy(ok)]
        sq_sum = None  # of other rows
    if grads.shape[0] == 0:
        return GradientStats()
    # a finite mean proves every loss finite (one reduction, not a mask and a second one)
    loss = float(losses.mean())
    if not math.isfinite(loss):
        loss = float(losses[torch.isfinite(losses)].mean())
    if not moments:  # two passes over the gradients nobody reads
        return GradientStats(loss)
    if sq_sum is None:
        flat = grads.reshape(-1)
        sq_sum = float(flat @ flat)
    if grads.shape[0] == 1:  # the mean of one gradient is that gradient
        return GradientStats(loss, sq_sum, sq_sum)
    mean = grads.mean(0)
    return GradientStats(loss, sq_sum, float(mean @ mean))


class WeightedUpdate:
    """Applies Selections step after step and carries the deferred term ``e`` between them."""

    def __init__(self, lr: float, on_nonfinite: str = "skip") -> None:
        self.lr = lr
        self.deferred: torch.Tensor | None = None
        self.on_nonfinite = on_nonfinite
        #: keys of the gradients the last ``direction`` dropped as non-finite
        self.dropped = np.zeros(0, dtype=np.int64)
        #: which rows of the last ``direction``'s gradients were finite (for ``gradient_stats``
        #: of the same rows: one pass over them less); None before the first
        self.finite: np.ndarray | None = None
        #: sum_i ||g_i||^2 of the last ``direction``'s gradients where all were finite and
        #: the screen summed them (its proof of it), else None: ``gradient_stats`` of the same
        #: rows reuses it
        self.sq_sum: float | None = None
        #: whether a step's statistics need sum_i ||g_i||^2 and ||mean_i g_i||^2
        #: (``gradient_stats``): only a rule that adapts reads them (``Strategy.keeps_state``
        #: False; DBW's gain estimator); the simulator's driver says which
        self.moments = True
        #: (workers, values): the next ``direction`` sets those workers' weighed gradients to
        #: their values (a fault drill: ``tailtrain.faults``); consumed by that call
        self.inject: tuple[np.ndarray, np.ndarray] | None = None

    def take_dropped(self) -> np.ndarray:
        """The keys the last ``direction`` screened out, once: a later step that applies
        nothing (no ``direction``) screened nothing and must not report them again."""
        dropped, self.dropped = self.dropped, np.zeros(0, dtype=np.int64)
        return dropped

    def direction(
        self, grads: torch.Tensor, keys: np.ndarray, selection: Selection
    ) -> torch.Tensor:
        """d_t for gradients ``grads`` whose rows have arrival keys ``keys``."""
        self._inject(grads, keys, selection)
        step = self._screened_step(grads, keys, selection)
        if step is None:  # a row not weighed now, or a non-finite sum: row by row
            grads, selection = self.screen(grads, keys, selection)
            step = as_weights(selection.now.over(keys), grads.dtype) @ grads
        if self.deferred is not None:
            step = step + self.deferred
        self.deferred = None
        if len(selection.later):
            self.deferred = as_weights(selection.later.over(keys), grads.dtype) @ grads
        return step

    def _screened_step(
        self, grads: torch.Tensor, keys: np.ndarray, selection: Selection
    ) -> torch.Tensor | None:
        """sum_i now_i g_i when every row is weighed now (no ``later``) and the sum is finite,
        which proves every row finite: a NaN or an infinity in a row with a non-zero weight
        reaches the weighted sum (an overflow falls back, and is settled row by row). The
        step's usual case: one pass over the gradients, not a screening pass before it.
        None where :meth:`screen` has to look row by row first."""
        if len(selection.later):
            return None
        now = as_weights(selection.now.over(keys), grads.dtype)
        # a zero weight (after the cast) hides what its row holds: 0 * NaN may be skipped
        weighed = now.numpy().all() if now.dtype is torch.float32 else now.all()
        if not weighed:
            return None
        step = now @ grads
        if not math.isfinite(float(step.sum())):
            return None
        self.finite, self.sq_sum = np.ones(grads.shape[0], dtype=bool), None
        self.dropped = np.zeros(0, dtype=np.int64)
        return step

    def screen(
        self, grads: torch.Tensor, keys: np.ndarray, selection: Selection
    ) -> tuple[torch.Tensor, Selection]:
        """Drop the rows with a NaN or an infinity from ``selection`` (and zero them, since
        0 * NaN is NaN); remember their keys in ``dropped``. ``raise`` stops instead."""
        ok, self.sq_sum = _screen_rows(grads)
        self.finite = ok
        self.dropped = np.asarray(keys, dtype=np.int64)[~ok]
        if ok.all():
            return grads, selection
        if self.on_nonfinite == "raise":
            raise NonFiniteGradient(key_workers(self.dropped))
        grads = torch.where(torch.from_numpy(ok)[:, None], grads, 0.0)
        dropped = Selection(
            without(selection.now, self.dropped), without(selection.later, self.dropped)
        )
        return grads, dropped

    def _inject(self, grads: torch.Tensor, keys: np.ndarray, selection: Selection) -> None:
        """Poison, in place, the weighed gradients of the workers a fault drill names, so the
        value reaches the engine's statistics as a real one would."""
        if self.inject is None:
            return
        workers, values = self.inject
        self.inject = None
        weighed = np.concatenate([w.keys[w.weight != 0] for w in (selection.now, selection.later)])
        owner = key_workers(keys)
        rows = np.flatnonzero(isin(owner, workers) & isin(keys, weighed))
        if rows.size:
            value = values[np.searchsorted(workers, owner[rows])]
            grads[torch.from_numpy(rows)] = torch.as_tensor(value, dtype=grads.dtype)[:, None]

    def apply(
        self,
        theta: torch.Tensor,
        grads: torch.Tensor,
        keys: np.ndarray,
        selection: Selection,
        lr_scale: float,
    ) -> torch.Tensor:
        """theta - lr * lr_scale * d_t."""
        # d_t is a new tensor of ours: scaled in place, one temporary of D less
        return theta - self.direction(grads, keys, selection).mul_(self.lr * lr_scale)

    def apply_reduced(
        self, theta: torch.Tensor, weighted_sum: torch.Tensor, divisor: float, lr_scale: float
    ) -> torch.Tensor:
        """The same step when the weighted gradients arrive already summed, sum_i w_i g_i, by
        an allreduce (the runtime's form): theta - lr * lr_scale * (sum / divisor + e)."""
        if self.deferred is None:  # one pass over theta, the runtime's every round
            return torch.add(theta, weighted_sum, alpha=-(self.lr * lr_scale) / divisor)
        step = weighted_sum / divisor + self.deferred
        self.deferred = None
        # scaled in place (step is ours): one temporary less
        return theta - step.mul_(self.lr * lr_scale)

    def state_dict(self) -> dict[str, Any]:
        return {"lr": self.lr, "deferred": self.deferred}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.lr = float(state["lr"])
        self.deferred = state["deferred"]


def as_weights(weights: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """Float64 weights as a tensor of the gradients' dtype (the same rounding as
    ``torch.as_tensor``); float32, the usual dtype, cast by numpy at a third of its cost."""
    if dtype is torch.float32:
        return torch.from_numpy(weights.astype(np.float32))
    return torch.as_tensor(weights, dtype=dtype)


def rows_weighed(keys: np.ndarray, selection: Selection) -> np.ndarray:
    """Positions (sorted) of the arrivals a Selection weighs now or later: the only gradients
    an engine has to compute."""
    now = selection.now.keys
    if not len(selection.later) and same_keys(keys, now):  # a step's usual selection
        return np.arange(len(keys))
    wanted = np.concatenate([now, selection.later.keys])
    return np.flatnonzero(isin(keys, wanted))


def same_keys(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two key columns are equal, element by element: most steps weigh every
    arrival offered, in order, and then no membership test is needed."""
    return len(a) == len(b) and bool((a == b).all())
