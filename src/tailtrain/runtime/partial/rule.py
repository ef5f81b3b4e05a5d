"""The partial collective's rule on each rank's reducer thread, the agreed model it keeps, its
snapshots, and its part of a regroup's hand-over (``runtime.partial.rounds`` runs the ranks).

**The rule** (``plan`` / ``select`` / ``adapt``) runs on every rank's reducer thread after each
round, on the round's arrivals as every rank received them, so every rank plans the same next
round. A round sums the contributions before anyone knows who contributed, so the rule must
weigh them equally (eager-SGD Alg. 2 line 6 and dbw-quorum do: weight 1, divisor P or the
count); a rule that does not is refused (:func:`uniform_weight`). ``StepStats`` hold the
contributions as arrivals and the fresh gradients' loss, sum of ||g||^2 and ||mean g||^2 (DBW
Eqs. 10-11, for dbw-quorum). Late gradients reach the rule in the round that carries them (the
simulator lists them in the round they finished in), so DBW's time estimator sees them one
round later. A gradient its rank screened out (non-finite, ``--on-nonfinite skip``) joined the
sum as zeros; its row says so (``runtime.partial.wire``'s ``screened`` column), and the rule
and the record leave it out of what was used, as ``sim.driver`` drops it.

**The agreed model and the snapshots** (``runtime.keep``, with ``--out``). Every rank adopts
the same round results, but a rank's own model is private: a late rank skips rounds, and only
a model average makes the models equal again. What every rank agrees on after round r is the
*agreed model*: the model of a rank that adopted every round, theta_r = theta_(r-1) - lr *
lr_scale * sum_i w g_i / divisor from the start (or from the last model average, which every
rank took after the same round). Each rank's reducer thread keeps it (one more D-vector and one
update per round) and takes a snapshot after every round of what the run needs to go on: the
agreed model, the rule's state (``Strategy.state_dict``; the rule is replicated, so it is every
rank's), the round index, the run's clock, the injected communication draws' generator, the
update path's state and the evaluator's position, and the last row of the record. So a
checkpoint of round r is the same whichever rank writes it: rank 0's main thread writes the
latest snapshot every ``--checkpoint-every`` rounds (a slow main thread is what a partial
collective tolerates; its reducer thread, which every round waits for, never writes), and
after a failure the survivors' census (``Keeper.failed``) writes the last round every reducer
completed. A round that ends with a model average is snapshotted once the average is known (on
the main thread, after the round): until then the latest snapshot is the round before.

**A regroup** (``--on-rank-loss shrink``, ``runtime.partial.regroup``) freezes the rule, hands
the lead's state over (:meth:`Rule.handover_state`) and takes it on every member
(:meth:`Rule.take_over`): these live here because they read and replace the rule's state under
its lock, which the reducer thread holds while it completes a round.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from typing import Any

import numpy as np
import torch

from tailtrain.core import checkpoint, envelope
from tailtrain.core.records import RunRecord
from tailtrain.core.scenario import World
from tailtrain.core.session import RunKeeper
from tailtrain.core.update import GradientStats, WeightedUpdate, closed_step_stats
from tailtrain.delays.schedule import COLLECTIVE_COMM_KEY, CommStream
from tailtrain.errors import TailtrainError
from tailtrain.runtime.control import RuleDriver
from tailtrain.runtime.elastic.handover import follow_live
from tailtrain.runtime.keep import Keeper
from tailtrain.runtime.partial.collective import KEPT_ROUNDS
from tailtrain.runtime.partial.wire import RoundResult
from tailtrain.strategies.base import ArrivalColumns, Selection, StepStats, Strategy
from tailtrain.strategies.eager import RoundPlan
from tailtrain.topology import partial

#: the latest rows every rank keeps, which a regroup's lead hands to a member that lacks them
HANDED_ROWS = 8


class Rule:
    """The strategy and its state (a ``runtime.control.RuleDriver``), driven on the reducer
    thread (same inputs on every rank).

    Rounds are counted from 0 in each launch by the collective (``result.index``, the keys of
    ``steps`` and ``averages``); ``base`` rounds and ``origin`` seconds came before it (a
    resumed run's checkpoint). Records, the rule and checkpoints see the run's rounds."""

    def __init__(
        self,
        world: World,
        strategy: Strategy,
        rank: int,
        record: bool,
        theta: torch.Tensor,
        keeper: Keeper | None = None,
    ) -> None:
        self.world, self.strategy, self.rank = world, strategy, rank
        # a round's plan is the rule's own (``RoundPlan``): no allreduce shape, asked each time
        self.driver = RuleDriver(strategy, world.context, shape=None, remember=False)
        self.comm = CommStream.from_spec(world.scenario.comm_time, world.seed, COLLECTIVE_COMM_KEY)
        self.steps: dict[int, tuple[torch.Tensor, float, float]] = {}
        self.averages: list[int] = []
        self.record = RunRecord() if record else None
        self.now = 0.0
        self.base, self.origin = 0, 0.0
        self.done = 0  # the run's rounds completed
        self.applied = -1  # this launch's last round on the agreed model (under ``lock``)
        self.keeper, self.evals = keeper, None  # evals: the Evaluator, for the snapshots
        self.agreed = theta  # the model a rank that adopted every round holds (docstring)
        self.update = WeightedUpdate(world.lr)
        # the agreed model and, under shrink, the whole state: reducer thread and main thread
        self.lock = threading.RLock()
        self.pending: int | None = None  # a round whose model average is not known yet
        self.last_row: dict[str, Any] | None = None
        #: under ``--on-rank-loss shrink`` (``runtime.partial.regroup``): the original ranks of
        #: the generation (collective index n is ``members[n]``), whether a regroup froze the
        #: state, the rows a handover may owe, and the next row's ``dead`` and ``skipped``
        self.members: list[int] | None = None
        self.frozen = False
        self.recent: deque[dict[str, Any]] = deque(maxlen=HANDED_ROWS)
        self.lost: list[int] = []
        self.skipped = 0
        #: the run's versions of this rank's gradients that the rounds of its generation
        #: carried (``runtime.partial.regroup``: what a regroup dropped), and the generation
        self.carried: set[int] = set()
        self.generation = 0
        #: a round said a rank asks to join: the generation ends after it (a heal), and the
        #: ranks taken in, for the next row's ``rejoined``
        self.growing = False
        self.joined: list[int] = []

    def first(self) -> RoundPlan:
        return self.driver.plan()

    def after_round(self, result: RoundResult) -> RoundPlan | None:
        """select -> the round's step, StepStats -> adapt; the next plan (None: done). Under
        the lock: a regroup (``runtime.partial.regroup``) freezes the state, and a round
        completed after that counts nowhere on this rank."""
        arrivals, plan, r = self.arrivals(result), result.plan, result.index
        weight, divisor = uniform_weight(self.driver.select(arrivals), arrivals.keys)
        step = (weight * result.total, divisor, plan.lr_scale)
        stats = self.stats(result, arrivals)
        # the draw under the lock, and none once frozen: handover_state captures the stream
        with self.lock:
            if self.frozen:
                return None
            comm = self.comm.next()
        time.sleep(comm * (2 if plan.average_models else 1))
        with self.lock:
            if self.frozen:
                return None
            self.steps[r] = step
            # a rank can still adopt the steps of the rounds the collective keeps (one that
            # slept through more adopts a later one)
            self.steps.pop(r - KEPT_ROUNDS, None)
            if plan.average_models:
                self.averages.append(r)
            self.driver.adapt(stats)
            self.now = stats.time
            self.last_row = measured_round_row(result, stats, self.members)
            if self.members is not None:
                self.last_row |= self.shrink_columns(result)
            if self.record is not None:
                self.record.add_step(self.last_row)
            self.recent.append(self.last_row)
            self.done = self.base + r + 1
            self.keep(r, step, plan.average_models)
            if self.world.finished(self.done, self.now):
                return None
            if self.members is not None and result.grow:  # every rank ends it after r
                self.growing = True
                return None
            return self.driver.plan()

    def shrink_columns(self, result: RoundResult) -> dict[str, Any]:
        """A shrinking run's row columns (``runtime.partial.regroup``); counts this rank's
        contributions to the round."""
        assert self.members is not None
        me, rows = self.members.index(self.rank), result.rows
        self.carried.update(int(v) + self.base for v in rows[rows[:, 0] == me, 2])
        # the lost ranks' shards, one job of each a round, as the allreduce counts its
        # rounds (``runtime.allreduce.accounts.shrink_columns``), plus the parked gradients
        # dropped. A job here is one mini-batch whatever M (``batch``; M only makes its
        # injected time a sum of M draws), where an allreduce round is M micro-batches
        absent = self.world.scenario.workers - len(self.members)
        skipped = self.skipped + absent * self.world.task.batch_size
        columns = {"live": list(self.members), "dead": self.lost, "skipped": skipped}
        columns |= {"rejoined": self.joined, "committed_at": time.time()}
        self.lost, self.skipped, self.joined = [], 0, []
        # each summed gradient's job and the round its rank had adopted (-1: none since the
        # generation began), aligned with ``workers``: the record rebuilds the parameters
        summed = rows[~result.screened]
        jobs, adopted = summed[:, 1].astype(np.int64), summed[:, 7].astype(np.int64)
        columns |= {"jobs": jobs.tolist(), "adopted": adopted.tolist()}
        return columns | {"generation": self.generation}

    def arrivals(self, result: RoundResult) -> ArrivalColumns:
        """The round's arrivals in the run's rounds and clock."""
        a = result.arrivals()
        shift = self.origin
        return ArrivalColumns(
            a.worker, a.job, a.version + self.base, a.start + shift, a.finish + shift
        )

    def stats(self, result: RoundResult, arrivals) -> StepStats:
        """The round's StepStats; a screened-out gradient (``RoundResult.screened``) joined
        the sum as zeros, so it is not among the used, as ``sim.driver`` drops it."""
        rows, r, screened = result.rows, result.index, result.screened
        is_fresh = rows[:, 2] == r
        nap = int(np.count_nonzero(is_fresh))
        mean = result.fresh / max(nap, 1)
        fresh = rows[is_fresh & ~screened]  # NAP counts it; the loss and ||g||^2 do not
        scalars = GradientStats(
            loss=float(fresh[:, 5].mean()) if len(fresh) else math.nan,
            grad_sq_sum=float(fresh[:, 6].sum()) if len(fresh) else math.nan,
            mean_grad_sq=float(mean @ mean) if nap else math.nan,
        )
        used = arrivals.keys[~screened]
        lr = self.world.lr * result.plan.lr_scale
        closed = self.origin + result.closed
        k = result.plan.k
        return closed_step_stats(self.base + r, k, closed, arrivals, used, scalars, lr)

    # ---- the agreed model and the snapshots (module docstring) ----------------------------
    def keep(self, r: int, step: tuple[torch.Tensor, float, float], average: bool) -> None:
        """Round ``r``'s step on the agreed model; the snapshot unless an average is pending.
        The step and ``applied`` change together under the lock, so a :meth:`rebase` replays
        exactly the rounds already on the model it replaces, never this one twice."""
        if self.keeper is None and self.members is None:
            return
        total, divisor, lr_scale = step
        with self.lock:
            if self.keeper is None and self.members is None:  # frozen by a failure
                return
            self.agreed = self._apply(self.agreed, total, divisor, lr_scale)
            self.applied = r
            if average:
                self.pending = r
            if self.pending is None and self.keeper is not None:
                self.keeper.completed(self.done, self.state_dict, save=False)

    def rebase(self, r: int, theta: torch.Tensor) -> None:
        """Round ``r``'s model average is ``theta`` (main thread): the agreed model from it on,
        with the rounds the reducer completed since."""
        if self.keeper is None and self.members is None:
            return
        with self.lock:
            if self.frozen:  # a regroup hands the agreed model over instead
                return
            model = theta
            for later in range(r + 1, self.applied + 1):
                model = self._apply(model, *self.steps[later])
            self.agreed, self.pending = model, None

    # ---- a regroup under --on-rank-loss shrink (``runtime.partial.regroup``) --------------
    def freeze_for_regroup(self) -> None:
        """ABORTING: a round the reducer completes from now on counts nowhere here."""
        with self.lock:
            self.frozen = True

    def handover_state(self, fewest: int, clock: float) -> dict[str, Any]:
        """What the lead hands over (HANDOVER): its agreed model after its last completed
        round, the rule, the clock (``clock``: the run's seconds now), the communication
        draws, the update and the rows of its rounds past the ``fewest`` rank 0 holds."""
        with self.lock:
            owed = self.done - fewest
            if owed > len(self.recent):
                raise TailtrainError(f"a regroup owes {owed} rows; ranks keep {HANDED_ROWS}")
            return envelope.seal(
                step=self.done,
                now=self.now,
                rule=self.driver.state_dict(),
                update=self.update.state_dict(),
                rows=envelope.rows_at(self.done, list(self.recent)[len(self.recent) - owed :]),
                rng=False,
                origin=clock,
                agreed=self.agreed.clone(),
                comm=checkpoint.capture(self.comm, checkpoint.COMM_STATIC),
                members=list(self.members or []),
            )

    def owed_rows(self, state: dict[str, Any]) -> list[dict[str, Any]]:
        """The rows of ``state`` (:meth:`handover_state`) past this rank's last round."""
        rows, need = envelope.step_tail(state), int(state["step"]) - self.done
        return rows[max(0, len(rows) - need) :] if need > 0 else []

    def take_over(self, state: dict[str, Any], members: list[int], generation: int) -> None:
        """Go on from the lead's ``state`` in the generation of ``members`` (HANDOVER): the
        rule follows the live world; no checkpoint is taken after a shrink (a resume would
        be a whole world's launch)."""
        with self.lock:
            for row in self.owed_rows(state):
                if self.record is not None:
                    self.record.add_step(row)
                self.recent.append(row)
                self.last_row = row
            self.base = self.done = int(state["step"])
            self.now, self.origin = float(state["now"]), float(state["origin"])
            self.agreed = state["agreed"]
            envelope.unseal(state, rule=self.driver, update=self.update)
            self.driver, _ = follow_live(self.driver, self.world.context, members)
            checkpoint.restore(self.comm, state["comm"])
            self.steps, self.averages, self.pending, self.applied = {}, [], None, -1
            self.members, self.keeper, self.frozen = members, None, False
            self.carried, self.generation, self.growing = set(), generation, False

    def freeze(self) -> None:
        """The group failed: no more snapshots, so the census writes the one it counted."""
        with self.lock:
            self.keeper = None

    def _apply(self, theta: torch.Tensor, total: torch.Tensor, divisor: float, scale: float):
        return self.update.apply_reduced(theta, total.to(theta.dtype), divisor, scale)

    def state_dict(self) -> dict[str, Any]:
        """The envelope after the last completed round (``core.envelope``; module docstring);
        its parts: the agreed model by reference (an update replaces it) and the
        communication draws."""
        evals, last = self.evals.record.evals, [] if self.last_row is None else [self.last_row]
        return envelope.seal(
            step=self.done,
            now=self.now,
            rule=self.driver.state_dict(),
            update=self.update.state_dict(),
            evals=self.evals,
            rows=envelope.rows_at(self.done, last, len(evals), evals[-1:]),
            theta=self.agreed,
            comm=checkpoint.capture(self.comm, checkpoint.COMM_STATIC),
        )

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        self.base = self.done = int(saved["step"])
        self.now = self.origin = float(saved["now"])
        self.agreed = saved["theta"]
        envelope.unseal(saved, rule=self.driver, update=self.update, evals=self.evals)
        checkpoint.restore(self.comm, saved["comm"])
        self.last_row = next(iter(envelope.step_tail(saved)[-1:]), None)


def uniform_weight(selection: Selection, keys: np.ndarray) -> tuple[float, float]:
    """The one weight every contribution gets, and the divisor; a partial collective sums the
    contributions before the arrivals are known, so unequal weights cannot be applied."""
    if len(selection.later):
        raise TailtrainError("the partial-collective topology applies no deferred weights")
    weights = selection.now.over(keys) * selection.now.divisor
    if len(keys) and not np.allclose(weights, weights[0]):
        raise TailtrainError("a partial collective can only weigh its contributions equally")
    return (float(weights[0]) if len(keys) else 0.0), selection.now.divisor or 1.0


def measured_round_row(
    result: RoundResult, stats: StepStats, members: list[int] | None = None
) -> dict[str, Any]:
    """The simulator's partial-collective row (``sim.partial.engine``), measured; with
    ``members`` (a shrunk generation's original ranks) the ranks it names are original."""
    rows, r, plan = result.rows, result.index, result.plan
    active = result.active
    initiators = result.initiators
    summed = ~result.screened  # a screened-out gradient joined as zeros: not in the sum
    nonfinite = int(np.count_nonzero(result.screened))
    if plan.synchronous:  # everyone activates itself; the last call completes it (the sim's)
        initiators = np.array([int(np.argmax(result.slots[:, 1]))])
    if members is not None:
        ids = np.asarray(members, dtype=np.int64)
        rows = np.column_stack([ids[rows[:, 0].astype(np.int64)], rows[:, 1:]])
        active, initiators = ids[active], ids[initiators]
    measured = {
        "initiators": initiators.tolist(),
        "active": active.tolist(),
        "reach": result.reach - result.activation,
    }
    initiator = int(initiators[0]) if initiators.size else -1
    workers, staleness = rows[summed, 0], r - rows[summed, 2]
    row = partial.round_row(stats, plan, workers, staleness, int(active.size), initiator, measured)
    return RunKeeper.note_nonfinite(row, nonfinite)
