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
from pathlib import Path

import numpy as np
from numpy.typing import ArrayLike, NDArray

from tailtrain.delays.trace import Trace, write_trace_rows
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
        #: a group's unit is its ranks' units: cut as they can be (``DelayModel.cuttable``)
        self.cuttable: bool = getattr(ranks, "cuttable", True)

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


def group_trace(trace: Trace, group_size: int, cost: float = 0.0) -> Trace:
    """A trace of ranks as one of their replica groups (``advise --group-size``): group g
    holds the trace's workers g G .. g G + G - 1 in id order, and each unit (run, iteration,
    micro-batch) of a group is :func:`group_unit_times` of its ranks' units (a rank without
    that unit, e.g. a micro-batch DropCompute cut, is left out of the max; a group with none
    has no row). A group's unit is censored when one of its ranks' is (the max is then a
    lower bound too), computed ``samples`` add up over its ranks, and its ``noncompute`` is
    the least of its ranks' (the slowest rank's wait: the round's T^c, the least over all
    workers, is unchanged)."""
    ids = np.unique(trace.worker)
    groups = check_grouping(ids.size, group_size, cost)
    column = np.searchsorted(ids, trace.worker)
    zeros = np.zeros(trace.worker.size, dtype=np.int64)
    run = zeros if trace.run is None else trace.run
    micro = zeros if trace.micro_batch is None else trace.micro_batch
    keys, row = np.unique(np.stack([run, trace.iteration, micro]), axis=1, return_inverse=True)
    row = row.ravel()

    def dense(values: np.ndarray, fill: float) -> NDArray[np.float64]:
        table = np.full((keys.shape[1], ids.size), fill)
        table[row, column] = values
        return table

    # the one rule on the units; a missing unit (-inf) never wins a max and stays -inf alone
    seconds = group_unit_times(dense(trace.seconds, -np.inf), group_size, cost)
    unit, group = np.nonzero(np.isfinite(seconds))

    def by_max(values: np.ndarray | None) -> np.ndarray | None:
        if values is None:
            return None
        return group_unit_times(dense(values.astype(float), -np.inf), group_size)[unit, group]

    samples = None
    if trace.samples is not None:
        table = dense(trace.samples.astype(float), 0.0).reshape(-1, groups, group_size)
        samples = table.sum(axis=2)[unit, group].astype(np.int64)
    noncompute = None
    if trace.noncompute is not None:  # the least of the recorded (NaN: none recorded)
        least = -by_max(np.where(np.isnan(trace.noncompute), -np.inf, -trace.noncompute))
        noncompute = np.where(np.isfinite(least), least, np.nan)
    censored = by_max(trace.censored)
    return Trace(
        iteration=keys[1, unit],
        worker=group.astype(np.int64),
        micro_batch=None if trace.micro_batch is None else keys[2, unit],
        seconds=seconds[unit, group],
        censored=None if censored is None else censored > 0,
        noncompute=noncompute,
        samples=samples,
        run=None if trace.run is None else keys[0, unit],
    )


def write_group_trace(path: Path, trace: Trace, group_size: int, cost: float = 0.0) -> Trace:
    """:func:`group_trace` written to ``path`` in the trace format; returns it."""
    grouped = group_trace(trace, group_size, cost)
    columns = [grouped.iteration, grouped.worker]
    columns += [] if grouped.micro_batch is None else [grouped.micro_batch]
    columns += [] if grouped.censored is None else [grouped.censored]
    columns += [grouped.seconds]
    columns += [] if grouped.noncompute is None else [grouped.noncompute]
    columns += [] if grouped.samples is None else [grouped.samples]
    columns += [] if grouped.run is None else [grouped.run]
    write_trace_rows(
        path,
        np.column_stack(columns).astype(np.float64),
        grouped.micro_batch is not None,
        censored=grouped.censored is not None,
        noncompute=grouped.noncompute is not None,
        samples=grouped.samples is not None,
        run=grouped.run is not None,
    )
    return grouped
