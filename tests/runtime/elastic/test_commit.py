"""``runtime.elastic.commit``: a round that S replicate groups reduce is applied by every
member or by none. Members are threads over one in-process store; each votes after its own
delay, and one may never vote (it died: with or without the launcher's ``dead/`` word) or
vote late (it was slow past the deadline). The delays keep margins of a second or more, so a
loaded machine's scheduling does not decide an outcome."""

from __future__ import annotations

import threading
import time

import pytest
import torch.distributed as dist

from tailtrain.runtime.elastic.commit import Decision, commit
from tailtrain.runtime.elastic.deadline import Deadline
from tailtrain.runtime.elastic.group import Broken

MEMBERS = [0, 1, 2, 3]


def vote_all(
    store: dist.Store, delays: list[float | None], bound: float = 5.0, step: int = 0
) -> list[str]:
    """Each member's outcome ("commit" or "broken"; "absent" for a member that never votes,
    delay None) of one round, every member voting after its delay."""
    outcomes = ["absent"] * len(delays)

    def member(m: int, delay: float) -> None:
        time.sleep(delay)
        try:
            commit(store, 0, MEMBERS[: len(delays)], step, Deadline(bound))
            outcomes[m] = "commit"
        except Broken:
            outcomes[m] = "broken"

    threads = [
        threading.Thread(target=member, args=(m, d)) for m, d in enumerate(delays) if d is not None
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return outcomes


@pytest.mark.timeout(60)
def test_every_member_voting_commits_the_round_everywhere():
    store = dist.HashStore()
    assert vote_all(store, [0.0, 0.01, 0.02, 0.05]) == ["commit"] * 4
    assert store.get("gen0/commit/0") == Decision.COMMIT.encode()


@pytest.mark.timeout(60)
def test_a_member_that_never_votes_aborts_the_round_for_all_within_the_deadline():
    store = dist.HashStore()
    began = time.monotonic()
    outcomes = vote_all(store, [0.0, 0.0, None, 0.01], bound=0.3)
    assert outcomes == ["broken", "broken", "absent", "broken"]
    assert time.monotonic() - began < 10.0  # the deadline, not a hang
    assert store.get("gen0/commit/0") == Decision.ABORT.encode()
    assert store.check(["gen0/broken"])  # every member still in a collective leaves it


@pytest.mark.timeout(60)
@pytest.mark.parametrize("word", ["gen0/broken", "dead/2"])
def test_a_broken_generation_or_a_dead_member_aborts_the_round_before_the_deadline(word):
    store = dist.HashStore()
    store.set(word, "a collective failed" if "broken" in word else "killed")
    began = time.monotonic()
    assert vote_all(store, [0.0, 0.0, None, 0.0], bound=30.0) == [
        "broken", "broken", "absent", "broken",
    ]  # fmt: skip
    assert time.monotonic() - began < 10.0


@pytest.mark.timeout(60)
def test_a_vote_that_completes_the_count_after_an_abort_is_aborted_too():
    """The slow member's vote makes the count whole, but the first word (ABORT, from a member
    whose deadline passed) stands: it leaves too, and nobody applies the round."""
    store = dist.HashStore()
    assert vote_all(store, [0.0, 0.0, 0.0, 2.5], bound=0.3) == ["broken"] * 4


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("delays", "want"),
    [
        ([0.0, 0.3, 0.1, 0.2], "commit"),  # every vote well inside the 3 s deadline
        ([0.2, 0.0, 0.1, 4.0], "broken"),  # one past it
        ([0.0, None, 0.2, 0.1], "broken"),  # one never
        ([3.9, 4.0, 4.1, 4.2], "commit"),  # all late together: the deadline is a wait's
    ],
)
def test_members_never_disagree(delays, want):
    outcomes = vote_all(dist.HashStore(), delays, bound=3.0)
    assert {o for o in outcomes if o != "absent"} == {want}, outcomes


@pytest.mark.timeout(60)
def test_the_round_before_s_keys_go_once_every_member_voted_in_the_next():
    store = dist.HashStore()
    vote_all(store, [0.0] * 4, step=0)
    vote_all(store, [0.0] * 4, step=1)
    assert not store.check(["gen0/commit/0"]) and not store.check(["gen0/commit/0/in"])
    assert store.get("gen0/commit/1") == Decision.COMMIT.encode()
