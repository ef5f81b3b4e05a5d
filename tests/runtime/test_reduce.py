"""The weighted allreduce on a one-rank gloo group, or with ``dist.all_reduce`` stubbed (the
multi-rank runs are in test_allreduce)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.distributed as dist

from tailtrain.runtime.reduce import Collectives, PeerFailure


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


@pytest.mark.timeout(60)
def test_rows_ride_on_the_weighted_sum_in_this_ranks_line(monkeypatch):
    """Rank 2 of 4 with an all_reduce that sums nothing in: what comes back is this rank's own
    buffer, so each row must sit in line 2 of its (4, width) block, zeros elsewhere."""
    monkeypatch.setattr(dist, "all_reduce", lambda buffer, **kwargs: None)
    comm = Collectives(2, 4, torch.device("cpu"), grace=0.0)
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
def test_gather_returns_one_row_per_rank(one_rank):
    rows = one_rank.gather(np.array([2.0, 0.5, np.nan]))
    assert rows.shape == (1, 3) and rows[0, 0] == 2.0 and np.isnan(rows[0, 2])


@pytest.mark.timeout(60)
def test_a_failed_collective_is_a_peer_failure(one_rank):
    with pytest.raises(PeerFailure, match="all_gather"), one_rank._guard("all_gather"):
        raise RuntimeError("Connection closed by peer")
