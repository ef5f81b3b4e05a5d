"""The virtual-clock simulator of synchronous allreduce training: DropCompute and Local-SGD.

Every round all N workers start together, compute their units under the plan's threshold
(``sim.allreduce.timing``), then join one allreduce. The strategy answers ``plan`` (tau, M,
H, compensation), ``select`` (each worker's weight) and ``adapt`` (calibration, DropCompute
Algorithm 2); the engine owns the clock, the model (``sim.allreduce.learner``) and the
records. With ``--task none`` it only keeps time, vectorised over workers and micro-batches.

Every worker joins every allreduce (``Plan.k`` is not used); a row's ``k`` counts the workers
that completed at least one unit and ``workers`` those with a non-zero weight (staleness 0).
Rows carry the parameter-server engine's keys (step, time, k, lr, loss, workers, staleness)
plus: threshold, micro_batches (M), local_steps (H), completed (units done per worker),
drop_rate, s_eff (Algorithm 2's S_i on this round's draws), compute_time, comm_time and
sync_time (what the round would have taken without a threshold, T_i + T^c_i). A plan of
per-rank shares (``AllreducePlan.shares``, ``strategies.rebalance``) deals sync's global
batch to the ranks by them (``tasks.stream.deal``); its rows add ``shares``
(``topology.allreduce.step_row``) and its sync_time is sync's round on the same draws. A plan
that carries its cut (``AllreducePlan.carry_cut``) deals the micro-batches the threshold cut
first in the next step (``tasks.stream.CarryOver``, kept with the round data that train's
ranks keep too: ``RoundData.dealt``); its rows add ``deferred``, how many were cut and carried.
A plan dealt on demand (``AllreducePlan.on_demand``, ``rebalance:deal=demand``) draws N M
units per rank and ends at the N M-th completion (``sim.allreduce.timing.demand_rule``); its
rows' ``shares`` are the micro-batches each rank was dealt, the cut one included.
A round in which no worker counted a unit adds ``empty``: it made no update and measured no
loss (``topology.allreduce.step_row``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tailtrain.core import checkpoint
from tailtrain.core.records import RunRecord
from tailtrain.core.scenario import World
from tailtrain.core.update import GradientStats, WeightedUpdate, closed_step_stats
from tailtrain.delays.comm import parse_comm_time
from tailtrain.delays.schedule import RoundClock
from tailtrain.errors import TailtrainError
from tailtrain.sim.allreduce.learner import RoundLearner
from tailtrain.sim.allreduce.timing import demand_rule, measured, share_rule, stop_rule
from tailtrain.sim.driver import Played, Scorer
from tailtrain.strategies.base import AllreducePlan, ArrivalColumns, Selection, StepStats
from tailtrain.topology.allreduce import Stops, round_arrivals, step_row, summarise


class AllreduceEngine:
    """Synchronous allreduce rounds on a virtual clock (``sim.driver.Engine``)."""

    #: what it does beyond the allreduce protocol (``Strategy.needs``): per-rank shares
    does = frozenset({"shares", "carry", "demand"})

    def __init__(self, world: World) -> None:
        scenario = world.scenario
        self.world = world
        self.n = scenario.workers
        self.micro_batches = scenario.micro_batches or 1
        self.clock = RoundClock(world.process, parse_comm_time(scenario.comm_time), world.seed)
        self.learner = None
        if world.partition is not None:
            self.learner = RoundLearner(world.task, world.partition, world.lr, world.seed, self.n)
        self.learns = self.learner is not None
        self.now = 0.0
        self.step = 0
        self._closes = 0.0

    def finished(self, plan: AllreducePlan) -> bool:
        return self.world.finished(self.step, self.now, plan.iteration_scale)

    def scorer(self) -> Scorer:
        if self.learner is None:
            return dict
        theta = self.learner.theta
        return lambda: self.world.task.evaluate(theta)

    def play(self, plan: AllreducePlan) -> Played:
        """Every worker computes its units under the threshold; each is one arrival."""
        m = plan.micro_batches or self.micro_batches
        if plan.shares is not None:
            return self._play_shares(plan, m)
        times = self.clock.take(plan.local_steps, m, self.now)
        stops = stop_rule(times, plan.threshold, plan.preempt, self.clock.cuttable)
        arrivals = ArrivalColumns(
            np.arange(self.n),
            np.full(self.n, self.step),  # worker n's r-th round is its r-th job
            np.full(self.n, self.step),
            np.full(self.n, self.now),
            self.now + stops.compute,
            units=stops.done / (plan.local_steps * m),
        )
        return Played(arrivals, (times, stops, m, self.clock.next_comm(), None))

    def _play_shares(self, plan: AllreducePlan, m: int) -> Played:
        """Rank n computes ``plan.shares[n]`` units of the dealt global batch. Its unit times
        are its stream of delay draws: a share above M runs on into the next iteration's
        rows (one delay iteration per M units), so equal shares draw exactly what sync does."""
        shares = np.asarray(plan.shares, dtype=np.int64)
        if plan.local_steps != 1 or plan.requeue_dropped or shares.size != self.n:
            raise TailtrainError(f"a plan of shares needs one local step per rank: {plan!r}")
        index = None
        if plan.on_demand:  # a rank may be dealt the whole pool: one delay iteration per M
            times = self.clock.take(-(-int(shares.sum()) // m), m, self.now)
            stops, index = demand_rule(times, int(shares.sum()), m)
        else:
            times = self.clock.take(-(-int(shares.max()) // m), m, self.now)
            stops = share_rule(times, shares, m, plan.threshold, plan.preempt, self.clock.cuttable)
        arrivals = round_arrivals(self.step, self.now, stops.done, stops.compute, m)
        return Played(arrivals, (times, stops, m, self.clock.next_comm(), (shares, index)))

    def apply(self, plan: AllreducePlan, selection: Selection, played: Played) -> StepStats:
        times, stops, m, comm, dealing = played.detail
        scalars = GradientStats()
        if self.learner is not None:
            batches, width = self._batches(plan, m, dealing, stops)
            work = self.learner.work(batches, stops.done, width, plan.local_steps, plan.lr_scale)
            self.learner.apply(selection, played.candidates.keys, work, plan.lr_scale)
            if plan.requeue_dropped:
                self.learner.requeue(batches, stops.done)
            update = self.learner.update
            scalars = work.stats(update.finite, update.sq_sum, update.moments)
        self._closes = self.now + float(stops.compute.max()) + comm
        return closed_step_stats(
            self.step,
            plan.k,
            self._closes,
            played.candidates,
            selection.used(),
            scalars,
            self.world.lr * plan.lr_scale,
            measured(times, stops.done),
            comm,
        )

    def _batches(
        self, plan: AllreducePlan, m: int, dealing: tuple | None, stops: Stops
    ) -> tuple[np.ndarray, int]:
        """The round's micro-batches (N, width, B): each rank's own, or sync's global batch
        dealt by the shares, the last step's cut first when the plan carries it, or the
        stream dealt on demand (``RoundData.on_demand``)."""
        if dealing is None:
            return self.learner.batches(self.step, plan.local_steps * m), m
        shares, index = dealing
        if index is not None:
            return self.learner.on_demand(index, stops.done, m), int(stops.dealt.max())
        dealt = self.learner.dealt(self.step, m, shares, plan.carry_cut)
        if plan.carry_cut:
            self.learner.carry_cut(dealt, shares, stops.done)
        return dealt, int(shares.max())

    def row(
        self, plan: AllreducePlan, selection: Selection, played: Played, stats: StepStats
    ) -> dict[str, Any]:
        _, stops, m, comm, _ = played.detail
        used = played.candidates.worker[stats.used_mask()].tolist()
        return step_row(plan, stats, stops, used, m, comm)  # shares and the carried cut

    def advance(self) -> None:
        self.now = self._closes
        self.step += 1

    def summary(self, record: RunRecord) -> dict[str, Any]:
        """``summarise``'s figures (with a carried cut's ``deferred_rate`` and
        ``dropped_micro_batches``)."""
        return summarise(record)

    @property
    def weighted_update(self) -> WeightedUpdate | None:
        """The update path's state (deferred term, non-finite screening); None: no model."""
        return None if self.learner is None else self.learner.update

    def state_dict(self) -> dict[str, Any]:
        """Everything a resumed run needs to go on bit for bit (``core.checkpoint``)."""
        return {
            "engine": checkpoint.capture(self, ("world", "clock", "learner")),
            "clock": checkpoint.with_comm(self.clock, ("process",)),
            "delays": checkpoint.delay_state(self.world.process),
            "learner": None
            if self.learner is None
            else checkpoint.capture(self.learner, checkpoint.MODEL_STATIC),
            "update": None if self.learner is None else self.learner.update.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        checkpoint.restore(self, state["engine"])
        checkpoint.restore_with_comm(self.clock, state["clock"])
        checkpoint.restore_delays(self.world.process, state["delays"])
        if self.learner is not None:
            checkpoint.restore(self.learner, state["learner"])
            self.learner.update.load_state_dict(state["update"])
