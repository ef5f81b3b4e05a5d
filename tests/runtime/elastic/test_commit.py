"""``runtime.elastic.commit``: a round that S replicate groups reduce is applied by every
member or by none. Members are threads over one in-process store; each arrives after its own
delay, and one may never vote (it died) or vote late (it was slow past the deadline)."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch.distributed as dist

from tailtrain.runtime.elastic.commit import Decision, commit
from tailtrain.runtime.elastic.deadline import Deadline
from tailtrain.runtime.elastic.group import Broken

MEMBERS = 4


def vote_all(
    store: dist.Store, delays: list[float | None], bound: float = 1.0, step: int = 0
) -> list[str]:
    """Each member's outcome ("commit" or "broken"; "absent" for a member that never votes,
    delay None) of one round, every member voting after its delay."""
    outcomes = ["absent"] * len(delays)

    def member(m: int, delay: float) -> None:
        time.sleep(delay)
        try:
            commit(store, 0, len(delays), step, Deadline(bound))
            outcomes[m] = "commit"
        except Broken:
            outcomes[m] = "broken"

    threads = [
        threading.Thread(target=member, args=(m, d)) for m, d in enumerate(delays) if d is not None
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    return outcomes


@pytest.mark.timeout(60)
def test_every_member_voting_commits_the_round_everywhere():
    store = dist.HashStore()
    assert vote_all(store, [0.0, 0.01, 0.02, 0.05]) == ["commit"] * MEMBERS
    assert store.get("gen0/commit/0") == Decision.COMMIT.encode()


@pytest.mark.timeout(60)
def test_a_member_that_never_votes_aborts_the_round_for_all_within_the_deadline():
    store = dist.HashStore()
    began = time.monotonic()
    outcomes = vote_all(store, [0.0, 0.0, None, 0.01], bound=0.3)
    assert outcomes == ["broken", "broken", "absent", "broken"]
    assert time.monotonic() - began < 5.0  # the deadline, not a hang
    assert store.get("gen0/commit/0") == Decision.ABORT.encode()
    assert store.check(["gen0/broken"])  # every member still in a collective leaves it


@pytest.mark.timeout(60)
def test_a_broken_generation_aborts_the_round_before_the_deadline():
    store = dist.HashStore()
    store.set("gen0/broken", "a collective failed")
    began = time.monotonic()
    assert vote_all(store, [0.0, 0.0, None, None], bound=20.0)[:2] == ["broken", "broken"]
    assert time.monotonic() - began < 5.0


@pytest.mark.timeout(60)
def test_a_vote_that_completes_the_count_after_an_abort_is_aborted_too():
    """The slow member's vote makes the count whole, but the first word (ABORT, from a member
    whose deadline passed) stands: it leaves too, and nobody applies the round."""
    store = dist.HashStore()
    assert vote_all(store, [0.0, 0.0, 0.0, 0.6], bound=0.2) == ["broken"] * MEMBERS


@pytest.mark.timeout(120)
@pytest.mark.parametrize("seed", range(6))
def test_members_never_disagree_whatever_the_arrivals(seed):
    """Arrivals spread around the deadline, one member at most absent: the members that vote
    either all commit or all leave, and they commit whenever every member voted in time."""
    rng = np.random.default_rng(seed)
    delays: list[float | None] = list(rng.uniform(0.0, 1.0, MEMBERS))
    if seed % 2:
        delays[int(rng.integers(MEMBERS))] = None
    outcomes = vote_all(dist.HashStore(), delays, bound=0.5)
    voted = {o for o in outcomes if o != "absent"}
    assert len(voted) == 1, outcomes
    if None in delays:
        assert voted == {"broken"}
    spread = max(d for d in delays if d is not None) - min(d for d in delays if d is not None)
    if None not in delays and spread < 0.25:  # every vote well within the deadline
        assert voted == {"commit"}


@pytest.mark.timeout(60)
def test_the_round_before_s_keys_go_once_every_member_voted_in_the_next():
    store = dist.HashStore()
    vote_all(store, [0.0] * MEMBERS, step=0)
    vote_all(store, [0.0] * MEMBERS, step=1)
    assert not store.check(["gen0/commit/0"]) and not store.check(["gen0/commit/0/in"])
    assert store.get("gen0/commit/1") == Decision.COMMIT.encode()
