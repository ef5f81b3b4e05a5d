"""The round's weighted average over a model's buckets, for the loop entries
(``StragglerStep``, ``ShardedStep``, the elastic DDP state): ``sum_n w_n G_n / divisor`` in one
weighted allreduce per bucket of ``bucket_cap_mb`` (``runtime.reduce.Collectives``), screened
as every weighted allreduce is (``runtime.reduce.contribute``), either with the round's
agreement gathered first (:func:`weighted_average`) or riding in the first bucket, as
``train``'s round carries it (:func:`agreed_average`: one collective fewer a step).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from tailtrain.integrate.rounds import Agreement, RoundProgress, Rounds
from tailtrain.runtime.control import carried_rtol, check_agreement, check_own_weight
from tailtrain.runtime.reduce import Collectives, WeightedSum, contribute
from tailtrain.strategies.base import AllreducePlan


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


#: gradient dtypes whose allreduce carries the agreement's rows (float32: times to about
#: 1e-7 relative, counts exact); half precision would round the times and losses too far
ROW_DTYPES = (torch.float32, torch.float64)


def divisor_of(divisor: float | None, summed: float) -> float:
    """What a bucket's reduced sum is divided by: the rule's divisor, or (None) the reduced
    sum of the weights; 1 where that is 0, since nothing entered and the sum is 0 whatever
    divides it."""
    by = summed if divisor is None else divisor
    return by if by else 1.0


def carries_rows(tensors: list[torch.Tensor]) -> bool:
    """Whether a weighted allreduce of ``tensors`` carries the agreement (``ROW_DTYPES``)."""
    return all(t.dtype in ROW_DTYPES for t in tensors)


def agreed_average(
    rounds: Rounds,
    groups: list[list[int]],
    tensors: list[torch.Tensor],
    scale: float,
    work: RoundProgress,
    plan: AllreducePlan,
    dealt: list[int] | None = None,
    screen: bool = True,
) -> tuple[list[torch.Tensor], bool, float, Agreement]:
    """The round's agreement and its weighted average in one collective, as ``train``'s round
    makes them (``runtime.allreduce``, 3.): this rank reduces with its weight from its own
    arrival alone (``Rounds.own``), its agreement rows ride in the first bucket's allreduce
    (``Collectives.weighted_sum``'s ``rows``: an all-gather without a collective of its own),
    and after it every rank makes the rule's selection over all the rows, which must give
    this rank the weight it reduced with (``check_own_weight``: every rule a loop admits
    weighs a rank by its own counts, ``strategies.entries``) and the total reduced
    (``check_agreement``); each bucket is divided by the selection's divisor. One collective
    fewer a step than a gather first: on 6 gloo ranks of 2 shared cores each costs 8-9 ms
    (docs/faults.md). ``tensors`` must carry the rows (:func:`carries_rows`). Returns the
    averages, whether this rank was screened out, sum_n w_n of the ranks not screened out,
    and the agreement. ``screen`` False: a non-finite value enters the sum as it is (under
    ``StragglerStep``'s ``GradScaler``, which must see it)."""
    own = rounds.own(work, plan)
    bad = screen and not all(bool(torch.isfinite(t).all()) for t in tensors)
    agreed: list[Agreement] = []

    def settle(reduced: WeightedSum) -> float:  # the rows came: the selection and its checks
        agreed.append(rounds.agreement(work, plan, *reduced.rows))
        mine = agreed[0].mine
        check_own_weight(own.weight, mine.weight)
        check_agreement(mine.total, reduced.total + reduced.extras[0], rtol(reduced, rounds.comm))
        return divisor_of(mine.divisor, reduced.total)

    rows = rounds.own_rows(work, plan, dealt)
    out, first = reduce_buckets(rounds.comm, groups, tensors, scale, own.weight, bad, settle, rows)
    return out, bad, first.total, agreed[0]


def rtol(reduced: WeightedSum, comm: Collectives) -> float:
    """The agreement check's tolerance for weights summed in the reduced buffer's dtype."""
    return carried_rtol(torch.finfo(reduced.numerator.dtype).eps, comm.world_size)


def reduce_buckets(
    comm: Collectives,
    groups: list[list[int]],
    tensors: list[torch.Tensor],
    scale: float,
    weight: float,
    bad: bool,
    settle: Callable[[WeightedSum], float],
    rows: Sequence[Any] = (),
) -> tuple[list[torch.Tensor], WeightedSum]:
    """One weighted allreduce per bucket of ``tensors`` (``contribute``: weight 0 where
    ``bad``), the first carrying the weight withheld and ``rows``; ``settle`` reads the first
    and gives the divisor every bucket is divided by as it comes (:func:`scatter`). The
    averages and the first bucket's sum."""
    out: list[torch.Tensor] = [torch.empty(0)] * len(tensors)
    first, divisor = None, 1.0
    for b, index in enumerate(groups):
        parts = [tensors[i] for i in index]
        part = contribute(torch.cat([t.reshape(-1) for t in parts]), weight, bad=bad, scale=scale)
        if b == 0:
            first = comm.weighted_sum(part.values, part.weight, (part.withheld,), rows)
            divisor, reduced = settle(first), first
        else:
            reduced = comm.weighted_sum(part.values, part.weight)
        scatter(out, index, parts, reduced.numerator, divisor)
    assert first is not None  # a step has a parameter, so a bucket
    return out, first


def scatter(
    out: list[torch.Tensor],
    index: list[int],
    parts: list[torch.Tensor],
    numerator: torch.Tensor,
    divisor: float,
) -> None:
    """One bucket's reduced sum over ``divisor`` (:func:`divisor_of`), cut back into
    ``parts``' shapes at ``out[index]``; each bucket as it comes, so only one bucket's buffer
    is alive at a time."""
    pieces = (numerator / divisor).split([t.numel() for t in parts])
    for i, piece, part in zip(index, pieces, parts, strict=True):
        out[i] = piece.view_as(part).clone()


def weighted_average(
    comm: Collectives,
    groups: list[list[int]],
    tensors: list[torch.Tensor],
    scale: float,
    agreed: Agreement,
    bad: bool | None = None,
    screen: bool = True,
) -> tuple[list[torch.Tensor], bool, float]:
    """sum_n w_n (scale_n x_n) / divisor for each tensor, one weighted allreduce per bucket,
    whether this rank was screened out, and sum_n w_n over the ranks not screened out (0: no
    rank's values entered).

    Screened as every weighted allreduce is (``runtime.reduce.contribute``): a rank holding a
    non-finite value in any tensor joins every bucket with weight 0, and reports the weight it
    withheld so the agreement check holds. ``bad`` given: the caller screened already (a
    sharded model's group screens as one: ``integrate.sharded``); ``screen`` False: nothing
    is screened out (``StragglerStep``'s ``GradScaler`` must see an overflow)."""
    mine = agreed.mine
    if bad is None:
        bad = screen and not all(bool(torch.isfinite(t).all()) for t in tensors)

    def settle(reduced: WeightedSum) -> float:
        check_agreement(mine.total, reduced.total + reduced.extras[0], rtol(reduced, comm))
        return divisor_of(mine.divisor, reduced.total)

    out, first = reduce_buckets(comm, groups, tensors, scale, mine.weight, bad, settle)
    return out, bad, first.total
