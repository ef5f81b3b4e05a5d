"""``--comm-time`` has one meaning per topology, and ``predict`` and ``simulate`` share it.

A parameter-server job is a round trip (pull, compute, push): compute + T^c, T^c drawn per job
from its own stream. An allreduce pays T^c once per update, after the compute.
"""

from __future__ import annotations

from functools import cache

import numpy as np
import pytest

from tailtrain.core.scenario import Scenario
from tailtrain.delays import parse_delay
from tailtrain.delays.comm import parse_comm_time
from tailtrain.delays.schedule import JobDurations
from tailtrain.prediction import DelayScenario, predict
from tailtrain.sim.run import simulate
from tailtrain.strategies.registry import parse_strategy

Z = 4.0
DELAY = "shifted-exp:shift=0,scale=1"


def step_times(strategy: str, *, workers: int, comm: str | None, iterations: int) -> np.ndarray:
    """Virtual duration of every update of a timing-only run (seed 0)."""
    scenario = Scenario(
        task="none", workers=workers, delay=DELAY, comm_time=comm, iterations=iterations
    )
    record = simulate(scenario, parse_strategy(strategy), 0)
    return np.diff(record.column("time"), prepend=0.0)


def test_sync_and_dropcompute_without_threshold_agree_under_constant_comm():
    """Both wait for every worker: max_i (X_i + c) = max_i X_i + c on the same draws."""
    kw = dict(workers=16, comm="1", iterations=300)
    sync = step_times("sync", **kw)
    allreduce = step_times("dropcompute:threshold=inf", **kw)
    np.testing.assert_allclose(sync, allreduce, rtol=1e-12, atol=1e-12)
    # and the comm time is charged once per update on top of the same compute draws
    without = step_times("sync", workers=16, comm=None, iterations=300)
    np.testing.assert_allclose(sync, without + 1.0, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("strategy", ["k-sync:k=3", "k-batch-async:k=3"])
def test_random_comm_is_drawn_per_round_trip_from_its_own_stream(strategy):
    """A random T^c: same seed, same run; the compute draws do not move (E[T] only grows)."""
    kw = dict(workers=8, iterations=400)
    once = step_times(strategy, comm="exp:rate=4", **kw)
    np.testing.assert_array_equal(once, step_times(strategy, comm="exp:rate=4", **kw))
    assert once.sum() > step_times(strategy, comm=None, **kw).sum()


@cache
def predicted(workers: int, comm: str) -> dict[tuple[str, int], tuple[float, float, float]]:
    """(strategy, K) -> (E[T], its standard error, DropCompute's tau* or NaN)."""
    scenario = DelayScenario(workers=workers, delay=parse_delay(DELAY), comm=parse_comm_time(comm))
    return {
        (r.strategy, r.k): (r.iteration_time, r.iteration_time_stderr, r.threshold or np.nan)
        for r in predict(scenario).rows
    }


def batch_means(times: np.ndarray, batches: int = 20) -> tuple[float, float]:
    """Mean after a 10% warm-up and its standard error from batch means (updates correlate)."""
    kept = times[times.size // 10 :]
    means = kept[: kept.size // batches * batches].reshape(batches, -1).mean(axis=1)
    return float(kept.mean()), float(means.std(ddof=1) / np.sqrt(batches))


N = 8
FAMILIES = [
    ("sync", ("sync", N)),
    ("k-sync:k=4", ("k-sync", 4)),
    ("k-batch-sync:k=4", ("k-batch-sync", 4)),
    ("k-async:k=4", ("k-async", 4)),
    ("k-batch-async:k=4", ("k-batch-async", 4)),
    ("async", ("async", 1)),
    ("dropcompute", ("dropcompute", N)),
]


@pytest.mark.parametrize("comm", ["1", "shifted-exp:shift=0.5,scale=0.5"])
@pytest.mark.parametrize(("strategy", "row"), FAMILIES)
def test_predict_agrees_with_simulate_with_comm_time(strategy, row, comm):
    mean, stderr, tau = predicted(N, comm)[row]
    if strategy == "dropcompute":
        strategy = f"dropcompute:threshold={tau!r}"
    simulated, sim_stderr = batch_means(step_times(strategy, workers=N, comm=comm, iterations=3000))
    assert abs(simulated - mean) <= Z * np.hypot(stderr, sim_stderr), (simulated, mean)


class Slowed:
    """Every compute draw is 1 s, and every worker runs twice as slow (a pattern's factor)."""

    def next_block(self, iterations: int) -> np.ndarray:
        return np.ones((iterations, 3))

    def time_factor(self, starts: np.ndarray, workers: np.ndarray) -> np.ndarray:
        return np.full(workers.size, 2.0)


def test_a_slowdown_scales_the_compute_but_not_the_round_trip():
    durations = JobDurations(Slowed(), 3, parse_delay("const:value=0.25"), seed=0)
    workers = np.arange(3)
    np.testing.assert_array_equal(durations.peek(workers, np.zeros(3)), np.full(3, 2.25))
