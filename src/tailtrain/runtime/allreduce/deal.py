"""A round's deal on one allreduce rank (``rounds`` module docstring, 1.): which micro-batches
this rank computes, their injected seconds, the gathered rows' width, and what every rank keeps
of the round's data once the allreduce has gathered every rank's counts.

Three deals, one per kind of plan (:func:`deal_for`):

* :class:`FixedShard`: rank n's own shard of the round (``plan.shares`` None), re-queuing the
  dropped micro-batches where the plan asks (``requeue_dropped``);
* :class:`Shares`: per-rank shares of sync's global batch (``strategies.rebalance``), dealt as
  the simulator deals them, a carried cut first (``carry_cut``);
* :class:`OnDemand`: each micro-batch to whichever rank asks next (``rebalance:deal=demand``,
  ``runtime.allreduce.demand``), every rank carrying every rank's cut unit.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np
import torch

from tailtrain.errors import TailtrainError
from tailtrain.runtime.allreduce.demand import compute_on_demand
from tailtrain.runtime.allreduce.state import AllreduceRank
from tailtrain.runtime.units import RankWork, compute
from tailtrain.strategies.base import AllreducePlan as Plan


@dataclass
class Deal(ABC):
    """What a round deals this rank: the round's micro-batches (``batches``), its injected
    seconds per unit, and the gathered rows' width (the most units any rank may count)."""

    plan: Plan
    #: micro-batches per local step
    m: int
    batches: np.ndarray
    injected: np.ndarray
    width: int
    #: whether the gathered rows carry the units' dealt indices (on demand)
    indexed = False

    def work(self, run: AllreduceRank, into: torch.Tensor | None) -> RankWork:
        """Compute this rank's part of the round (``runtime.units``), its unit times padded to
        the rows' width; ``into``: the reduce buffer's gradient, when both are on the CPU."""
        work = self.compute(run, into)
        if len(work.times) < self.width:  # a share below the largest: the gathered rows align
            work = work._replace(times=work.times + [math.nan] * (self.width - len(work.times)))
        return work

    @abstractmethod
    def compute(self, run: AllreduceRank, into: torch.Tensor | None) -> RankWork:
        """This rank's units of the round, as dealt."""

    def indices(self) -> list[int] | None:
        """The dealt micro-batch of each unit computed (on demand only)."""
        return None

    def keep(self, run: AllreduceRank, rows: tuple[np.ndarray, ...]) -> np.ndarray | None:
        """After the allreduce, from the gathered ``rows`` (every rank's [C_n, ...] first): what
        every rank keeps of the round's data for the next (the simulator's bookkeeping), and
        (on demand) the micro-batches each rank was dealt."""
        if self.plan.requeue_dropped:
            counts = rows[0][:, 0]
            done_units = counts.astype(np.int64)
            shrinker = run.membership.shrinker
            if shrinker is not None:  # the gathered rows are the live ranks', in order
                done_units = np.full(len(self.batches), self.batches.shape[1], dtype=np.int64)
                done_units[shrinker.members] = counts
            run.learner.requeue(self.batches, done_units)
        return None

    def traced(self, times: list[float]) -> list[float]:
        """The unit times the trace records for this rank's round (``telemetry.TraceRows``)."""
        return times


@dataclass
class FixedShard(Deal):
    """Rank n's own shard of the round's (N, local steps x M, B) micro-batches, whatever its
    index in a shrunk generation, with the injected seconds of its local steps."""

    #: the shard's micro-batches
    mine: np.ndarray | None = None

    @classmethod
    def of(cls, run: AllreduceRank, plan: Plan, m: int) -> FixedShard:
        units = plan.local_steps * m
        batches = run.learner.batches(run.step, units)
        injected = run.injector.unit_times(plan.local_steps, m, run.clock.now)
        return cls(plan, m, batches, injected, units, batches[run.rank])

    def compute(self, run: AllreduceRank, into: torch.Tensor | None) -> RankWork:
        """DropCompute Algorithm 1, Local-SGD App. B.3 over ``mine`` (``runtime.units``)."""
        lr = run.world.lr * self.plan.lr_scale
        plan, theta = self.plan, run.learner.theta
        cuttable = run.injector.cuttable
        return compute(run.grads, theta, plan, self.mine, self.injected, self.m, lr, into, cuttable)


@dataclass
class Shares(FixedShard):
    """A round of per-rank shares (``strategies.rebalance``), as the simulator plays it
    (``sim.allreduce.engine``): sync's global batch (N, M, B; under shrink the live ranks'
    (L, M, B), ``Rebalance.follow_world``) dealt by the shares, a carried cut first
    (``RoundData.dealt``, shared with the simulator), this rank's ``shares[n]`` micro-batches
    of it, their injected seconds (the rank's delay draws run on into the next iteration's,
    one delay iteration per M units, so equal shares draw what sync does); the gathered rows
    are as wide as the largest share."""

    mine: np.ndarray | None = None

    @classmethod
    def of(cls, run: AllreduceRank, plan: Plan, m: int) -> Shares:
        shares = np.asarray(plan.shares, dtype=np.int64)
        if plan.local_steps != 1 or plan.requeue_dropped or shares.size != run.comm.world_size:
            raise TailtrainError(f"a plan of shares needs one local step per rank: {plan!r}")
        share, width = int(shares[run.comm.rank]), int(shares.max())
        shrinker = run.membership.shrinker
        members = None if shrinker is None else shrinker.members
        batches = run.learner.dealt(run.step, m, shares, plan.carry_cut, members)
        injected = run.injector.unit_times(-(-width // m), m, run.clock.now)[:share]
        return cls(plan, m, batches, injected, width, batches[run.comm.rank, :share])

    def keep(self, run: AllreduceRank, rows: tuple[np.ndarray, ...]) -> np.ndarray | None:
        """Every rank keeps what every rank left undone, as the simulator does."""
        super().keep(run, rows)
        if self.plan.carry_cut:
            shares = np.asarray(self.plan.shares, dtype=np.int64)
            run.learner.carry_cut(self.batches, shares, rows[0][:, 0].astype(np.int64))
        return None

    def traced(self, times: list[float]) -> list[float]:
        return one_iteration(times, self.m)


@dataclass
class OnDemand(Deal):
    """A round dealt on demand (``runtime.allreduce.demand``): the micro-batches it may deal,
    (N M + L, B) for the pool N M (``plan.shares``' sum) and the L ranks of the generation,
    the carried ones first (``tasks.stream.CarryOver.peek``: each rank, one lost in the round
    too, takes at most one past those counted), this rank's injected seconds for up to N M
    units (its delay draws of N M / M iterations, as the simulator draws them); the gathered
    rows are N M wide and carry each unit's dealt index. Under ``--on-rank-loss shrink`` the
    pool stays N M of the job's stream (``Rebalance.follow_world``): the live ranks deal the
    global batch among themselves, and the dealer's keys are the generation's
    (``Dealer.round``)."""

    indexed = True
    dealt: list[int] | None = None

    @classmethod
    def of(cls, run: AllreduceRank, plan: Plan, m: int) -> OnDemand:
        pool = int(sum(plan.shares))
        if plan.local_steps != 1:
            raise TailtrainError(f"a round dealt on demand needs one local step: {plan!r}")
        drawn, live = run.learner.drawn, run.comm.world_size
        # the stream is the job's N ranks' global batches, whatever the live count
        batches = run.learner.carry.peek(drawn, drawn.n, m, pool + live)
        injected = run.injector.unit_times(-(-pool // m), m, run.clock.now)[:pool]
        return cls(plan, m, batches, injected, pool)

    def compute(self, run: AllreduceRank, into: torch.Tensor | None) -> RankWork:
        assert run.dealer is not None
        shrinker = run.membership.shrinker
        generation = 0 if shrinker is None else shrinker.generation
        asks = run.dealer.round(run.step, int(sum(self.plan.shares)), generation)
        work, self.dealt = compute_on_demand(
            run.grads, run.learner.theta, asks, self.batches.__getitem__, self.injected, into
        )
        return work

    def indices(self) -> list[int] | None:
        return self.dealt

    def keep(self, run: AllreduceRank, rows: tuple[np.ndarray, ...]) -> np.ndarray | None:
        """Every rank carries every rank's cut unit, as the simulator does; the micro-batches
        each rank was dealt, its cut one included."""
        super().keep(run, rows)
        index = rows[3].astype(np.int64)
        run.learner.on_demand(index, rows[0][:, 0].astype(np.int64), self.m)
        return np.count_nonzero(index >= 0, axis=1)

    def traced(self, times: list[float]) -> list[float]:
        return one_iteration(times, self.m)


def one_iteration(times: list[float], m: int) -> list[float]:
    """A round of shares is one delay iteration of M units in the trace (``TraceRows``)."""
    return (times + [math.nan] * m)[:m]


def deal_for(run: AllreduceRank, plan: Plan, m: int) -> Deal:
    """The deal of a round planned as ``plan`` with M = ``m``."""
    if plan.shares is None:
        return FixedShard.of(run, plan, m)
    if plan.on_demand:
        return OnDemand.of(run, plan, m)
    return Shares.of(run, plan, m)
