"""Local-SGD with and without DropCompute (DropCompute App. B.3) against a plain reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tailtrain.core.scenario import Scenario
from tailtrain.delays import DelayProcess
from tailtrain.errors import UsageError
from tailtrain.sim.run import simulate
from tailtrain.strategies.registry import parse_strategy
from tailtrain.tasks import parse_partition, parse_task
from tailtrain.tasks.stream import job_batches


def unit_times(delay: str, seed: int, n: int, m: int | None, h: int, rounds: int) -> np.ndarray:
    """The engine's draws: one delay-process iteration per local step, (rounds, N, H*M)."""
    rows = DelayProcess(delay, "iid", seed, n, m).next_block(64)[: rounds * h]
    rows = rows if rows.ndim == 3 else rows[:, :, None]
    return rows.reshape(rounds, h, n, -1).transpose(0, 2, 1, 3).reshape(rounds, n, -1)


def units_started(times: np.ndarray, tau: float) -> np.ndarray:
    """App. B.3's check at each unit boundary: unit u runs iff the time before it is <= tau."""
    before = np.cumsum(times, axis=-1) - times
    return (before <= tau).sum(axis=-1)


def reference_local_sgd(task, scenario, seed, h, m, tau, divide_by):
    """Each worker: up to H local steps of M micro-batches, checked at tau before each; average."""
    n, lr = scenario.workers, scenario.lr
    partition = parse_partition("iid").assign(task, n, np.random.default_rng(seed))
    times = unit_times(scenario.delay, seed, n, m, h, scenario.iterations)
    theta = task.init_params(seed)
    for r in range(scenario.iterations):
        done = units_started(times[r], tau)
        moves, total = [], 0
        for w in range(n):
            # the simulator's per-(worker, round) data stream
            idx = job_batches(
                partition, seed, task.batch_size, np.array([w]), np.array([r]), h * m
            )[0]
            local = theta.clone()
            for step in range(h):
                count = int(np.clip(done[w] - step * m, 0, m))
                if count == 0:
                    break
                grads = [task.grads(local, idx[step * m + j][None])[1][0] for j in range(count)]
                local = local - lr * torch.stack(grads).sum(0) / m
            moves.append(theta - local)
            total += done[w]
        moved = torch.stack(moves)
        if divide_by == "m":
            theta = theta - moved.mean(0)
        else:
            theta = theta - moved.sum(0) * (h * m) / max(total, 1)
    return theta


@pytest.mark.parametrize(
    ("spec", "tau", "divide_by"),
    [
        ("local-sgd:period=3", np.inf, "m"),
        ("local-sgd:period=3,threshold=2.5", 2.5, "m"),
        ("local-sgd:period=3,threshold=2.5,divide-by=computed", 2.5, "computed"),
    ],
)
def test_local_sgd_matches_a_per_worker_reference(spec, tau, divide_by):
    scenario = Scenario(
        task="logreg",
        workers=3,
        delay="exp:rate=2",
        micro_batches=2,
        lr=0.05,
        iterations=4,
        eval_every=4,
    )
    record = simulate(scenario, parse_strategy(spec), 7)
    task = parse_task("logreg", seed=7)
    theta = reference_local_sgd(task, scenario, 7, 3, 2, tau, divide_by)
    expected = task.evaluate(theta)
    for key in ("train_loss", "eval_loss"):
        assert record.evals[-1][key] == pytest.approx(expected[key], rel=1e-5)
    if np.isfinite(tau):
        assert any(min(r["completed"]) < 6 for r in record.steps)  # something was dropped


@pytest.mark.parametrize("stop", ["", ",stop=between", ",stop=preempt"])
def test_threshold_is_compared_at_each_local_step(stop):
    """One unit per local step. By default (App. B.3) a worker starts a local step iff its
    compute time so far is <= tau, and the step in flight finishes; stop=preempt cuts it."""
    scenario = Scenario(task="none", workers=5, delay="exp:rate=1", iterations=6)
    spec = "local-sgd:period=4,threshold=3" + stop
    record = simulate(scenario, parse_strategy(spec), 2)
    times = unit_times("exp:rate=1", 2, 5, None, 4, 6)
    partial = np.cumsum(times, axis=2)
    if stop == ",stop=preempt":
        expected = (partial < 3).sum(axis=2)
        compute = np.minimum(partial[:, :, -1], 3).max(axis=1)
    else:
        expected = units_started(times, 3)
        ends = np.take_along_axis(partial, np.maximum(expected - 1, 0)[..., None], axis=2)
        compute = np.where(expected > 0, ends[..., 0], 0).max(axis=1)
    assert [r["completed"] for r in record.steps] == expected.tolist()
    np.testing.assert_allclose(record.column("compute_time"), compute, rtol=1e-12)
    assert set(record.column("local_steps")) == {4}


def test_plain_local_sgd_never_drops():
    scenario = Scenario(task="none", workers=4, delay="exp:rate=1", iterations=5)
    record = simulate(scenario, parse_strategy("local-sgd:period=2"), 0)
    assert record.summary["drop_rate"] == 0.0 and record.summary["effective_speedup"] == 1.0
    assert all(r["completed"] == [2] * 4 for r in record.steps)


def test_parsing():
    rule = parse_strategy("local-sgd:period=4,drop-rate=0.05,calibrate=3")
    assert rule.name == "local-sgd" and rule.period == 4 and rule.drop_rate == 0.05
    assert np.isinf(parse_strategy("local-sgd:period=2").threshold)
    assert parse_strategy("local-sgd:period=2,threshold=auto").threshold is None
    for bad in ("local-sgd", "local-sgd:period=0", "local-sgd:period=2,compensate=larger-batch"):
        with pytest.raises(UsageError):
            parse_strategy(bad)
