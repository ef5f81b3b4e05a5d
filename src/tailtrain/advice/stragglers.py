"""Who is slow: a robust per-worker slowness score and a verdict per worker.

From a trace's per-worker iteration times t[i, w] (the sum of the micro-batches of worker w's
i-th recorded iteration):

* ``slowdown``: the median over iterations of t[i, w] / median_v t[i, v], the worker's time
  relative to the median worker of the same iteration (robust to heavy-tailed noise and to
  iterations that are slow for everyone).
* ``score``: 0..1 relative to the best worker, as NVIDIA's resiliency extension scores ranks:
  min_v slowdown_v / slowdown_w (1 = as fast as the fastest worker, 1/3 = three times slower).
* ``slower_share``: the share of iterations in which the worker is slower than the median
  worker, with ``p_value`` the one-sided sign test of that share against 1/2.
* ``tail_share``: the share of its iterations in the pooled top decile of the ratios, with
  ``tail_p_value`` its one-sided binomial test against 1/10.

Verdicts: **persistent** (always slow: fix or replace the node) when slower_share >=
:data:`PERSISTENT_SHARE`, slowdown >= :data:`PERSISTENT_SLOWDOWN` and the sign test rejects at
:data:`LEVEL` / W (Bonferroni over workers); **intermittent** when not persistent but its tail
share is significantly above 1/10 at the same level; **healthy** otherwise. A trace with fewer
than :data:`MIN_ITERATIONS` iterations per worker is flagged as too short to trust.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray
from scipy import stats

from tailtrain.delays.trace import Replay
from tailtrain.errors import UsageError

PERSISTENT_SHARE = 0.9  #: slower than the median worker in at least this share of iterations
PERSISTENT_SLOWDOWN = 1.2  #: and at least this much slower in the median iteration
LEVEL = 1e-3  #: family-wise test level (split over the workers)
SLOW_QUANTILE = 0.9  #: pooled quantile of the ratios that marks a slow iteration
MIN_ITERATIONS = 30  #: fewer recorded iterations per worker: too short to trust


@dataclass(frozen=True)
class WorkerScore:
    """One trace worker's slowness (see the module docstring)."""

    worker: int
    score: float
    slowdown: float
    median_seconds: float
    slower_share: float
    p_value: float
    tail_share: float
    tail_p_value: float
    verdict: str

    def as_dict(self) -> dict[str, float | int | str]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


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


def score_workers(times: NDArray[np.float64], ids: NDArray[np.int64]) -> list[WorkerScore]:
    """Score and classify every worker from ``times[i, w]`` (worker ids ``ids``)."""
    iterations, workers = times.shape
    if iterations < 2 or workers < 2:
        raise UsageError(
            f"the trace has {workers} worker(s) and {iterations} iteration(s) in common; "
            "scoring stragglers needs at least 2 of each"
        )
    middle = np.median(times, axis=1, keepdims=True)
    ratio = times / np.where(middle > 0, middle, 1.0)
    slowdown = np.median(ratio, axis=0)
    slower = (ratio > 1.0).sum(axis=0)
    tail = (ratio > np.quantile(ratio, SLOW_QUANTILE)).sum(axis=0)
    p_slower = stats.binom.sf(slower - 1, iterations, 0.5)
    p_tail = stats.binom.sf(tail - 1, iterations, 1 - SLOW_QUANTILE)
    level = LEVEL / workers
    persistent = (
        (slower >= PERSISTENT_SHARE * iterations)
        & (slowdown >= PERSISTENT_SLOWDOWN)
        & (p_slower < level)
    )
    intermittent = ~persistent & (p_tail < level)
    verdict = np.where(persistent, "persistent", np.where(intermittent, "intermittent", "healthy"))
    score = slowdown.min() / np.maximum(slowdown, 1e-300)
    columns = zip(
        ids.tolist(),
        score,
        slowdown,
        np.median(times, axis=0),
        slower / iterations,
        p_slower,
        tail / iterations,
        p_tail,
        verdict.tolist(),
        strict=True,
    )
    return [WorkerScore(w, *map(float, values[:-1]), values[-1]) for w, *values in columns]
