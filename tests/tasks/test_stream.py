"""The data stream's carry-over (``tasks.stream.CarryOver``): micro-batches a threshold cuts
are dealt first in the next step, so every micro-batch of the stream is computed exactly once,
and nothing cut means sync's rounds as they are. A parameter server's jobs drawn a block at a
time (``JobDraws``) are the jobs ``job_batches`` draws one by one."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tailtrain.tasks.partition import PartitionState
from tailtrain.tasks.stream import CarryOver, JobDraws, deal, job_batches


class NumberedDraws:
    """Round r's micro-batches numbered r N M .. (r + 1) N M - 1, worker-major (B = 1)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def round(self, index: int, units: int) -> np.ndarray:
        per_round = self.n * units
        return np.arange(index * per_round, (index + 1) * per_round).reshape(self.n, units, 1)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 5), st.integers(2, 6), st.data())
def test_every_micro_batch_is_computed_exactly_once(n, m, data):
    draws, carry = NumberedDraws(n), CarryOver()
    computed = []
    for _ in range(data.draw(st.integers(1, 8))):
        # any shares of at least one, summing to N M: cut 1..N M - 1 at N - 1 points
        cuts = data.draw(st.sets(st.integers(1, max(1, n * m - 1)), min_size=n - 1, max_size=n - 1))
        shares = np.diff([0, *sorted(cuts), n * m])
        dealt = deal(carry.global_batch(draws, n, m), shares)
        done = np.array([data.draw(st.integers(0, s)) for s in shares])
        kept = carry.cut(dealt, shares, done)
        assert kept == int((shares - done).sum())
        for rank in range(n):
            computed.extend(dealt[rank, : done[rank], 0].tolist())
    every = sorted(computed + carry.queue.reshape(-1).tolist())
    assert every == list(range(carry.taken))  # the stream's prefix, each once


def test_nothing_cut_is_syncs_rounds_as_they_are():
    draws, carry = NumberedDraws(3), CarryOver()
    for index in range(3):
        batch = carry.global_batch(draws, 3, 4)
        np.testing.assert_array_equal(batch, draws.round(index, 4))
        carry.cut(deal(batch, np.array([4, 4, 4])), np.array([4, 4, 4]), np.array([4, 4, 4]))
    assert carry.taken == 3 * 12 and len(carry.queue) == 0


@settings(max_examples=40, deadline=None)
@given(
    st.integers(1, 6), st.lists(st.lists(st.integers(0, 300), min_size=1, max_size=8), max_size=6)
)
def test_job_draws_are_the_jobs_drawn_one_by_one(n, reads):
    # shards of unequal sizes; reads in any order, a worker's jobs near and far apart
    sizes = np.arange(3, 3 + n)
    part = PartitionState(np.arange(int(sizes.sum())), np.cumsum(sizes) - sizes, sizes)
    drawn = JobDraws(part, 7, 4, n)
    for jobs in reads:
        jobs = np.array(jobs, dtype=np.int64)
        workers = np.arange(jobs.size, dtype=np.int64) % n
        got = drawn.batches(workers, jobs)
        assert np.array_equal(got, job_batches(part, 7, 4, workers, jobs)[:, 0])
