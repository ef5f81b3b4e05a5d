"""The keyed data stream: which training examples worker w's j-th job sees, for a seed.

Every engine draws mini-batches here, so worker w's j-th job (its j-th gradient, or its
j-th allreduce round) sees the same data under every strategy and in the runtime.
"""

from __future__ import annotations

import numpy as np


def job_batches(
    partition, seed: int, batch: int, workers: np.ndarray, jobs: np.ndarray, units: int = 1
) -> np.ndarray:
    """Train indices (R, units, B) of job ``jobs[r]`` of worker ``workers[r]``.

    Each job has its own stream keyed by (seed, worker, job), so a job sees the same data
    whatever else the strategy does; draws are uniform with replacement from the worker's
    shard, all in one vectorised call.
    """
    workers = np.asarray(workers, dtype=np.uint64)
    jobs = np.asarray(jobs, dtype=np.uint64)
    draw = np.arange(units * batch, dtype=np.uint64).reshape(1, units, batch)
    # distinct (seed, worker, job) give distinct keys for workers < 2^24 and jobs < 2^40
    key = splitmix64(np.uint64(seed)) ^ (workers << np.uint64(40)) ^ jobs
    u = keyed_uniform(key[:, None, None], draw)
    sizes = partition.sizes[workers.astype(np.int64)][:, None, None]
    offsets = np.minimum((u * sizes).astype(np.int64), sizes - 1)
    return partition.pool[partition.starts[workers.astype(np.int64)][:, None, None] + offsets]


def keyed_uniform(key: np.ndarray, counter: np.ndarray) -> np.ndarray:
    """Uniform [0, 1) doubles, a pure function of (key, counter), vectorised.

    Hand-written because numpy has no vectorised keyed (counter-based) generator and one
    seeded Generator per job costs more than the gradient bookkeeping it serves: this is the
    SplitMix64 finaliser (Steele, Lea and Flood, 2014) applied twice, to key then counter.
    """
    with np.errstate(over="ignore"):
        x = splitmix64(splitmix64(key) + counter)
    return (x >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


def splitmix64(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))
