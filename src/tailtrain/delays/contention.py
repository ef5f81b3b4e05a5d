"""Ranks that outnumber their cores: the step's timeline under processor sharing.

When N ranks run on C < N cores, the operating system shares the cores among the ranks that
are still computing: each of the r ranks running at an instant advances at min(1, C / r) of
a core (egalitarian processor sharing, Kleinrock, *Queueing Systems* Vol. 2, Sec. 4.4). In a
synchronous step every rank starts its micro-batches together; as the fast ones finish and
wait at the all-reduce, the slow ones get their cores and speed up. A trace recorded so
shows a step's late micro-batches faster than its first, and a rank's unit times are not
independent of the others': the rank that is behind is the one that runs alone. On seq-lstm's
sync trace (4 ranks, 2 cores) the median micro-batch took 22.3 ms at position 1 and 15.9 ms
at position 3; their work on 2 shared cores is 11.0-11.2 ms at every position.

:func:`unshared_work` turns a step's recorded durations into each unit's *work* (the
seconds it would take with a core of its own), and :func:`shared_durations` runs the
inverse: the durations a set of works takes when the ranks start together and share C
cores. ``shared_durations(unshared_work(x, C), C)`` is ``x``. ``delays.censored`` completes
a threshold's cut units in work and times them again, so that a completed step runs under
the contention it would have had (issue 36).

Layout: arrays (steps, ranks, units) in each rank's order; a unit of 0 s (a rank with fewer
units in that step) takes no time and changes nothing.
"""

from __future__ import annotations

import numpy as np

from tailtrain.delays.base import FloatArray


def _speed(running: np.ndarray, cores: int) -> np.ndarray:
    """Each running rank's share of a core when ``running`` ranks share ``cores``."""
    return np.minimum(1.0, cores / np.maximum(running, 1))


def unshared_work(seconds: FloatArray, cores: int) -> FloatArray:
    """The work of each unit of ``seconds`` (steps, ranks, units), recorded with the ranks
    starting each step together on ``cores`` shared cores: the integral of its rank's speed
    over the unit's interval, the speed falling to min(1, C / r) while r ranks run."""
    seconds = np.asarray(seconds, dtype=float)
    steps, ranks, _ = seconds.shape
    end = np.cumsum(seconds, axis=2)
    start = end - seconds
    # between the k-th and (k+1)-th finish of the step, ranks - k ranks run
    finish = np.sort(end[:, :, -1], axis=1)
    edges = np.concatenate([np.zeros((steps, 1)), finish], axis=1)
    speeds = _speed(ranks - np.arange(ranks), cores)

    def done_by(t: np.ndarray) -> np.ndarray:
        # work a rank running throughout [0, t] has done: the speed integrated segment-wise
        total = np.zeros_like(t)
        for k in range(ranks):
            low, high = edges[:, k, None, None], edges[:, k + 1, None, None]
            total += speeds[k] * np.clip(np.minimum(t, high) - low, 0.0, None)
        return total

    return done_by(end) - done_by(start)


def shared_durations(work_seconds: FloatArray, cores: int) -> FloatArray:
    """The seconds each unit of ``work_seconds`` (steps, ranks, units) takes when every
    step's ranks start together and share ``cores`` cores (the inverse of
    :func:`unshared_work`): an event-driven run, one event per unit finished, vectorised over
    the steps."""
    whole = np.asarray(work_seconds, dtype=float)
    if cores < 1 or not np.isfinite(whole).all() or (whole < 0).any():
        raise ValueError(f"shared_durations: {cores} cores, or work not finite and >= 0")
    left = whole.copy()
    steps, ranks, units = left.shape
    taken = np.zeros_like(left)
    at = np.zeros((steps, ranks), dtype=np.int64)  # each rank's unit in progress
    row = np.arange(steps)[:, None]
    rank = np.arange(ranks)[None, :]

    def skip_empty() -> None:
        # a unit of no work ends the moment it starts
        while True:
            empty = (at < units) & (left[row, rank, np.minimum(at, units - 1)] <= 0.0)
            if not empty.any():
                return
            at[empty] += 1

    skip_empty()
    for _ in range(ranks * units):  # each event ends at least one unit
        running = at < units
        if not running.any():
            break
        speed = _speed(running.sum(axis=1), cores)[:, None] * running
        current = left[row, rank, np.minimum(at, units - 1)]
        # the next event of each step: the first of its running units to end
        until = np.where(running, current / np.where(running, speed, 1.0), np.inf)
        step = until.min(axis=1)
        step = np.where(np.isfinite(step), step, 0.0)
        i, r = np.nonzero(running)
        u = at[i, r]
        left[i, r, u] -= speed[i, r] * step[i]
        taken[i, r, u] += step[i]
        # the unit that set the event ends exactly; allow its rounding
        ended = left[i, r, u] <= 1e-9 * whole[i, r, u]
        left[i[ended], r[ended], u[ended]] = 0.0
        at[i[ended], r[ended]] += 1
        skip_empty()
    assert (at == units).all()  # every event ends a unit: ranks * units events end them all
    return taken
