"""A round's deal (``runtime.allreduce.deal``) on a stand-in rank: which deal a plan gets, and
what every rank keeps of the round's data after the allreduce."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from tailtrain.runtime.allreduce.deal import FixedShard, OnDemand, Shares, deal_for
from tailtrain.runtime.allreduce.state import Clock, Membership
from tailtrain.strategies.base import AllreducePlan

N, M, B = 3, 4, 2


class Learner:
    """The rank's data queues, recording what the deal hands back to them."""

    def __init__(self) -> None:
        self.requeued: list[np.ndarray] = []
        self.carry = SimpleNamespace(peek=lambda drawn, n, m, size: np.zeros((size, B)))
        self.drawn = SimpleNamespace(n=N)  # the stream's draws: the job's N ranks'

    def batches(self, step: int, units: int) -> np.ndarray:
        return np.arange(N * units * B).reshape(N, units, B)

    def dealt(self, step, m, shares, carry_cut, members) -> np.ndarray:
        return np.zeros((len(shares), int(shares.max()), B))

    def requeue(self, batches: np.ndarray, done: np.ndarray) -> None:
        self.requeued.append(done)


def rank(n: int = 1, members: list[int] | None = None) -> SimpleNamespace:
    shrinker = None if members is None else SimpleNamespace(members=members)
    return SimpleNamespace(
        learner=Learner(),
        injector=SimpleNamespace(unit_times=lambda iterations, m, now: np.zeros(iterations * m)),
        clock=Clock(),
        membership=Membership(shrinker=shrinker),
        comm=SimpleNamespace(rank=n, world_size=N),
        rank=n,
        step=0,
    )


def test_each_kind_of_plan_gets_its_deal_and_width():
    run = rank()
    own = deal_for(run, AllreducePlan(N, local_steps=2), M)
    assert type(own) is FixedShard and own.width == 2 * M
    assert np.array_equal(own.mine, run.learner.batches(0, 2 * M)[1])
    shares = deal_for(run, AllreducePlan(N, shares=(2, 5, 1)), M)
    assert type(shares) is Shares and shares.width == 5 and len(shares.injected) == 5
    demand = deal_for(run, AllreducePlan(N, shares=(4, 4, 4), carry_cut=True, on_demand=True), M)
    assert type(demand) is OnDemand and demand.width == 12 and demand.indexed


def test_a_shrunk_generations_counts_requeue_on_the_members_shards():
    """The gathered rows are the live ranks', in order: rank 1 was lost, so rows 0 and 1 are
    ranks 0 and 2, and rank 1's shard counts as done (nothing of it is re-queued)."""
    run = rank(n=0, members=[0, 2])
    own = deal_for(run, AllreducePlan(N, requeue_dropped=True), M)
    rows = (np.array([[1.0, 0.5], [3.0, 0.5]]),)
    assert own.keep(run, rows) is None
    assert run.learner.requeued[0].tolist() == [1, M, 3]


def test_a_round_of_shares_traces_one_delay_iteration_of_m_units():
    run = rank()
    times = [0.1, 0.2]
    assert deal_for(run, AllreducePlan(N, local_steps=2), M).traced(times) == times
    traced = deal_for(run, AllreducePlan(N, shares=(2, 5, 1)), M).traced(times)
    assert traced[:2] == times and len(traced) == M and np.isnan(traced[2:]).all()
