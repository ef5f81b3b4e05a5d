"""A training-loop step for your own PyTorch loop: any allreduce strategy in a few lines.

    step = StragglerStep(model, optimizer, strategy="dropcompute:threshold=auto")
    for micro_batches in loader:                       # a list of M micro-batches per step
        record = step(micro_batches, lambda b: F.cross_entropy(model(b[0]), b[1]))

One call is one round of ``tailtrain.integrate.rounds``: the micro-batches are computed one at
a time while the threshold allows (``loss_fn(batch).backward()``, the plain loss, not divided
by M), then one weighted allreduce of ``[sum_n w_n G_n, sum_n w_n]`` over the model's
gradients, flattened into buckets of ``bucket_cap_mb`` (``runtime.reduce.Collectives``), and
the optimizer steps on the result:

* H = 1 (``sync``, ``dropcompute``): G_n is rank n's mean gradient over its C_n counted
  micro-batches; the optimizer's gradient is ``lr_scale * sum_n w_n G_n / divisor``, which is
  DropCompute Eq. (1) for its weights w_n = C_n / M over N, and plain data-parallel SGD when
  nothing is dropped.
* H > 1 (``local-sgd:period=H``, DropCompute App. B.3): the optimizer takes a local step every
  M micro-batches (on the gradient sum over M), and the round ends with the weighted model
  average theta <- theta_0 + sum_n w_n P_n / divisor with P_n = (theta_n - theta_0) U / C_n,
  U = H M: the average of the local models when nobody dropped work, and for plain SGD
  exactly ``tailtrain train``'s update (``runtime.allreduce``).

``rebalance`` (give ``micro_batches=M``, sync's micro-batches per rank and step) deals sync's
global batch of N M micro-batches to the ranks by shares that follow their measured speed:
each call takes this rank's share, :attr:`StragglerStep.wants` (and the returned record's
``wants``: the next call's), and :class:`~tailtrain.integrate.sampler.ShareSampler` draws
exactly that many from your dataset, every sample once an epoch::

    step = StragglerStep(model, optimizer, "rebalance", micro_batches=M)
    sampler = ShareSampler(len(dataset), step, micro_batch_size=B)
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for indices in sampler:                        # this rank's share of the step
            step([collate(dataset, i) for i in indices], loss_fn)

G_n is then the mean over the rank's m_n micro-batches and its weight m_n / M over N, so the
update is SGD on the whole global batch (``strategies.rebalance``).

A rank whose gradient holds a NaN or an infinity joins with weight 0, as ``train`` does.
Ranks start from rank 0's parameters and buffers (broadcast once, as DDP does).
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from tailtrain.integrate.rounds import (
    Agreement,
    RoundProgress,
    Rounds,
    StepRecord,
    as_strategy,
    check_micro_batches,
)
from tailtrain.runtime.control import check_agreement
from tailtrain.runtime.reduce import Collectives
from tailtrain.strategies.base import Strategy

#: DDP's default bucket size
BUCKET_CAP_MB = 25.0
#: what a call deals beyond the allreduce protocol (``Strategy.needs``): per-rank shares
DEALS = frozenset({"shares"})


class StragglerStep:
    """Runs one round per call on ``process_group`` (None: the default group).

    ``timeout`` bounds each of its collectives (None: the group's own timeout). Every call
    returns the round's :class:`StepRecord` (who took part, with which weight, under which tau).
    ``micro_batches`` is sync's M, which ``rebalance`` needs (module docstring).
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        strategy: str | Strategy = "dropcompute",
        *,
        process_group: dist.ProcessGroup | None = None,
        timeout: datetime.timedelta | None = None,
        bucket_cap_mb: float = BUCKET_CAP_MB,
        micro_batches: int | None = None,
    ) -> None:
        # a wrong strategy is refused before any collective
        strategy = check_micro_batches(as_strategy(strategy, DEALS), micro_batches)
        self.model = model
        self.optimizer = optimizer
        self.params = [p for p in model.parameters() if p.requires_grad]
        device = self.params[0].device
        comm = Collectives.of_group(process_group, device, timeout)
        lr = float(optimizer.param_groups[0]["lr"])
        self.rounds = Rounds(strategy, comm, lr=lr, micro_batches=micro_batches, does=DEALS)
        self.buckets = buckets(self.params, bucket_cap_mb)
        broadcast_from_first(model, process_group)

    def __call__(self, micro_batches: Sequence[Any], loss_fn: Callable[[Any], torch.Tensor]):
        """One round over ``micro_batches``; returns its :class:`StepRecord`."""
        batches = list(micro_batches)
        plan, m = self.rounds.plan(len(batches))
        local = plan.local_steps > 1
        start = [p.detach().clone() for p in self.params] if local else None
        self.optimizer.zero_grad(set_to_none=True)
        work, pending = RoundProgress(np.empty(0)), 0
        for u, batch in enumerate(self.rounds.units(batches, plan, work)):
            loss = loss_fn(batch)
            loss.backward()
            work.loss_sum += float(loss.detach())
            pending += 1
            if local and (u + 1) % m == 0 and u + 1 < len(batches):  # a local step ends
                self._local_step(m)
                pending = 0
        if local and pending:
            self._local_step(m)
        agreed = self.rounds.agree(work, plan)
        began = self.rounds.clock()
        with torch.no_grad():
            screened = self._reduce_and_apply(agreed, work, start, plan.lr_scale)
        reduce = self.rounds.clock() - began
        return self.rounds.close(plan, work, agreed, reduce, screened)

    @property
    def wants(self) -> int | None:
        """Micro-batches the next call computes on this rank: its share under ``rebalance``;
        None under any other rule (as many as you give)."""
        return self.rounds.wants()

    @property
    def shares(self) -> tuple[int, ...] | None:
        """Every rank's micro-batches in the next call (``rebalance``), summing to N M; None
        under any other rule. Every rank holds the same (the rule's state is agreed)."""
        return self.rounds.rule.plan().shares

    @property
    def micro_batches(self) -> int | None:
        """Sync's M, as given (``micro_batches=``)."""
        return self.rounds.micro_batches

    @property
    def rank(self) -> int:
        return self.rounds.comm.rank

    @property
    def world_size(self) -> int:
        return self.rounds.comm.world_size

    def _local_step(self, m: int) -> None:
        """Local-SGD: theta_n <- optimizer step on (1/M) sum of the step's gradients."""
        for p in self.params:
            if p.grad is not None:
                p.grad.div_(m)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def _reduce_and_apply(
        self,
        agreed: Agreement,
        work: RoundProgress,
        start: list[torch.Tensor] | None,
        lr_scale: float,
    ) -> bool:
        done, units = work.done, len(work.times)
        if start is None:  # G_n: the mean gradient of the counted micro-batches
            mine = [grad_of(p) for p in self.params]
            scale = 1.0 / max(done, 1)
        else:  # P_n: the local displacement per counted unit, times U
            mine = [p.detach() - s for p, s in zip(self.params, start, strict=True)]
            scale = units / max(done, 1)
        averaged, screened = weighted_average(self.rounds.comm, self.buckets, mine, scale, agreed)
        if start is None:
            for p, avg in zip(self.params, averaged, strict=True):
                p.grad = avg.mul_(lr_scale)
            self.optimizer.step()
        else:
            for p, s, avg in zip(self.params, start, averaged, strict=True):
                p.copy_(s + lr_scale * avg)
        return screened

    # ---- checkpoints (PyTorch's convention; the process group is left out) -----------------
    def state_dict(self) -> dict[str, Any]:
        """The rule's state (``strategy.state_dict``) and the round count; save the model and
        the optimizer as usual, beside it."""
        return self.rounds.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rounds.load_state_dict(state)


def grad_of(p: torch.Tensor) -> torch.Tensor:
    return torch.zeros_like(p) if p.grad is None else p.grad


def buckets(params: Sequence[torch.Tensor], cap_mb: float) -> list[list[int]]:
    """Indices of ``params`` in buckets of at most ``cap_mb`` MiB (one tensor may exceed it)
    and of one dtype and device each, in order."""
    out: list[list[int]] = []
    size, kind = 0, None
    for i, p in enumerate(params):
        nbytes = p.numel() * p.element_size()
        if not out or (p.dtype, p.device) != kind or size + nbytes > cap_mb * 2**20:
            out.append([])
            size, kind = 0, (p.dtype, p.device)
        out[-1].append(i)
        size += nbytes
    return out


def weighted_average(
    comm: Collectives,
    groups: list[list[int]],
    tensors: list[torch.Tensor],
    scale: float,
    agreed: Agreement,
) -> tuple[list[torch.Tensor], bool]:
    """sum_n w_n (scale_n x_n) / divisor for each tensor, one weighted allreduce per bucket,
    and whether this rank was screened out.

    Screened like ``runtime.allreduce.rounds.reduce_and_apply``: a rank holding a non-finite value
    joins with weight 0, and reports the weight it withheld so the agreement check holds."""
    mine = agreed.mine
    bad = not all(bool(torch.isfinite(t).all()) for t in tensors)
    weight, excluded = (0.0, mine.weight) if bad else (mine.weight, 0.0)
    out: list[torch.Tensor] = [torch.empty(0)] * len(tensors)
    total = None
    for b, index in enumerate(groups):
        parts = [tensors[i] for i in index]
        flat = torch.cat([t.reshape(-1) for t in parts])
        flat = torch.zeros_like(flat) if bad else flat.mul_(scale)  # 0 * NaN is NaN
        extras = (excluded,) if b == 0 else ()
        reduced = comm.weighted_sum(flat, weight, extras)
        if b == 0:
            check_agreement(mine.total, reduced.total + reduced.extras[0])
            total = reduced.total
        divisor = mine.divisor if mine.divisor is not None else total
        divided = reduced.numerator / (divisor if divisor else 1.0)
        for i, piece in zip(index, divided.split([t.numel() for t in parts]), strict=True):
            out[i] = piece.view_as(tensors[i]).clone()
    return out, bad


def broadcast_from_first(module: nn.Module, group: dist.ProcessGroup | None) -> None:
    """Every rank starts from the first rank's parameters and buffers (as DDP does)."""
    with torch.no_grad():
        for tensor in [*module.parameters(), *module.buffers()]:
            dist.broadcast(tensor.data, group=group, group_src=0)


__all__ = ["StepRecord", "StragglerStep"]
