"""The simulator's keyed data stream: each (seed, worker, job) has its own mini-batch."""

from __future__ import annotations

import numpy as np

from tailtrain.tasks import parse_partition, parse_task
from tailtrain.tasks.stream import job_batches, keyed_uniform


def test_keyed_uniform_is_uniform_and_pure():
    keys = np.arange(400, dtype=np.uint64)[:, None]
    counters = np.arange(500, dtype=np.uint64)[None, :]
    u = keyed_uniform(keys, counters).ravel()
    n = u.size
    assert ((u >= 0) & (u < 1)).all()
    assert abs(u.mean() - 0.5) < 4 * np.sqrt(1 / 12 / n)
    # a chi-square test over 20 equal bins at the 0.1% level (critical value 43.8 for 19 dof)
    counts = np.bincount((u * 20).astype(int), minlength=20)
    assert ((counts - n / 20) ** 2 / (n / 20)).sum() < 43.8
    assert np.array_equal(keyed_uniform(keys, counters).ravel(), u)


def test_job_batches_stay_in_shard_and_depend_only_on_their_key():
    task = parse_task("logreg")
    state = parse_partition("iid").assign(task, 6, np.random.default_rng(0))
    workers, jobs = np.array([0, 3, 5, 3]), np.array([7, 7, 2, 8])
    batches = job_batches(state, 1, 16, workers, jobs, units=2)
    assert batches.shape == (4, 2, 16)
    for row, w in enumerate(workers):
        assert np.isin(batches[row], state.shard(w)).all()
    alone = job_batches(state, 1, 16, workers[1:2], jobs[1:2], units=2)
    assert np.array_equal(alone[0], batches[1])
    assert not np.array_equal(batches[1], batches[3])  # another job of the same worker
    other_seed = job_batches(state, 2, 16, workers, jobs, units=2)
    assert not np.array_equal(other_seed, batches)
