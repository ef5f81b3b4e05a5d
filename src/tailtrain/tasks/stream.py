"""The keyed data stream: which training examples worker w's j-th job sees, for a seed.

Every engine draws mini-batches here, so worker w's j-th job (its j-th gradient, or its
j-th allreduce round) sees the same data under every strategy and in the runtime.
:class:`Draws` reads an allreduce run's rounds from it many rounds at a time, :class:`JobDraws`
a parameter server's jobs many jobs per worker at a time,
:func:`deal` hands a round's global batch out by per-rank shares (``strategies.rebalance``),
and :class:`CarryOver` re-deals the micro-batches a threshold cut in the next step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

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


class Draws:
    """The fresh micro-batches of every worker's rounds, drawn many rounds at a time.

    ``job_batches`` is keyed by (seed, worker, round), so a round's draws do not depend on
    which rounds are drawn with it; one vectorised call for ``ROUNDS`` rounds saves the
    runtime ~0.1-0.3 ms of numpy calls a round (its whole step may be 5 ms). Rebuilt from the
    scenario and seed, it is not part of a checkpoint.
    """

    #: rounds drawn in one call, unless that would exceed ``VALUES`` indices
    ROUNDS = 64
    VALUES = 1 << 18  # 2 MiB of indices per call

    def __init__(self, partition, seed: int, batch: int, n_workers: int) -> None:
        self.partition, self.seed, self.batch, self.n = partition, seed, batch, n_workers
        self.first, self.units = 0, 0
        self.rounds = np.empty((0, n_workers, 0, batch), dtype=np.int64)

    def round(self, index: int, units: int) -> np.ndarray:
        """Indices (N, units, B) of round ``index``, shared with later calls: not to be written."""
        if units != self.units or not self.first <= index < self.first + len(self.rounds):
            count = max(1, min(self.ROUNDS, self.VALUES // (self.n * units * self.batch)))
            workers = np.tile(np.arange(self.n), count)
            jobs = np.repeat(np.arange(index, index + count), self.n)
            drawn = job_batches(self.partition, self.seed, self.batch, workers, jobs, units)
            self.rounds = drawn.reshape(count, self.n, units, self.batch)
            self.first, self.units = index, units
        return self.rounds[index - self.first]


class JobDraws:
    """The mini-batches of each worker's next jobs, drawn many jobs at a time per worker.

    A parameter server's workers advance through their jobs at their own pace, so the blocks
    are per worker: worker w's jobs ``first[w]`` to ``first[w] + jobs - 1``. ``job_batches``
    is keyed by (seed, worker, job), so a job's draws do not depend on the block it was drawn
    in; one call for a block of jobs saves the simulator ~0.1 ms of numpy calls a step (of a
    few ms of gradients). Rebuilt from the scenario and seed, it is not part of a checkpoint.
    """

    #: jobs drawn per worker in one call, unless that would exceed ``Draws.VALUES`` indices
    JOBS = 64

    def __init__(self, partition, seed: int, batch: int, n_workers: int) -> None:
        self.partition, self.seed, self.batch = partition, seed, batch
        self.jobs = max(1, min(self.JOBS, Draws.VALUES // max(1, n_workers * batch)))
        # far below any job: every worker's first read draws its block
        self.first = np.full(n_workers, -(1 << 62), dtype=np.int64)
        self.blocks = np.zeros((n_workers, self.jobs, batch), dtype=np.int64)

    def batches(self, workers: np.ndarray, jobs: np.ndarray) -> np.ndarray:
        """Train indices (R, B) of job ``jobs[r]`` of worker ``workers[r]`` (int64 columns),
        a new array."""
        at = jobs - self.first[workers]
        miss = (at < 0) | (at >= self.jobs)
        if miss.any():
            self._draw(workers[miss], jobs[miss])
            at = jobs - self.first[workers]
            miss = (at < 0) | (at >= self.jobs)
            if miss.any():  # one worker's jobs too far apart for one block: draw them as they are
                out = np.empty((workers.size, self.batch), dtype=np.int64)
                out[~miss] = self.blocks[workers[~miss], at[~miss]]
                out[miss] = job_batches(
                    self.partition, self.seed, self.batch, workers[miss], jobs[miss]
                )[:, 0]
                return out
        return self.blocks[workers, at]

    def _draw(self, workers: np.ndarray, jobs: np.ndarray) -> None:
        """New blocks for ``workers``, each from the lowest of its ``jobs``."""
        order = np.lexsort((jobs, workers))
        workers, jobs = workers[order], jobs[order]
        first = np.ones(workers.size, dtype=bool)
        first[1:] = workers[1:] != workers[:-1]
        workers, jobs = workers[first], jobs[first]
        span = np.arange(self.jobs, dtype=np.int64)
        drawn = job_batches(
            self.partition,
            self.seed,
            self.batch,
            np.repeat(workers, self.jobs),
            (jobs[:, None] + span).reshape(-1),
        )
        self.blocks[workers] = drawn.reshape(workers.size, self.jobs, self.batch)
        self.first[workers] = jobs


def deal(batches: np.ndarray, shares: np.ndarray) -> np.ndarray:
    """The global batch sync would draw, ``batches`` (N, M, B), dealt by ``shares`` (sum N M).

    Its N M micro-batches, worker-major, go in order: rank n gets the ``shares[n]`` after
    the first sum_{k<n} shares[k], so every micro-batch of the step is computed once and
    equal shares give every rank its own draws. Out (N, max share, B); the rows past a
    rank's share repeat its last micro-batch and are never computed.
    """
    n, m, size = batches.shape
    flat = batches.reshape(n * m, size)
    first = np.cumsum(shares) - shares
    unit = np.minimum(np.arange(int(shares.max()))[None, :], shares[:, None] - 1)
    return flat[first[:, None] + unit]


@dataclass
class CarryOver:
    """Micro-batches a threshold cut, dealt first in the next step's global batch (issue 25).

    The fresh stream is sync's global batches one after another, N M micro-batches a round,
    worker-major. A step's global batch is the cut micro-batches ``queue`` (K, B), in order,
    then the next N M - K fresh ones (``taken`` counts the fresh ones dealt so far), so every
    micro-batch of the stream is computed exactly once, some a step later, and none is lost
    but the last step's cut. With nothing cut it is sync's round as it is (``taken`` = r N M).
    A dataclass of arrays and ints, so a checkpoint keeps it (``core.checkpoint.pack``).
    """

    taken: int = 0
    queue: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), dtype=np.int64))

    def global_batch(self, draws: Draws, n: int, m: int) -> np.ndarray:
        """This step's N M micro-batches (N, M, B): the carried ones, then fresh ones."""
        return self.take(draws, n, m, n * m).reshape(n, m, -1)

    def take(self, draws: Draws, n: int, m: int, count: int) -> np.ndarray:
        """The next ``count`` micro-batches (count, B): carried ones first, then fresh ones of
        the stream (sync's global batches of ``n`` ranks' ``m`` micro-batches one after
        another). What is not taken stays queued (a step dealt on demand may take fewer
        than were carried)."""
        rows = self.peek(draws, n, m, count)
        self.taken += max(0, count - len(self.queue))
        self.queue = self.queue[count:]
        return rows

    def peek(self, draws: Draws, n: int, m: int, count: int) -> np.ndarray:
        """What :meth:`take` would return, taking nothing: a runtime rank dealt on demand
        reads the step's micro-batches before it knows how many the step takes."""
        queued = self.queue[:count]
        need = count - len(queued)
        if not need:
            return queued
        per_round = n * m
        first, last = self.taken // per_round, (self.taken + need - 1) // per_round
        rounds = [draws.round(r, m).reshape(per_round, -1) for r in range(first, last + 1)]
        start = self.taken - first * per_round
        fresh = np.concatenate(rounds)[start : start + need]
        return np.concatenate([queued, fresh]) if len(queued) else fresh

    def keep(self, cut: np.ndarray) -> int:
        """Queue ``cut`` (K, B) after what is still queued, for the next step; how many."""
        self.queue = np.concatenate([self.queue, cut]) if len(self.queue) else cut
        return len(cut)

    def cut(self, dealt: np.ndarray, shares: np.ndarray, done: np.ndarray) -> int:
        """Keep every dealt micro-batch (N, max share, B) past its rank's ``done`` count,
        rank by rank, for the next step; how many."""
        kept = [dealt[rank, done[rank] : shares[rank]] for rank in range(len(shares))]
        self.queue = np.concatenate(kept)
        return len(self.queue)


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
