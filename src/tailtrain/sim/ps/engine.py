"""The virtual-clock parameter-server simulator: drives a strategy's rule over simulated workers.

The engine owns the clock (``ServerTimeline``), the model versions (``Trainer``) and the
records; the strategy only answers ``plan`` / ``select`` / ``adapt``. Which gradients count is
decided by virtual arrival order, so the optimisation dynamics match the real system (DBW §4:
"the virtual time has an effect on the optimization dynamics").
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tailtrain.core import checkpoint
from tailtrain.core.records import RunRecord
from tailtrain.core.scenario import World
from tailtrain.core.update import GradientStats, WeightedUpdate, closed_step_stats
from tailtrain.sim.driver import Played, Scorer
from tailtrain.sim.ps.timeline import IDLE, ServerTimeline, StepArrivals
from tailtrain.sim.ps.trainer import Trainer
from tailtrain.strategies.base import (
    ArrivalColumns,
    Selection,
    ServerPlan,
    StepStats,
)
from tailtrain.topology import ps


class ServerEngine:
    """A parameter server and its workers on a virtual clock (``sim.driver.Engine``)."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.timeline = ServerTimeline(world.durations(round_trips=True), world.scenario.workers)
        self.trainer = None if world.partition is None else Trainer.of(world)
        self.learns = self.trainer is not None
        self.version = 0
        self.step = 0

    @property
    def now(self) -> float:
        return self.timeline.now

    def finished(self, plan: ServerPlan) -> bool:
        return self.world.finished(self.step, self.now)

    def scorer(self) -> Scorer:
        if self.trainer is None:
            return dict
        theta = self.trainer.versions[self.version]
        return lambda: self.world.task.evaluate(theta)

    def play(self, plan: ServerPlan) -> Played:
        """Collect k usable arrivals; offer them and the stragglers' partial work."""
        tl = self.timeline
        tl.begin(self.version, plan.mode, plan.accept_stale)
        got = tl.collect(plan.k, self.version, plan.accept_stale, drain=plan.complete_stragglers)
        return Played(self._candidates(plan, got), got)

    def _candidates(self, plan: ServerPlan, got: StepArrivals) -> ArrivalColumns:
        """The usable arrivals, then the stragglers' partial work (LGC Alg. 1)."""
        # every arrival usable (K-async, or no stale one this step): the columns as they are
        fresh = got.arrivals if got.usable.all() else got.arrivals.take(np.flatnonzero(got.usable))
        if plan.partial_blocks <= 0:
            return fresh
        tl = self.timeline
        workers, blocks = tl.partial_work(self.version, plan.partial_blocks)
        if plan.complete_stragglers:
            blocks = np.full(workers.size, plan.partial_blocks)
        keep = blocks > 0
        workers, blocks = workers[keep], blocks[keep]
        ends = (
            tl.finish[workers]
            if plan.complete_stragglers
            else np.minimum(tl.finish[workers], tl.now)
        )
        partial = ArrivalColumns(
            workers,
            tl.job[workers],
            np.full(workers.size, self.version),
            tl.start[workers],
            ends,
            units=blocks / plan.partial_blocks,
            partial=np.ones(workers.size, dtype=bool),
        )
        return ArrivalColumns.concat([fresh, partial])

    def apply(self, plan: ServerPlan, selection: Selection, played: Played) -> StepStats:
        candidates, got = played.candidates, played.detail
        scalars = GradientStats()
        if self.trainer is not None:
            scalars = self.trainer.apply(
                self.version + 1, self.version, selection, candidates, plan.lr_scale
            )
        arrivals = got.arrivals
        if candidates.partial.any():  # LGC: the stragglers' partial work arrived too
            late = candidates.take(np.flatnonzero(candidates.partial))
            arrivals = ArrivalColumns.concat([got.arrivals, late])
        lr = self.world.lr * plan.lr_scale
        used = selection.used()
        return closed_step_stats(self.step, plan.k, got.close, arrivals, used, scalars, lr)

    def row(
        self, plan: ServerPlan, selection: Selection, played: Played, stats: StepStats
    ) -> dict[str, Any]:
        return ps.step_row(stats, plan.k, played.candidates)

    def advance(self) -> None:
        self.version += 1
        self.step += 1
        if self.trainer is not None:
            # the versions jobs in flight compute
            busy = set(np.unique(self.timeline.schedule.jobs).tolist())
            busy.discard(IDLE)
            self.trainer.retain({self.version, *busy})

    def summary(self, record: RunRecord) -> dict[str, Any]:
        return {}

    @property
    def weighted_update(self) -> WeightedUpdate | None:
        """The update path's state (deferred term, non-finite screening); None: no model."""
        return None if self.trainer is None else self.trainer.update

    def state_dict(self) -> dict[str, Any]:
        """Everything a resumed run needs to go on bit for bit (``core.checkpoint``)."""
        tl = self.timeline
        return {
            "engine": checkpoint.capture(self, ("world", "timeline", "trainer")),
            "timeline": checkpoint.capture(tl, ("durations",)),
            "durations": checkpoint.with_comm(tl.durations, checkpoint.DURATIONS_STATIC),
            "delays": checkpoint.delay_state(self.world.process),
            "trainer": None
            if self.trainer is None
            else checkpoint.capture(self.trainer, checkpoint.MODEL_STATIC),
            "update": None if self.trainer is None else self.trainer.update.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        checkpoint.restore(self, state["engine"])
        # checkpoints written before the timeline read its versions off the schedule
        # (``ServerTimeline.version``) also hold them as an array of their own
        timeline = {k: v for k, v in state["timeline"].items() if k != "version"}
        checkpoint.restore(self.timeline, timeline)
        checkpoint.restore_with_comm(self.timeline.durations, state["durations"])
        checkpoint.restore_delays(self.world.process, state["delays"])
        if self.trainer is not None:
            checkpoint.restore(self.trainer, state["trainer"])
            self.trainer.update.load_state_dict(state["update"])
