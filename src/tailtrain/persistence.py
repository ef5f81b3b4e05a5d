"""Who is slow, and how: the one persistence rule behind the probe's live verdicts and advise.

From ``t[i, w]``, worker w's own seconds of step i (the probe: data loading + compute up to its
gradients being ready, the wait for the others left out; a trace: the iteration's
micro-batches summed), every worker gets:

* ``reference[i, w]``: the median over the *other* workers of step i (leave-one-out). Under
  noise that treats the workers alike, a healthy worker is above it in half of the steps
  exactly, however large the noise, so the sign test below has an exact null on a loaded
  machine too; one or two slow ranks do not move it while they are fewer than half;
* ``ratio[i, w] = t[i, w] / reference[i, w]`` and ``slowdown``, its median over the steps;
* ``score`` = median_i reference[i, w] / median_i t[i, w], clipped to 1: a reference median
  over the worker's median, the 0..1 relative score of NVIDIA's resiliency extension
  (``nvidia_resiliency_ext.straggler``, there with the fastest rank as the reference):
  1 = as fast as the others, 0.5 = twice as slow;
* ``slower_share``: the share of steps with ratio > 1, ``p_value`` its one-sided sign test
  against 1/2;
* ``slow_windows``: the steps cut into consecutive windows of :data:`WINDOW`, the share of
  windows whose median ratio is at least 1 + (:data:`MIN_EFFECT` - 1) / 2 (half the effect:
  a window of 5 steps is noisier than the whole);
* ``stall_share``: the share of steps with ratio >= :data:`STALL_RATIO` (a stalled step),
  ``longest_stall`` the longest run of them, ``stall_p_value`` the smaller of two one-sided
  tests against the stall rate ``q`` of a healthy worker (the median stall share of the
  others, at least :data:`STALL_FLOOR`): the binomial tail of the count, and the union bound
  (n - L + 1) q^L of a run of L stalled steps (recurring stalls, or one long stall).

Per-sample times. Where the workers compute different numbers of samples per step (after
``rebalance`` deals a slow worker a smaller share, or under DropCompute), a worker's seconds
say how much work it was given, not how fast it is: a slow worker dealt a third of the samples
at a third of the speed takes as long as the others. :func:`per_sample_times` turns
``t[i, w]`` into seconds per sample whenever the samples per step are known and differ
between workers, and both the probe's live verdicts and ``advise`` feed the rule that, so
one rule judges both and a remedied straggler stays named.

Verdicts, at the family-wise level :data:`LEVEL` split over the workers (Bonferroni):

* **persistent** (always slow: fix or replace the node) when the slowdown is at least
  :data:`MIN_EFFECT`, the sign test rejects, and at least :data:`PERSISTENT_WINDOWS` of the
  windows are slow: the effect must be large, consistent step by step, and there in the
  windows across the run, not in one burst of a loaded machine;
* **intermittent** when not persistent and the stall test rejects (at half the level: two
  tests);
* **healthy** otherwise.

:data:`MIN_EFFECT` = 1.08 sits well below the 1.2x a detector must catch
(``bench/bench_detect.py``), where two 1.2x ranks of six measure 1.13x and more once a
loaded machine adds its own seconds to every rank's step, and above the slowdowns healthy
ranks show there (at most 1.04x; that bench reports them as ``healthy_slowdown``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
from numpy.typing import NDArray

MIN_EFFECT = 1.08  #: least median ratio to the others for a persistent verdict
PERSISTENT_WINDOWS = 0.75  #: least share of windows at half that effect or more
WINDOW = 5  #: steps per window
STALL_RATIO = 1.8  #: a stalled step takes at least this many times the others' median
STALL_FLOOR = 0.01  #: least stall rate assumed of a healthy worker
LEVEL = 1e-3  #: family-wise test level (split over the workers)


@dataclass(frozen=True)
class Slowness:
    """One worker's slowness and verdict (see the module docstring)."""

    worker: int  # the rank, or the trace's worker id
    score: float
    slowdown: float
    median_seconds: float
    slower_share: float
    p_value: float
    slow_windows: float
    stall_share: float
    longest_stall: int
    stall_p_value: float
    verdict: str

    def as_dict(self) -> dict[str, float | int | str]:
        return asdict(self)


def too_few_steps(s: Slowness, workers: int) -> bool:
    """Whether ``s`` reads as a persistent straggler its steps are too few to call one: slower
    by the persistent effect in (nearly) every step, yet the binomial test cannot reach its
    level over so few (a worker slower in all of T steps has p = 2^-T, the level is
    LEVEL / workers: T of about 10 + log2(workers) at least)."""
    return (
        s.verdict != "persistent"
        and s.slowdown >= MIN_EFFECT
        and s.slower_share >= 0.9
        and s.p_value >= LEVEL / workers
    )


def classify_workers(
    times: NDArray[np.float64], ids: NDArray[np.int64] | None = None
) -> list[Slowness]:
    """Every worker's slowness and verdict from ``times[i, w]`` (steps x workers, seconds;
    at least 2 of each), worker ids ``ids`` (default 0..W-1)."""
    from scipy.special import bdtrc  # on the first verdict: a rank that judges none never pays

    steps, workers = times.shape
    reference = _others_median(times)
    ratio = times / np.maximum(reference, 1e-300)
    slowdown = np.median(ratio, axis=0)
    median = np.median(times, axis=0)
    score = np.minimum(np.median(reference, axis=0) / np.maximum(median, 1e-300), 1.0)
    slower = (ratio > 1.0).sum(axis=0)
    p_slower = bdtrc(slower - 1, steps, 0.5)  # P(X >= slower), X ~ Bin(steps, 1/2)
    windows = np.array_split(ratio, max(steps // WINDOW, 1))
    half = 1 + (MIN_EFFECT - 1) / 2
    slow_windows = np.mean([np.median(w, axis=0) >= half for w in windows], axis=0)
    stalled = ratio >= STALL_RATIO
    longest = _longest_runs(stalled)
    p_stall = _stall_p_values(stalled, longest)
    level = LEVEL / workers
    persistent = (
        (slowdown >= MIN_EFFECT) & (p_slower < level) & (slow_windows >= PERSISTENT_WINDOWS)
    )
    intermittent = ~persistent & (p_stall < level / 2)
    verdict = np.where(persistent, "persistent", np.where(intermittent, "intermittent", "healthy"))
    ids = np.arange(workers) if ids is None else np.asarray(ids)
    columns = zip(
        ids.tolist(), score, slowdown, median, slower / steps, p_slower, slow_windows,
        stalled.mean(axis=0), longest.tolist(), p_stall, verdict.tolist(), strict=True,
    )  # fmt: skip
    return [
        Slowness(w, *map(float, values[:7]), int(values[7]), float(values[8]), values[9])
        for w, *values in columns
    ]


def per_sample_times(
    times: NDArray[np.float64], samples: NDArray[np.float64] | None
) -> tuple[NDArray[np.float64], bool]:
    """``times[i, w] / samples[i, w]`` and True when ``samples`` (steps x workers, the samples
    each worker computed in that step) is given and differs between the workers in some step;
    ``times`` unchanged and False otherwise (equal samples leave every ratio to the others as
    it is, and seconds per step read more naturally). Steps in which some worker computed no
    sample have no per-sample time and are left out; a NaN (a count not known) leaves
    ``times`` as they are. The one normalisation before :func:`classify_workers` (module
    docstring): the probe and ``advise`` both call it."""
    if samples is None:
        return times, False
    samples = np.asarray(samples, dtype=np.float64)
    if samples.shape != times.shape:
        raise ValueError(f"samples {samples.shape} and times {times.shape} differ in shape")
    if np.isnan(samples).any() or not (samples != samples[:, :1]).any():
        return times, False
    kept = (samples > 0).all(axis=1)
    return times[kept] / samples[kept], True


def _others_median(times: NDArray[np.float64]) -> NDArray[np.float64]:
    """reference[i, w]: the median of row i without column w."""
    # one median per worker: clearer than a sort trick, and W is a few ranks to a few hundred
    columns = [np.median(np.delete(times, w, axis=1), axis=1) for w in range(times.shape[1])]
    return np.stack(columns, axis=1)


def _stall_p_values(stalled: NDArray[np.bool_], longest: NDArray[np.int64]) -> NDArray:
    """Per worker, the smaller p-value of its stalled steps' count (binomial tail) and of its
    longest run of them (union bound over the run's starts), against the others' median
    stall share (at least STALL_FLOOR)."""
    from scipy.special import bdtrc

    steps, workers = stalled.shape
    share = stalled.mean(axis=0)
    rate = np.array(
        [max(float(np.median(np.delete(share, w))), STALL_FLOOR) for w in range(workers)]
    )
    count = stalled.sum(axis=0)
    p_count = bdtrc(count - 1, steps, rate)
    p_run = np.where(longest > 0, (steps - longest + 1) * rate**longest, 1.0)
    return np.minimum(np.minimum(p_count, p_run), 1.0)


def _longest_runs(flags: NDArray[np.bool_]) -> NDArray[np.int64]:
    """Per column, the longest run of True (steps x workers)."""
    steps, workers = flags.shape
    padded = np.zeros((steps + 2, workers), dtype=np.int8)
    padded[1:-1] = flags
    edges = np.diff(padded, axis=0)
    longest = np.zeros(workers, dtype=np.int64)
    for w in range(workers):  # a few workers: one diff each is clearer than a 2-D trick
        starts, ends = np.flatnonzero(edges[:, w] == 1), np.flatnonzero(edges[:, w] == -1)
        longest[w] = (ends - starts).max() if starts.size else 0
    return longest
