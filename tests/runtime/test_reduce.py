"""The weighted allreduce on a one-rank gloo group (the multi-rank runs are in test_allreduce)."""

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
def test_rows_ride_on_the_weighted_sum_in_this_ranks_line(one_rank):
    grad = torch.tensor([1.0, 2.0])
    reduced = one_rank.weighted_sum(grad, 0.5, (7.0,), (np.array([3.0, np.nan]), np.zeros(3)))
    counts, zeros = reduced.rows
    assert counts.shape == (1, 2) and counts[0, 0] == 3.0 and np.isnan(counts[0, 1])
    assert zeros.tolist() == [[0.0, 0.0, 0.0]]
    assert reduced.numerator.tolist() == [0.5, 1.0] and reduced.extras.tolist() == [7.0]


@pytest.mark.timeout(60)
def test_gather_returns_one_row_per_rank(one_rank):
    rows = one_rank.gather(np.array([2.0, 0.5, np.nan]))
    assert rows.shape == (1, 3) and rows[0, 0] == 2.0 and np.isnan(rows[0, 2])


@pytest.mark.timeout(60)
def test_a_failed_collective_is_a_peer_failure(one_rank):
    with pytest.raises(PeerFailure, match="all_gather"), one_rank._guard("all_gather"):
        raise RuntimeError("Connection closed by peer")
