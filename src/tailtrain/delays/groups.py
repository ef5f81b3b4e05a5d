"""Replica groups as workers (hybrid sharding, issue 38 item 4): per-rank unit times to per-group.

In a hybrid-sharded job (HSDP: FSDP2 ``fully_shard`` over the shard dimension of a 2-D mesh,
replicated over the other) the G ranks of a replica group all-gather the parameters layer by
layer, so they compute every micro-batch in lockstep: a group's micro-batch ends when its
slowest rank's does, plus the exposed part of the group's own collectives (the forward and
backward all-gathers and the gradient reduce-scatter). The unit that computes C_n
micro-batches, is cut at tau, gets a share or is left out of a K-of-N step is then the group,
and every rule acts on the N/G groups as its workers. :func:`group_unit_times` is that one
rule, written once; the simulator (:class:`GroupedDelays`), ``predict``'s sampled route and
``advise`` on a trace apply it to per-rank draws, and ``theory.group_max.GroupMax`` is its
law for ``predict``'s closed forms: the max of G i.i.d. draws has cdf F(x)^G.

Ranks are grouped contiguously, group g holding ranks g G .. g G + G - 1: the layout of a
``DeviceMesh`` of shape (N/G, G) with the replicate dimension first (torchtitan's HSDP), whose
shard groups are consecutive ranks.

``cost`` is the within-group collectives' time per micro-batch, in seconds, added to every
group micro-batch; it defaults to 0 because FSDP2 prefetches the next layer's all-gather and
overlaps the reduce-scatter with the backward pass, so on a node's interconnect what stays
exposed is small and depends on the model's bytes, which a delay model does not know: a
measured figure (a probe's per-micro-batch collective wait) is the one to give.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike, NDArray

from tailtrain.errors import UsageError


def check_grouping(ranks: int, group_size: int, cost: float = 0.0) -> int:
    """The number of groups, N / G; one line (``UsageError``) for a G that does not divide
    the ranks, a G < 1 or a cost that is not finite seconds >= 0."""
    if group_size < 1:
        raise UsageError(f"--group-size must be >= 1, got {group_size}")
    if ranks % group_size:
        raise UsageError(
            f"--group-size {group_size} does not divide --workers {ranks}: every replica "
            "group holds the same number of ranks"
        )
    if not (cost >= 0 and math.isfinite(cost)):
        raise UsageError(f"--group-cost must be finite seconds >= 0, got {cost}")
    return ranks // group_size


def group_unit_times(
    times: NDArray[np.float64], group_size: int, cost: float = 0.0, *, axis: int = 1
) -> NDArray[np.float64]:
    """Per-group unit times from per-rank ones: along ``axis`` (the ranks, N of them; axis 1
    of an (I, N) or (I, N, M) block), each run of ``group_size`` consecutive ranks becomes
    one group whose unit time is the max over its ranks plus ``cost``. ``group_size`` 1 and
    ``cost`` 0 return ``times`` itself (the identity, not a copy)."""
    if group_size == 1 and cost == 0:
        return times
    axis = axis % times.ndim
    ranks = times.shape[axis]
    groups = check_grouping(ranks, group_size, cost)
    shape = (*times.shape[:axis], groups, group_size, *times.shape[axis + 1 :])
    grouped = times.reshape(shape).max(axis=axis + 1)
    return grouped + cost if cost else grouped


class GroupedDelays:
    """A ``DelaySource`` of groups from one of ranks: each block drawn for the N ranks and
    grouped by :func:`group_unit_times`, so the engines see N/G workers. A time-scheduled
    pattern (``slowdown``) is refused: the engines scale a unit by one factor at its start,
    but a group's unit is the max over ranks each scaled by its own."""

    def __init__(self, ranks, group_size: int, cost: float = 0.0) -> None:
        pattern = getattr(ranks, "pattern", None)
        if group_size > 1 and getattr(pattern, "time_scheduled", False):
            raise UsageError(time_scheduled_refusal(pattern.spec))
        self.ranks, self.group_size, self.cost = ranks, group_size, float(cost)
        self.workers = check_grouping(getattr(ranks, "workers", group_size), group_size, cost)
        self.pattern = pattern
        self.notes = dict(getattr(ranks, "notes", {}))

    def next_block(self, iterations: int) -> NDArray[np.float64]:
        return group_unit_times(self.ranks.next_block(iterations), self.group_size, self.cost)

    def time_factor(self, starts: ArrayLike, workers: ArrayLike) -> NDArray[np.float64]:
        """No schedule (refused above): every factor is 1."""
        return np.ones(np.shape(starts))


def time_scheduled_refusal(pattern: str) -> str:
    return (
        f"pattern {pattern!r} changes speed at virtual times, which replica groups "
        "(--group-size > 1) do not model: a group's time is the max over its ranks each "
        "slowed on its own; give a pattern without a schedule"
    )


def groups_note(ranks: int, group_size: int, cost: float) -> str:
    """One line saying how the ranks became workers."""
    return (
        f"{ranks} ranks in {ranks // group_size} replica groups of {group_size} (ranks "
        f"gG..gG+{group_size - 1}); a group's micro-batch is the max over its ranks + "
        f"{cost:g} s of within-group collectives, and the rules act on the groups"
    )
