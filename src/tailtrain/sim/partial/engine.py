"""The virtual-clock eager-SGD simulator: partial allreduce rounds over P processes.

One round is one collective (eager-SGD §5, Fig. 7; §6.1's ADS(t) objects):

1. Each process calls the round's collective when its gradient is done. A process whose
   step is behind (a round completed while it computed) is late: it puts its gradient in its
   send buffer, adopts the latest result only (a process more than one round behind misses
   the others, §5) and starts its next gradient at once; that next gradient's call is its
   call of this round.
2. :func:`~tailtrain.sim.partial.collectives.resolve_round` gives the activation (solo, majority,
   quorum, or the synchronous allreduce), its reach after ⌈log2 P⌉ hops and the completion.
3. Processes that called before the activation reached them are active: they contribute
   their fresh gradient plus their buffer and wait for the result. The others contribute the
   buffer the activation finds (stale gradients, or nothing). A process that calls after the
   activation but before completion waits too; its gradient goes to its buffer.
4. The rule weighs the contributions (``select``); everyone who waited adopts the result,
   ``w <- w - lr * sum_i weight_i g_i``, and starts its next gradient.

Gradients are computed only when a collective delivers them, grouped by model copy.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from tailtrain.core import checkpoint
from tailtrain.core.records import RunRecord
from tailtrain.core.scenario import World
from tailtrain.core.update import GradientStats, WeightedUpdate, closed_step_stats, gradient_stats
from tailtrain.delays.schedule import COLLECTIVE_COMM_KEY, CommStream
from tailtrain.network import parse_network
from tailtrain.sim.driver import Played, Scorer
from tailtrain.sim.partial.collectives import Network, RoundTiming, resolve_round
from tailtrain.sim.partial.models import Gradients, ModelStore
from tailtrain.sim.partial.processes import Processes, SendBuffers, Work
from tailtrain.strategies.base import ArrivalColumns, Selection, StepStats
from tailtrain.strategies.eager import RoundPlan
from tailtrain.topology import partial
from tailtrain.topology.partial import summarise

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Round:
    """A round resolved up to the rule's selection."""

    timing: RoundTiming
    contributions: Work  # fresh gradients of the active processes first, then buffers
    active: np.ndarray
    waiting: np.ndarray
    late: Work  # gradients of processes that found a newer result, each once


class PartialCollectiveEngine:
    """P processes and their partial collectives on a virtual clock (``sim.driver.Engine``)."""

    def __init__(self, world: World) -> None:
        n = world.scenario.workers
        self.world = world
        self.procs = Processes(world.durations(round_trips=False), n)
        self.procs.launch(np.arange(n), np.zeros(n))
        self.buffers = SendBuffers()
        self.models = None
        if world.partition is not None:
            self.models = ModelStore(world.task, world.partition, world.seed)
        self.learns = self.models is not None
        self.comm = CommStream.from_spec(world.scenario.comm_time, world.seed, COLLECTIVE_COMM_KEY)
        self.network = parse_network(world.scenario.network)
        self.update = WeightedUpdate(world.lr)
        self.last_update: torch.Tensor | None = None  # the latest result, what late ones adopt
        self.last_scale = 0.0
        self.step = 0  # rounds done
        self.now = 0.0
        self._closes = 0.0

    def finished(self, plan: RoundPlan) -> bool:
        return self.world.finished(self.step, self.now)

    def scorer(self) -> Scorer:
        """Scores of the processes' average model (what a synchronisation would give)."""
        if self.models is None:
            return dict
        mean = self.models.mean_later(self.procs.model)
        return lambda: self.world.task.evaluate(mean())

    def play(self, plan: RoundPlan) -> Played:
        """Resolve the round's calls; offer the active gradients and the buffers it finds."""
        procs, r = self.procs, self.step
        behind = np.flatnonzero(procs.step < r)
        took = procs.next_durations(behind, procs.ready[behind])
        calls = procs.ready.copy()
        calls[behind] += took
        comm = self.comm.next() * (2 if plan.average_models else 1)  # a model sync: 2 allreduces
        net = self.network
        network = Network(net.hop, comm + net.overhead, direct=net.direct, send=net.send)
        timing = resolve_round(
            calls, plan.collective, network, k=plan.k, initiator=plan.initiator, counter=r
        )
        complete = float(timing.complete)
        late = self._arrive_late(behind, took, complete)
        on_time = procs.step == r
        active = np.flatnonzero(on_time & timing.active)
        waiting = np.flatnonzero(on_time & ~timing.active & (procs.ready <= complete))
        fresh = procs.in_flight(active)
        contributions = Work.concat([fresh, self.buffers.pop_until(float(timing.reach))])
        done = _Round(timing, contributions, active, waiting, late)
        return Played(_arrivals(contributions), done)

    def _arrive_late(self, behind: np.ndarray, took: np.ndarray, complete: float) -> Work:
        """Processes that find a newer result than their step: buffer, adopt it, restart."""
        procs = self.procs
        late = procs.ready[behind] < complete
        who = behind[late]
        work = procs.in_flight(who)
        self.buffers.put(work, procs.ready[who])
        if self.models is not None and self.last_update is not None:
            procs.model[who] = self.models.adopt(
                procs.model[who], self.last_update, self.last_scale
            )
        procs.step[who] = self.step
        procs.launch(who, procs.ready[who].copy(), took[late])
        return work

    def apply(self, plan: RoundPlan, selection: Selection, played: Played) -> StepStats:
        """Deliver the contributions' weighted sum; who waited adopts it (Alg. 2)."""
        done: _Round = played.detail
        procs = self.procs
        self.last_scale = self.world.lr * plan.lr_scale
        scalars = self._deliver(selection, played.candidates, done)
        parked = procs.in_flight(done.waiting)
        self.buffers.put(parked, procs.ready[done.waiting])
        self._adopt(np.concatenate([done.active, done.waiting]), float(done.timing.complete), plan)
        calls = Work.concat(
            [done.contributions.take(np.arange(done.active.size)), done.late, parked]
        )
        reach = float(done.timing.reach)
        used = np.concatenate(
            [
                np.arange(done.active.size),
                done.active.size + np.flatnonzero(done.late.finish <= reach),
            ]
        )
        arrivals = _arrivals(calls)
        self._closes = float(done.timing.complete)
        closes = self._closes
        return closed_step_stats(
            self.step, plan.k, closes, arrivals, arrivals.keys[used], scalars, self.last_scale
        )

    def _deliver(
        self, selection: Selection, offered: ArrivalColumns, done: _Round
    ) -> GradientStats:
        """The delivered gradients' weighted sum (the round's result) and the statistics of
        the fresh ones (DBW's gain estimator, for dbw-quorum)."""
        if self.models is None:
            return GradientStats()
        grads: Gradients = self.models.gradients(done.contributions)
        self.last_update = self.update.direction(grads.grads, offered.keys, selection)
        nap = done.active.size
        if nap == 0:
            return GradientStats()
        return gradient_stats(grads.losses[:nap], grads.grads[:nap], moments=self.update.moments)

    def _adopt(self, who: np.ndarray, complete: float, plan: RoundPlan) -> None:
        """Everyone who waited takes the result at ``complete`` and starts the next gradient."""
        procs = self.procs
        if self.models is not None:
            procs.model[who] = self.models.adopt(
                procs.model[who], self.last_update, self.last_scale
            )
            if plan.average_models:
                procs.model[:] = self.models.average(procs.model)
        procs.step[who] = self.step + 1
        procs.launch(who, np.full(who.size, complete))

    def row(
        self, plan: RoundPlan, selection: Selection, played: Played, stats: StepStats
    ) -> dict[str, Any]:
        done: _Round = played.detail
        work = done.contributions
        # a gradient screened out as non-finite (the driver drops it from ``used``) is no
        # contribution of the round, as the runtime records it (``runtime.partial.rule``)
        screened = np.setdiff1d(selection.used(), stats.used)
        kept = ~np.isin(_arrivals(work).keys, screened)
        models = 1 if self.models is None else self.models.distinct(self.procs.model)
        return partial.round_row(
            stats,
            plan,
            work.worker[kept],
            (self.step - work.step)[kept],
            int(done.active.size),
            int(done.timing.initiator),
            {"models": models},
        )

    def advance(self) -> None:
        self.now = self._closes
        self.step += 1
        if self.models is not None:
            self.models.retain(np.concatenate([self.procs.model, self.buffers.models()]))

    def summary(self, record: RunRecord) -> dict[str, Any]:
        return summarise(record)

    @property
    def weighted_update(self) -> WeightedUpdate | None:
        """The update path's state (deferred term, non-finite screening); None: no model."""
        return None if self.models is None else self.update

    def state_dict(self) -> dict[str, Any]:
        """Everything a resumed run needs to go on bit for bit (``core.checkpoint``)."""
        parts = ("world", "procs", "buffers", "models", "comm", "network", "update")
        return {
            "engine": checkpoint.capture(self, parts),
            "procs": checkpoint.capture(self.procs, ("durations",)),
            "durations": checkpoint.with_comm(self.procs.durations, checkpoint.DURATIONS_STATIC),
            "delays": checkpoint.delay_state(self.world.process),
            "buffers": checkpoint.capture(self.buffers),
            "comm": checkpoint.capture(self.comm, checkpoint.COMM_STATIC),
            "models": None
            if self.models is None
            else checkpoint.capture(self.models, checkpoint.MODEL_STATIC),
            "update": self.update.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        checkpoint.restore(self, state["engine"])
        checkpoint.restore(self.procs, state["procs"])
        checkpoint.restore_with_comm(self.procs.durations, state["durations"])
        checkpoint.restore_delays(self.world.process, state["delays"])
        checkpoint.restore(self.buffers, state["buffers"])
        checkpoint.restore(self.comm, state["comm"])
        if self.models is not None:
            checkpoint.restore(self.models, state["models"])
        self.update.load_state_dict(state["update"])


def _arrivals(work: Work) -> ArrivalColumns:
    """Gradients as the rule sees them: ``version`` is the step a gradient was made at."""
    return ArrivalColumns(work.worker, work.job, work.step, work.start, work.finish)
