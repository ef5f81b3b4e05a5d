"""The weighted allreduce on a one-rank gloo group, or with a stand-in group (the multi-rank
runs are in test_allreduce)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.distributed as dist

from tailtrain.errors import UsageError
from tailtrain.runtime.reduce import Collectives, PeerFailure, SumBuffer, contribute


@pytest.fixture
def one_rank():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield Collectives(0, 1, torch.device("cpu"), grace=0.0)
    dist.destroy_process_group()


@pytest.mark.timeout(60)
def test_weighted_sum_carries_the_weight_and_the_extras(one_rank):
    grad = torch.tensor([1.0, -2.0, 4.0])
    reduced = one_rank.weighted_sum(grad, 0.25, (3.0, 2.0))
    assert reduced.numerator.tolist() == [0.25, -0.5, 1.0]
    assert reduced.total == 0.25 and reduced.extras.tolist() == [3.0, 2.0]


class Alone:
    """A stand-in process group whose allreduce sums nothing in."""

    def allreduce(self, tensors, options):
        return None


@pytest.mark.timeout(60)
def test_rows_ride_on_the_weighted_sum_in_this_ranks_line():
    """Rank 2 of 4 with an all_reduce that sums nothing in: what comes back is this rank's own
    buffer, so each row must sit in line 2 of its (4, width) block, zeros elsewhere."""
    comm = Collectives(2, 4, torch.device("cpu"), grace=0.0, group=Alone())
    grad = torch.tensor([1.0, 2.0])
    rows = (np.array([3.0, np.nan]), np.array([4.0, 5.0, 6.0]))
    reduced = comm.weighted_sum(grad, 0.5, (7.0,), rows)
    counts, third = reduced.rows
    assert counts.shape == (4, 2) and third.shape == (4, 3)
    assert counts[2, 0] == 3.0 and np.isnan(counts[2, 1])
    assert not np.delete(counts, 2, axis=0).any()
    assert third.tolist() == [[0.0] * 3, [0.0] * 3, [4.0, 5.0, 6.0], [0.0] * 3]
    assert reduced.numerator.tolist() == [0.5, 1.0] and reduced.extras.tolist() == [7.0]
    assert reduced.total == 0.5


@pytest.mark.timeout(60)
def test_a_kept_buffer_serves_round_after_round(one_rank):
    """The runtime's form: the gradient computed into ``grad``, scaled there by a weight other
    than 1, the tail zeroed between rounds (a row left over would be summed again)."""
    buffer = SumBuffer(one_rank, 3, 2, [2], torch.float32)
    buffer.grad.copy_(torch.tensor([1.0, -2.0, 4.0]))
    first = one_rank.start(buffer, 0.5, (3.0, 1.0), (np.array([7.0, np.nan]),)).wait()
    assert first.numerator.tolist() == [0.5, -1.0, 2.0] and first.total == 0.5
    assert first.rows[0][0, 0] == 7.0 and np.isnan(first.rows[0][0, 1])
    buffer.grad.copy_(torch.tensor([2.0, 2.0, 2.0]))
    second = one_rank.start(buffer, 1.0, (1.0, 0.0), (np.array([8.0, 9.0]),)).wait()
    assert second.numerator.tolist() == [2.0, 2.0, 2.0] and second.total == 1.0
    assert second.extras.tolist() == [1.0, 0.0] and second.rows[0].tolist() == [[8.0, 9.0]]
    assert first.rows[0][0, 0] == 7.0  # what a round read stays: the rows are copies
    given = one_rank.start(buffer, 0.25, (0.0, 0.0), (np.zeros(2),), torch.ones(3)).wait()
    assert given.numerator.tolist() == [0.25] * 3  # a gradient given is scaled into ``grad``


def test_rows_given_as_lists_land_like_arrays_and_a_wrong_width_is_refused():
    """The runtime hands its rows over as lists and tuples (one write into the tail)."""
    comm = Collectives(1, 3, torch.device("cpu"), grace=0.0, group=Alone())
    buffer = SumBuffer(comm, 2, 1, [2, 1], torch.float32)
    buffer.fill(1.0, (5.0,), ([3, 0.5], (1.0,)))
    assert buffer.tail.tolist() == [1.0, 5.0, 0, 0, 3.0, 0.5, 0, 0, 0, 1.0, 0]
    with pytest.raises(ValueError, match="a row of 3 values for a block 2 wide"):
        buffer.fill(1.0, (5.0,), ([3, 0.5, 1.0], (1.0,)))


@pytest.mark.timeout(60)
def test_gather_returns_one_row_per_rank(one_rank):
    rows = one_rank.gather(np.array([2.0, 0.5, np.nan]))
    assert rows.shape == (1, 3) and rows[0, 0] == 2.0 and np.isnan(rows[0, 2])


@pytest.mark.timeout(60)
def test_a_failed_collective_is_a_peer_failure(one_rank):
    with pytest.raises(PeerFailure, match="all_gather"), one_rank._guard("all_gather"):
        raise RuntimeError("Connection closed by peer")


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "error",
    [ValueError("a hook's own"), UsageError("give x"), torch.OutOfMemoryError("out of memory")],
)
def test_an_error_of_the_callers_own_passes_the_guard_as_it_is(one_rank, error):
    """A user's gradient hook raising in the DDP hook's zero backward is not a dead peer."""
    one_rank.grace = 30.0  # a guard that waited would outlast the test's timeout
    with pytest.raises(type(error), match=str(error)), one_rank.guarded("the DDP buckets"):
        raise error


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_a_non_finite_contribution_joins_with_zeros_and_withholds_its_weight(bad):
    """Zeros, not 0 * values (0 * NaN is NaN), weight 0, and the weight it withheld."""
    values = torch.tensor([1.0, bad, 3.0])
    mine = contribute(values, 0.25, scale=2.0)
    assert mine.screened and mine.weight == 0.0 and mine.withheld == 0.25
    assert mine.values.tolist() == [0.0, 0.0, 0.0]
    told = contribute(torch.tensor([1.0, 2.0]), 0.5, bad=True)  # the caller screened already
    assert told.screened and told.values.tolist() == [0.0, 0.0] and told.withheld == 0.5


def test_a_finite_contribution_is_scaled_bit_for_bit_and_kept_as_is_at_scale_1():
    values = torch.randn(1000, generator=torch.Generator().manual_seed(0))
    mine = contribute(values, 0.25, scale=0.1)
    assert not mine.screened and (mine.weight, mine.withheld) == (0.25, 0.0)
    assert torch.equal(mine.values, values * 0.1)
    assert contribute(values, 0.25).values is values  # straight into the reduce buffer
