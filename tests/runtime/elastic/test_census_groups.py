"""The census at group granularity (``Shrinker.whole``, a sharded job's membership): of the
ranks checked in and not known dead, only whole replica groups go on; a rank whose group lost
a rank is refused with a line that says so, not taken for a late rank."""

from __future__ import annotations

import json

import pytest
import torch
import torch.distributed as dist

from tailtrain.runtime.elastic.deadline import Deadline
from tailtrain.runtime.elastic.shrink import Refused, Shrinker

GROUPS = [[0, 1], [2, 3]]


def whole(here: list[int]) -> list[int]:
    present = set(here)
    return [r for r in here if all(m in present for g in GROUPS if r in g for m in g)]


def shrinker(rank: int, store: dist.Store) -> Shrinker:
    s = Shrinker(rank, store, Deadline(5.0), torch.device("cpu"), [0, 1, 2, 3], 4)
    s.keeper, s.heals, s.whole = None, False, whole
    return s


@pytest.mark.timeout(60)
def test_only_whole_groups_go_on_and_a_lost_rank_s_mate_leaves_with_its_group():
    store = dist.HashStore()
    store.set("gen0/in/1", json.dumps([5, 0]))
    store.set("gen0/in/2", json.dumps([5, 0]))
    store.set("dead/3", "killed")
    found = shrinker(0, store).census(5, 0)
    assert found.members == [0, 1] and found.dead == [2, 3]
    with pytest.raises(Refused, match="rank 2 leaves with its replica group at step 5"):
        shrinker(2, store).census(5, 0)
    assert store.check(["left/2"])  # the launcher logs a leave, not a death


@pytest.mark.timeout(60)
def test_a_rank_lost_in_every_group_leaves_no_member():
    store = dist.HashStore()
    store.set("gen0/in/0", json.dumps([5, 0]))
    store.set("dead/1", "killed")
    store.set("dead/2", "killed")
    with pytest.raises(Refused, match="leaves with its replica group"):
        shrinker(3, store).census(5, 0)
    assert json.loads(store.get("gen0/members")) == []
