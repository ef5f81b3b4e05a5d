"""The store's side of a step dealt on demand (``runtime.dealer``), without processes: dealers
as the ranks' threads would hold them, against one TCPStore."""

from __future__ import annotations

import datetime

import pytest
import torch.distributed as dist

from tailtrain.runtime.dealer import Dealer

RANKS, POOL = 2, 4
TIMEOUT = datetime.timedelta(seconds=10)


@pytest.mark.timeout(60)
def test_a_rank_that_abandons_a_round_stops_the_others_asking_and_no_waiter_hangs():
    """A rank that fails in a round (``ShardedStep``: its stream or its loss raised) sets the
    round's stop: the other rank's waiter wakes, so it stops asking and leaves at once, short
    of the pool, instead of waiting twice the timeout for completions that never come."""
    master = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=TIMEOUT)

    def client() -> dist.Store:
        base = dist.TCPStore("127.0.0.1", master.port, is_master=False, timeout=TIMEOUT)
        return dist.PrefixStore("tailtrain/deal/abandon/0", base)

    failing, going = (Dealer(client(), client(), tidy=r == 0) for r in range(RANKS))
    mine, theirs = failing.round(0, POOL), going.round(0, POOL)
    assert mine.ask() == 0 and theirs.ask() == 1 and theirs.complete()
    mine.abandon()  # unit 0 never completes: the pool cannot be reached
    assert theirs.stop.wait(TIMEOUT.total_seconds())  # its waiter saw the stop key
    theirs.leave()  # returns at once: the waiter is done with the round
    assert theirs.seen.is_set() and mine.ended.is_set()
    for dealer in (failing, going):
        dealer.close()
        assert not dealer.waiter.is_alive()
