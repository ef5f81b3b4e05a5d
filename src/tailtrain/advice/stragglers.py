"""Who is slow in a trace: per-worker iteration times, judged by the one persistence rule.

From a trace's per-worker iteration times t[i, w] (the sum of the micro-batches of worker w's
i-th recorded iteration), :func:`score_workers` applies :mod:`tailtrain.persistence`, the rule
the probe applies live (score in NVIDIA's 0..1 sense, persistent / intermittent / healthy), so
that a probe's verdicts and ``advise DIR``'s on its trace agree. A trace with fewer than
:data:`MIN_ITERATIONS` iterations per worker is flagged as too short to trust.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from tailtrain.delays.trace import Replay
from tailtrain.errors import UsageError
from tailtrain.persistence import Slowness, classify_workers

MIN_ITERATIONS = 30  #: fewer recorded iterations per worker: too short to trust


def iteration_times(replay: Replay) -> tuple[NDArray[np.float64], list[str]]:
    """t[i, w]: trace worker w's i-th recorded iteration (its micro-batches summed), over the
    iterations every worker recorded; and notes when the workers' lengths differ."""
    length = int(replay.lengths.min())
    notes = []
    if replay.lengths.max() != length:
        notes.append(
            f"workers recorded {length}..{int(replay.lengths.max())} iterations; the scores "
            f"use the first {length} of each"
        )
    return replay.seconds[:, :length, :].sum(axis=2).T, notes


def score_workers(times: NDArray[np.float64], ids: NDArray[np.int64]) -> list[Slowness]:
    """Score and classify every worker from ``times[i, w]`` (worker ids ``ids``)."""
    iterations, workers = times.shape
    if iterations < 2 or workers < 2:
        raise UsageError(
            f"the trace has {workers} worker(s) and {iterations} iteration(s) in common; "
            "scoring stragglers needs at least 2 of each"
        )
    return classify_workers(times, ids)
