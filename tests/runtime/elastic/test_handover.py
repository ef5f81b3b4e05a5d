"""The elastic layer's decisions after a regroup, taken once for every host (issue 35): the
lead (most rounds, lowest rank among equals, from counts gathered now), the hand-over, the
rule following the live world, and the drills a member skipped."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tailtrain.errors import TailtrainError
from tailtrain.runtime.control import RuleDriver
from tailtrain.runtime.elastic.handover import elect, follow_live, hand_over, lead_of, pass_drills
from tailtrain.runtime.reduce import Collectives
from tailtrain.strategies.base import Context
from tailtrain.strategies.registry import parse_strategy


class Members:
    """A generation's gathered counts and its broadcast, as member ``rank`` sees them (no
    process group: what ``GroupCollectives`` would return)."""

    def __init__(self, rank: int, counts: list[tuple[int, int]]) -> None:
        self.rank, self.counts, self.sent = rank, counts, []

    def gather(self, row):
        assert row == list(self.counts[self.rank])  # each member offers its own counts
        return np.asarray(self.counts, dtype=np.float64)

    def broadcast_object(self, obj, src):
        self.sent.append((obj, src))
        return obj if self.rank == src else {"from": src}


def test_the_lead_completed_the_most_rounds_and_is_the_lowest_among_equals():
    assert lead_of([4, 5, 5]) == 1
    assert lead_of([5, 4, 5]) == 0
    assert lead_of([3]) == 0
    assert lead_of([2, 2, 3, 3]) == 2


def test_the_lead_is_elected_from_the_counts_gathered_now():
    """Member 2 took a lead's state in a sync that broke (it checked in one round behind):
    the counts gathered over the new group make it the lead, and the rows it holds count."""
    counts = [(6, 6), (6, 5), (7, 7)]
    for me in range(3):
        lead = elect(Members(me, counts), *counts[me])
        assert (lead.place, lead.mine, lead.leads) == (2, me, me == 2)
        assert (lead.steps, lead.rows, lead.fewest) == ((6, 6, 7), (6, 5, 7), 5)


def test_only_the_lead_builds_the_state_and_every_member_gets_it():
    counts = [(3, 3), (4, 4)]
    built = []

    def state():
        built.append(True)
        return {"step": 4}

    for me in range(2):
        comm = Members(me, counts)
        got = hand_over(comm, elect(comm, *counts[me]), state)
        assert comm.sent == [({"step": 4} if me == 1 else None, 1)]
        assert got == ({"step": 4} if me == 1 else {"from": 1})
    assert built == [True]  # on the lead only


def test_the_rule_follows_the_live_world_of_the_members():
    ctx = Context(n_workers=4, lr=0.5)
    rule = RuleDriver(parse_strategy("dropcompute:threshold=0.3"), ctx)
    followed, live = follow_live(rule, ctx, [0, 2, 3])
    assert (live.n_workers, live.live, live.lr) == (3, (0, 2, 3), 0.5)
    assert followed is not rule and followed.n == 3
    eager = RuleDriver(parse_strategy("eager:mode=majority"), ctx, shape=None, remember=False)
    followed, _ = follow_live(eager, ctx, [1, 3])
    assert followed.shape is None and followed.remember is False  # its topology's asking kept


def test_a_rule_that_cannot_follow_is_no_silent_assert():
    larger = parse_strategy("dropcompute:threshold=0.2,compensate=larger-batch")
    rule = RuleDriver(larger, Context(n_workers=3))
    with pytest.raises(TailtrainError, match="cannot follow the live ranks \\[0, 1\\]"):
        follow_live(rule, Context(n_workers=3), [0, 1])


def test_a_member_that_took_a_later_state_passes_the_drills_of_the_rounds_it_skipped():
    comm = Collectives(1, 3, torch.device("cpu"))
    comm.drill.reached = 2
    pass_drills(comm, 6)
    assert comm.drill.reached == 5
    pass_drills(comm, 3)  # never back
    assert comm.drill.reached == 5
