"""Live per-rank verdicts of a probe: who is slow over the last steps, and how.

From ``own[i, r]``, rank r's own seconds of step i (data loading + compute up to its gradients
being ready, the wait for the others left out: in a synchronous job every rank's *step* takes
the same time, so only the time before the sync point tells who is slow):

* the step's **reference** is the median over the fastest half of the ranks (the
  ceil(N/2) smallest); it stays a healthy rank's time while fewer than half are slow, where the
  median over all ranks drifts towards the slow ones (two slow ranks of four);
* ``ratio[i, r] = own[i, r] / reference[i]``, and the rank's **slowdown** is its median ratio;
* **score** = median_i reference[i] / median_i own[i, r], clipped to 1: the reference median
  over the rank's median, the relative performance score of NVIDIA's resiliency extension
  (``nvidia_resiliency_ext.straggler``: 1 = as fast as the reference, 0.5 = twice as slow),
  there with the fastest rank's median as the reference.

Verdicts: **persistent** when the slowdown is at least :data:`LIVE_SLOWDOWN` and the rank is
above half that excess (ratio > 1 + (LIVE_SLOWDOWN - 1) / 2) in at least :data:`LIVE_SHARE`
of the steps; **intermittent** when not persistent but it stalled, at least
:data:`STALL_RATIO` times the reference for :data:`STALL_STEPS` steps in a row; **healthy**
otherwise. The persistent thresholds sit at half of the smallest slowdown the benchmark must
catch (``bench/bench_detect.py``: 1.2x), and a stall must be large and last 4 steps: on a
loaded machine single steps of a healthy rank take 1.5x now and then (a late wake-up), so a
rank's noise has to be both large and lasting to raise a false alarm.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

LIVE_SLOWDOWN = 1.1  #: least median ratio to the reference for a persistent verdict
LIVE_SHARE = 0.8  #: least share of steps above half that excess
STALL_RATIO = 1.8  #: a stalled step takes at least this many reference times
STALL_STEPS = 4  #: consecutive stalled steps that make an intermittent verdict
LIVE_MIN_STEPS = 8  #: fewer steps: no verdict yet


@dataclass(frozen=True)
class RankVerdict:
    """One rank's verdict over a probe's recent steps (see the module docstring)."""

    rank: int
    score: float
    slowdown: float
    own_seconds: float  # median own seconds per step
    slow_share: float  # share of steps above 1 + (LIVE_SLOWDOWN - 1) / 2 references
    longest_stall: int  # most consecutive steps at >= STALL_RATIO references
    verdict: str

    def as_dict(self) -> dict[str, float | int | str]:
        return asdict(self)


def judge_ranks(own: np.ndarray) -> list[RankVerdict]:
    """Verdicts of every rank from ``own[i, r]`` (steps x ranks, seconds); none with fewer
    than :data:`LIVE_MIN_STEPS` steps or one rank."""
    steps, ranks = own.shape
    if steps < LIVE_MIN_STEPS or ranks < 2:
        return []
    half = (ranks + 1) // 2
    reference = np.median(np.partition(own, half - 1, axis=1)[:, :half], axis=1)
    ratio = own / np.maximum(reference, 1e-12)[:, None]
    slowdown = np.median(ratio, axis=0)
    share = (ratio > 1 + (LIVE_SLOWDOWN - 1) / 2).mean(axis=0)
    stall = _longest_runs(ratio >= STALL_RATIO)
    persistent = (slowdown >= LIVE_SLOWDOWN) & (share >= LIVE_SHARE)
    intermittent = ~persistent & (stall >= STALL_STEPS)
    verdict = np.where(persistent, "persistent", np.where(intermittent, "intermittent", "healthy"))
    median = np.median(own, axis=0)
    score = np.minimum(np.median(reference) / np.maximum(median, 1e-12), 1.0)
    return [
        RankVerdict(r, float(score[r]), float(slowdown[r]), float(median[r]),
                    float(share[r]), int(stall[r]), str(verdict[r]))
        for r in range(ranks)
    ]  # fmt: skip


def _longest_runs(flags: np.ndarray) -> np.ndarray:
    """Per column, the longest run of True (steps x ranks)."""
    steps, ranks = flags.shape
    padded = np.zeros((steps + 2, ranks), dtype=np.int8)
    padded[1:-1] = flags
    edges = np.diff(padded, axis=0)
    longest = np.zeros(ranks, dtype=np.int64)
    for r in range(ranks):  # a few ranks: one diff each is clearer than a 2-D trick
        starts, ends = np.flatnonzero(edges[:, r] == 1), np.flatnonzero(edges[:, r] == -1)
        longest[r] = (ends - starts).max() if starts.size else 0
    return longest
