"""The partial-collective topology's ledger, shared by the simulator (``sim.partial``) and the
runtime (``runtime.partial.collective``, ``runtime.partial.rounds``, ``runtime.drills.microbench``):
the protocol's facts (how many hops an activation takes, which rank counts a quorum round), a
round's record row (``round_row``; its ``StepStats`` are ``core.update.closed_step_stats``'),
the run summary of its rounds, and what a collective microbenchmark reports.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from tailtrain.core.records import RunRecord
from tailtrain.strategies.base import StepStats
from tailtrain.strategies.eager import Collective, RoundPlan


def activation_hops(processes: int) -> int:
    """⌈log2 P⌉: hops of the activation broadcast to P processes (0 for one process)."""
    return max(0, int(processes - 1).bit_length())


def counter_of(round_index: int, processes: int) -> int:
    """The rank that counts the calls of quorum round ``round_index`` (it rotates, so no rank
    carries every round; ``runtime.partial.collective``); rounds may be an integer array."""
    return round_index % processes


#: a round row's columns, in order, as both engines write them (``round_row``)
ROW = (
    "step",
    "time",
    "k",
    "lr",
    "loss",
    "workers",
    "staleness",
    "nap",
    "quorum",
    "collective",
    "initiator",
    "model_sync",
    "arrivals",
)
#: columns only the simulator writes: ``models``, the distinct models across the workers
#: (eager-SGD's drift without model averaging); the runtime cannot count them without another
#: gather of every rank's parameters per round
SIMULATED_ONLY = ("models",)
#: columns only the runtime writes: every rank that activated the round (``initiators``: ranks
#: racing to initiate are real, the simulator's network resolves one), the ranks that joined
#: (``active``) and the seconds the activation took to reach them (``reach``), both measured;
#: the simulator's rows stay as they are, byte for byte (tests/golden)
MEASURED_ONLY = ("initiators", "active", "reach")


def round_row(
    stats: StepStats,
    plan: RoundPlan,
    workers: np.ndarray,
    staleness: np.ndarray,
    nap: int,
    initiator: int,
    only: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The ``ROW`` columns of a round, with the columns only this engine fills (``only``,
    keys from ``SIMULATED_ONLY`` or ``MEASURED_ONLY``): ``models`` goes before ``arrivals``
    (the simulator's order), the measured ones after it."""
    only = only or {}
    if not set(only) <= {*SIMULATED_ONLY, *MEASURED_ONLY}:
        raise ValueError(f"undeclared round-row columns: {sorted(set(only))}")
    row: dict[str, Any] = {
        "step": stats.step,
        "time": stats.time,
        "k": nap,
        "lr": stats.lr,
        "loss": stats.loss,
        "workers": workers.astype(int).tolist(),
        "staleness": staleness.astype(int).tolist(),
        "nap": nap,
        "quorum": plan.k,
        "collective": plan.collective.value,
        "initiator": initiator,
        "model_sync": plan.average_models,
    }
    row.update({c: only[c] for c in SIMULATED_ONLY if c in only})
    row["arrivals"] = len(stats.arrivals)
    row.update({c: only[c] for c in MEASURED_ONLY if c in only})
    return row


def summarise(record: RunRecord) -> dict[str, float]:
    """Run-level NAP and staleness of partial-collective rounds (the runtime's too)."""
    if not record.steps:
        return {}
    stale = [s for row in record.steps for s in row["staleness"]]
    return {
        "mean_nap": float(record.column("nap").mean()),
        "mean_staleness": float(np.mean(stale)) if stale else 0.0,
        "max_staleness": int(max(stale, default=0)),
    }


#: the order of the report: the synchronous baseline first
BENCHMARKED = (Collective.ALLREDUCE, Collective.SOLO, Collective.MAJORITY, Collective.QUORUM)


@dataclass(frozen=True)
class CollectiveStats:
    """Mean latency (seconds per process and call) and mean NAP of one collective."""

    latency: float
    nap: float
