"""The store's side of ``rebalance:deal=demand`` (``runtime.allreduce.demand``), without
processes: two threads play two ranks against one TCPStore, a barrier for each round's
allreduce, constant injected seconds (2 ms a unit) and a constant gradient."""

from __future__ import annotations

import datetime
import threading

import numpy as np
import pytest
import torch
import torch.distributed as dist

from tailtrain.runtime.allreduce.demand import compute_on_demand
from tailtrain.runtime.dealer import Dealer

RANKS, POOL, ROUNDS = 2, 4, 12
TIMEOUT = datetime.timedelta(seconds=10)


def ranks_play(rounds: int) -> tuple[dist.TCPStore, list[int], list[Dealer], list[list[int]]]:
    """``rounds`` rounds on two ranks; the store, its key count after each round's allreduce
    (rank 0's view), the dealers and each round's counted units per rank."""
    master = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=TIMEOUT)

    def client() -> dist.Store:
        base = dist.TCPStore("127.0.0.1", master.port, is_master=False, timeout=TIMEOUT)
        return dist.PrefixStore("tailtrain/deal/test/0", base)

    dealers = [Dealer(client(), client(), tidy=r == 0) for r in range(RANKS)]
    allreduce = threading.Barrier(RANKS, timeout=TIMEOUT.total_seconds())
    keys: list[int] = []
    counted = [[0] * RANKS for _ in range(rounds)]
    failures: list[BaseException] = []

    def rank(r: int) -> None:
        try:
            for step in range(rounds):
                deal = dealers[r].round(step, POOL)
                work, _ = compute_on_demand(
                    lambda theta, batch, out: (0.0, torch.ones(2)),
                    torch.zeros(2),
                    deal,
                    lambda k: np.zeros(1),
                    np.full(POOL, 0.002),
                )
                counted[step][r] = work.done
                allreduce.wait()
                if r == 0:
                    keys.append(master.num_keys())
                allreduce.wait()
        except BaseException as exc:  # reported by the test
            failures.append(exc)
            allreduce.abort()

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(RANKS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(TIMEOUT.total_seconds())
    assert not failures, failures
    return master, keys, dealers, counted


@pytest.mark.timeout(60)
def test_a_long_run_leaves_a_bounded_number_of_keys_in_the_store():
    """Every round counts exactly N M units, and the store holds the same number of keys
    whatever the round: the rounds before the last are deleted, their stop keys too (a
    key a round would grow the launcher's store without bound over a long run)."""
    _, keys, dealers, counted = ranks_play(ROUNDS)
    assert all(sum(row) == POOL for row in counted)
    assert max(keys) == keys[1], keys
    for dealer in dealers:
        dealer.close()


@pytest.mark.timeout(60)
def test_closing_the_dealers_leaves_no_key_and_no_waiter():
    """After the last round, closing every rank's dealer deletes the last round's keys and
    ends each rank's waiter thread."""
    master, _, dealers, _ = ranks_play(3)
    for dealer in dealers:
        dealer.close()
    assert master.num_keys() == 0
    assert not any(dealer.waiter.is_alive() for dealer in dealers)


@pytest.mark.timeout(60)
def test_a_round_longer_than_the_timeout_still_counts_its_pool():
    """--timeout bounds a wait for a peer, not a round: one rank alone computes a pool of 8
    units of 0.1 s against a 0.3 s timeout, and its round still ends at its 8th completion
    (a waiter that took its timed-out wait for the stop cut every round at --timeout)."""
    short = datetime.timedelta(seconds=0.3)
    master = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=short)

    def client() -> dist.Store:
        base = dist.TCPStore("127.0.0.1", master.port, is_master=False, timeout=short)
        return dist.PrefixStore("tailtrain/deal/test/0", base)

    dealer = Dealer(client(), client(), tidy=True, timeout=short.total_seconds())
    work, dealt = compute_on_demand(
        lambda theta, batch, out: (0.0, torch.ones(2)),
        torch.zeros(2),
        dealer.round(0, 8),
        lambda k: np.zeros(1),
        np.full(8, 0.1),
    )
    assert work.done == 8 and dealt == list(range(8))
    dealer.close()
    assert not dealer.waiter.is_alive()


@pytest.mark.timeout(60)
def test_a_round_redone_by_a_new_generation_deals_from_fresh_counters_and_no_waiter_hangs():
    """``--on-rank-loss shrink``: round 5 breaks in generation 0 after three asks (a lost
    rank's among them) and one completion; the rank that meets the break sets its stop and
    the next round's (a member one round ahead stops too), so its waiter is done with it; the
    regroup counts the three units as dealt again, and generation 1 redoes round 5 under keys
    of its own: the first ask takes the first micro-batch, and rank 0 deletes every key of
    generation 0's rounds 4 to 6 when the round after the redone one starts (two rounds on:
    a loop's step leaves a round after its gather, ``runtime.dealer``)."""
    master = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=TIMEOUT)

    def client() -> dist.Store:
        base = dist.TCPStore("127.0.0.1", master.port, is_master=False, timeout=TIMEOUT)
        return dist.PrefixStore("tailtrain/deal/test/0", base)

    dealer = Dealer(client(), client(), tidy=True, timeout=TIMEOUT.total_seconds())
    broken = dealer.round(5, POOL)
    assert [broken.ask() for _ in range(3)] == [0, 1, 2] and broken.complete()
    assert not broken.stop.is_set()  # 1 of 4 complete: the round runs on
    dealer.broke(0, 5)
    assert broken.seen.wait(TIMEOUT.total_seconds())  # the waiter left the broken round's key
    broken.leave()
    ahead = Dealer(client(), client())  # a member that completed round 5 and began round 6
    assert ahead.round(6, POOL).stop.wait(TIMEOUT.total_seconds())
    assert dealer.regrouped(0, 5) == 3 and dealer.redone == [3]
    redone = dealer.round(5, POOL, generation=1)
    assert redone.ask() == 0 and not redone.stop.is_set()
    # generation 0's round 5 (asks, done, stop), its round 6's stop set ahead, the redo's ask
    assert master.num_keys() == 5
    for _ in range(POOL - 1):
        redone.ask()
    assert all(redone.complete() for _ in range(POOL)) and redone.stop.is_set()
    redone.leave()
    after = dealer.round(6, POOL, generation=1)
    # generation 0's keys are gone: the redone round's three and the next one's
    assert after.ask() == 0 and master.num_keys() == 4
    assert all(after.complete() for _ in range(POOL))
    after.leave()
    for each in (ahead, dealer):
        each.close()
    assert master.num_keys() == 0
    assert not dealer.waiter.is_alive() and not ahead.waiter.is_alive()
