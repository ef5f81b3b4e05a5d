"""The partial-collective topology's ledger, shared by the simulator (``sim.partial``) and the
runtime (``runtime.partial``, ``runtime.eager``, ``runtime.microbench``): the protocol's facts
(how many hops an activation takes, which rank counts a quorum round), the run summary of its
rounds, and what a collective microbenchmark reports.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tailtrain.core.records import RunRecord
from tailtrain.strategies.eager import Collective


def activation_hops(processes: int) -> int:
    """⌈log2 P⌉: hops of the activation broadcast to P processes (0 for one process)."""
    return max(0, int(processes - 1).bit_length())


def counter_of(round_index: int, processes: int) -> int:
    """The rank that counts the calls of quorum round ``round_index`` (it rotates, so no rank
    carries every round; ``runtime.partial``); rounds may be an integer array."""
    return round_index % processes


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
