"""The partial collective's wire (``runtime.partial.wire``): a round's buffer and a message
read back as written, without processes; the sum of every rank's buffer is every rank's."""

from __future__ import annotations

import numpy as np
import torch

from tailtrain.runtime.partial.wire import (
    ACT,
    HEAD,
    decode_message,
    empty_message,
    encode_message,
    pack_round,
    row,
    slot_width,
    unpack_round,
)
from tailtrain.strategies.eager import Collective, RoundPlan


def test_a_message_reads_back_as_sent():
    message = encode_message(ACT, 7, 2)
    assert decode_message(message) == (ACT, 7, 2)
    assert empty_message().shape == message.shape


def test_the_summed_buffers_give_every_ranks_slot_and_the_fresh_sum():
    """Two ranks' contributions to round 3, summed as the allreduce does: rank 0 a fresh and
    a stale gradient, rank 1 nothing (its slot's head only)."""
    dim, procs, width = 2, 2, slot_width(2)
    fresh, stale = torch.tensor([1.0, 2.0]), torch.tensor([10.0, 0.0])
    rows = [row(5, 3, 0.1, 0.2, 0.5, 4.0), row(4, 2, 0.0, 0.1, 0.7, 9.0)]
    grads = [(fresh, True), (stale, False)]
    mine = pack_round(dim, procs, width, 0, grads, [1, 0.0, 0.3, 2, 0], rows)
    theirs = pack_round(dim, procs, width, 1, [], [0, 0.05, 0.4, 0, 1], [])
    plan = RoundPlan(k=1, collective=Collective.SOLO)
    result = unpack_round(3, plan, mine + theirs, dim, procs, done=0.5)
    torch.testing.assert_close(result.total, torch.tensor([11.0, 2.0], dtype=torch.float64))
    torch.testing.assert_close(result.fresh, torch.tensor([1.0, 2.0], dtype=torch.float64))
    assert result.slots.shape == (procs, width) and len(HEAD) == 5
    np.testing.assert_array_equal(result.rows[:, 0], [0, 0])  # both rows are rank 0's
    assert result.active.tolist() == [0] and result.initiators.tolist() == [0]
    assert result.closed == 0.4 and result.reach == 0.05
    assert result.grow  # rank 1 said a rank asks to join (runtime.partial.regroup)
