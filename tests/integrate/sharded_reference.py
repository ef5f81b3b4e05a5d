"""The single-process reference of a ``ShardedStep`` run, in the run's own float32 arithmetic,
so that it agrees to the bit: per unit u of group n, FSDP's average of the group's ranks'
gradients ((g_0 + g_1) / 2 with two shards: gloo sums two in either order alike; with more, its
order would matter), summed over the counted units in order (FSDP accumulates into the
shard), times 1 / C_n, times w_n = C_n / M (the rule's unnormalised weight), summed over the
groups, over D (the rule's fixed N, or the weights that entered, reduced in float32)."""

from __future__ import annotations

from collections.abc import Callable

import torch

#: unit(n, shard, u): the gradients of group n's rank ``shard`` on its u-th counted micro-batch
Unit = Callable[[int, int, int], list[torch.Tensor]]


def update(record: dict, unit: Unit, shards: int) -> list[torch.Tensor] | None:
    """sum_n w_n G_n / D for ``record`` (n indexes its rows: ``record["live"][n]`` is the
    group), or None where it made no update (``empty``)."""
    if record["empty"]:
        return None
    weights = {n: record["completed"][n] / record["micro_batches"] for n in record["ranks"]}
    entered = float(torch.tensor(list(weights.values()), dtype=torch.float32).sum())
    divisor = next(
        d
        for d in (float(len(record["completed"])), entered)
        if all(abs(w / d - record["weights"][n]) < 1e-12 for n, w in weights.items())
    )
    summed: list[torch.Tensor] | None = None
    for n, weight in weights.items():
        done = record["completed"][n]
        acc: list[torch.Tensor] | None = None
        for u in range(done):
            parts = [unit(n, s, u) for s in range(shards)]
            total = [sum(ts[1:], ts[0]) for ts in zip(*parts, strict=True)]
            mean = [t / shards for t in total]
            acc = mean if acc is None else [a + m for a, m in zip(acc, mean, strict=True)]
        assert acc is not None
        scale = 1.0 / done
        part = [torch.mul(a if scale == 1.0 else a * scale, weight) for a in acc]
        summed = part if summed is None else [a + b for a, b in zip(summed, part, strict=True)]
    assert summed is not None
    return [t / divisor for t in summed]


def grads_of(net: torch.nn.Module, loss: Callable[[], torch.Tensor]) -> list[torch.Tensor]:
    """The gradients of ``loss()`` with respect to ``net``'s trainable parameters."""
    net.zero_grad()
    loss().backward()
    return [p.grad.detach().clone() for p in net.parameters() if p.requires_grad]
