"""The two-rank toy the integration tests share (``test_integrate``, ``test_mixed_precision``):
a linear model, SGD, each rank's micro-batches of a fixed dataset, and the reference written
from the definitions (DropCompute Eq. (1); SGD on the concatenated batches when nothing is
dropped)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

N, B, LR, D, C = 2, 4, 0.1, 8, 3
X = torch.randn(64, D, generator=torch.Generator().manual_seed(0))
Y = torch.randint(0, C, (64,), generator=torch.Generator().manual_seed(1))


def optimizer(params, decay: bool) -> torch.optim.Optimizer:
    """SGD; with ``decay``, momentum and weight decay, which move parameters on a zero
    gradient too (what a round that ran nothing must not do)."""
    if decay:
        return torch.optim.SGD(params, lr=LR, momentum=0.9, weight_decay=0.5)
    return torch.optim.SGD(params, lr=LR)


def model() -> nn.Module:
    torch.manual_seed(3)
    return nn.Linear(D, C)


def batch(rank: int, step: int, unit: int, units: int) -> tuple[torch.Tensor, torch.Tensor]:
    start = ((step * N + rank) * units + unit) * B
    idx = torch.arange(start, start + B) % len(X)
    return X[idx], Y[idx]


def flat(m: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in m.parameters()])


def grad(net: nn.Module, xy) -> list[torch.Tensor]:
    loss = F.cross_entropy(net(xy[0]), xy[1])
    return torch.autograd.grad(loss, list(net.parameters()))


def weighted_sgd(rounds: int, units: int, completed: list[int], ranks=range(N)) -> torch.Tensor:
    """theta -= lr * (1/|ranks|) sum_n (1/M) sum_{u < C_n} g_n^(u) (Eq. (1); SGD when all)."""
    net = model()
    for r in range(rounds):
        step = [torch.zeros_like(p) for p in net.parameters()]
        for n in ranks:
            for u in range(completed[n]):
                for s, g in zip(step, grad(net, batch(n, r, u, units)), strict=True):
                    s += g / (units * len(ranks))
        with torch.no_grad():
            for p, s in zip(net.parameters(), step, strict=True):
                p -= LR * s
    return flat(net)
