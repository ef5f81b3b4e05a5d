"""One allreduce round of a user's own training loop, decided by the simulator's rule objects.

The same protocol as ``tailtrain.runtime.allreduce.rounds`` (which documents it step by step), with
the user's model doing the compute and the wall clock deciding:

1. ``plan`` (``runtime.control.RuleDriver``): tau, H, the stopping convention.
2. ``units`` yields the round's micro-batches one at a time; between two of them it
   compares the round's elapsed compute time with tau (DropCompute Algorithm 1; a unit in
   flight is never cut, so ``stop=preempt`` and ``stop=between`` differ only in ``<`` against
   ``<=``: ``strategies.dropcompute.may_start``). The seconds between a yield and the next request
   are that unit's measured time t_n^(u).
3. ``agree`` all-gathers ``[C_n, T~_n, loss sum, t_n^(1..U)]`` so that every rank
   builds the same arrivals (``topology.allreduce.round_arrivals``), the rule's ``select`` gives
   every rank the same weights, and Algorithm 2's measured times are the same everywhere.
   ``StragglerStep``, the DDP comm hook and their elastic rounds gather nothing here (but for
   a half-precision model): this rank's weight from its own counts (``own``) goes into 4.,
   whose allreduce (the first DDP bucket's) carries the rows (``own_rows``), and
   ``agreement`` makes the selection over them after it (``integrate.average.agreed_average``,
   ``integrate.ddp``), as ``train`` does.
4. The caller reduces ``[sum_n w_n G_n, sum_n w_n]`` (``runtime.reduce.Collectives`` or a DDP
   comm hook) and applies it.
5. ``close`` all-gathers ``[reduce seconds, round seconds]`` (T^c is the
   smallest reduce seconds, the round's time the slowest rank's, as in ``train``:
   ``runtime.control.round_times``), calls ``adapt`` (Algorithm 2 for ``threshold=auto``)
   and returns the round's ``StepRecord``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, NamedTuple

import numpy as np
import torch

from tailtrain.core import envelope
from tailtrain.core.update import GradientStats, closed_step_stats, without
from tailtrain.errors import UsageError
from tailtrain.runtime.control import (
    OwnWeight,
    RankWeighting,
    RuleDriver,
    round_times,
    screened_keys,
    screened_out,
    weighting,
)
from tailtrain.runtime.reduce import Collectives
from tailtrain.strategies.base import (
    AllreducePlan,
    ArrivalColumns,
    Context,
    Selection,
    Strategy,
)
from tailtrain.strategies.dropcompute import may_start
from tailtrain.strategies.entries import loop_refusal
from tailtrain.strategies.registry import parse_strategy
from tailtrain.topology.allreduce import own_arrival, round_arrivals

#: column of the first unit time in a gathered row [C_n, T~_n, loss sum, t_n^(1..U)]
FIRST_UNIT_TIME = 3


@dataclass(frozen=True)
class StepRecord:
    """Who took part in one round, as every rank agreed on it.

    ``completed[n]`` micro-batches of rank n counted, with coefficient ``weights[n]`` in the
    update (its normalised weight; 0: it did not take part, or its gradient held a NaN or an
    infinity and was screened out, ``nonfinite`` counts those); ``ranks`` are those with a
    non-zero weight. ``threshold`` is tau in force (inf: none, e.g. while calibrating),
    ``time`` the round's wall seconds (slowest rank), ``compute_time`` the slowest rank's
    compute seconds and ``comm_time`` T^c, the smallest reduce seconds over the ranks.
    ``loss`` is the mean loss of the counted micro-batches over all ranks (NaN where the loop
    does not report losses, or where none was counted). ``empty``: no rank's gradient
    entered the update (no rank counted a micro-batch, the threshold stopping every rank
    before its first, or every rank that did was screened out), so the update is zero:
    ``StragglerStep`` does not step the optimizer; under the DDP hook, skip
    ``optimizer.step()`` yourself when it is set (a zero gradient still moves momentum and
    weight decay), as ``train`` makes no update (``topology.allreduce.step_row``).
    """

    step: int
    threshold: float
    micro_batches: int
    local_steps: int
    completed: list[int]
    weights: list[float]
    ranks: list[int]
    loss: float
    drop_rate: float
    compute_time: float
    comm_time: float
    time: float
    nonfinite: int = 0
    #: micro-batches each rank was dealt this round under ``rebalance`` (None: any rule that
    #: takes what the loop gives); ``completed`` counts those it computed
    shares: list[int] | None = None
    #: dealt on demand (``rebalance:deal=demand``, ``ShardedStep``): the stream positions
    #: each rank computed, in order, all counted (``completed[n]`` of them: the step deals
    #: the pool alone, ``strategies.rebalance.deals``). None under any other deal
    dealt: list[list[int]] | None = None
    #: micro-batches this rank's next call should compute (``rebalance``'s share for it: the
    #: rule moved the shares in this round's ``adapt``); None: as many as the loop gives
    wants: int | None = None
    #: the job's ranks that stepped in this round, in order: ``completed[n]`` and
    #: ``weights[n]`` (and ``ranks``) are rank ``live[n]``'s. Every rank of the job unless a
    #: shrink (``StragglerStep(on_rank_loss="shrink")``) left some out
    live: list[int] = field(default_factory=list)
    #: ranks of the job lost since the previous round (a shrink went on without them)
    lost: list[int] = field(default_factory=list)
    #: whether the survivors computed this round again after a shrink (its first try was
    #: abandoned when a rank died or hung in it)
    redone: bool = False
    #: ranks of the job taken in again just before this round (a heal: a rank started again
    #: by ``tailtrain launch --restart-lost`` joined at the step boundary before it)
    rejoined: list[int] = field(default_factory=list)
    #: no rank's gradient entered (none counted a micro-batch, or all that did were
    #: screened out): no update (class docstring)
    empty: bool = False
    #: this rank passed the step without computing it: it was started again and the live
    #: ranks took the step before it joined (``integrate.elastic_ddp``); ``empty`` too, as its
    #: update is in the state it took from them
    skipped: bool = False
    #: the ``StragglerStep``'s ``torch.amp.GradScaler`` found the averaged gradient not
    #: finite and skipped the optimizer step (its scale backed off), on every rank alike: the
    #: ranks took part as recorded, but the update was not applied
    overflowed: bool = False

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class RoundProgress:
    """This rank's round so far: unit seconds (NaN: not computed), compute seconds, loss sum."""

    times: np.ndarray
    compute: float = 0.0
    loss_sum: float = 0.0
    started: float = field(default_factory=time.perf_counter)
    #: the threshold refused a unit: no later one starts (``Rounds.admit``)
    stopped: bool = False

    @property
    def done(self) -> int:
        return int(np.count_nonzero(~np.isnan(self.times)))


class Agreement(NamedTuple):
    """What every rank knows once every rank's rows came (their gather, or the weighted
    allreduce that carried them): rows, arrivals, the rule's selection, and this rank's
    weight and divisor."""

    rows: np.ndarray
    arrivals: ArrivalColumns
    selection: Selection
    mine: RankWeighting
    #: dealt on demand: the k of each rank's dealt units (N, N M), -1 past them
    dealt: np.ndarray | None = None


def as_strategy(strategy: str | Strategy, does: frozenset[str] = frozenset()) -> Strategy:
    """A strategy spec (``"dropcompute:threshold=auto"``) or object, checked for a loop whose
    entry ``does`` these extras (``Strategy.needs``: ``StragglerStep`` deals ``shares``), by
    the contract ``advise --for`` reads too (``strategies.entries``)."""
    rule = parse_strategy(strategy) if isinstance(strategy, str) else strategy
    refusal = loop_refusal(rule, does)
    if refusal is not None:
        raise UsageError(refusal)
    return rule


def check_micro_batches(rule: Strategy, micro_batches: int | None) -> Strategy:
    """``rule``, once it has the M it needs: a rule of per-rank shares (``rebalance``) deals
    N M micro-batches a round, so it needs sync's M; refused in one line otherwise."""
    if micro_batches is not None and micro_batches < 1:
        raise UsageError(f"micro_batches must be >= 1, got {micro_batches}")
    if rule.needs and micro_batches is None:
        raise UsageError(
            f"{rule.describe()!r} deals sync's global batch of N M micro-batches by per-rank "
            "shares: give micro_batches=M, the micro-batches a rank computes per step under sync"
        )
    return rule


class Rounds:
    """The rule, its state and the round protocol on one rank of ``comm``'s group.

    ``micro_batches`` is sync's M, which a rule of per-rank shares (``rebalance``) deals
    N M micro-batches of each round by; ``does`` what the caller's loop deals
    (``as_strategy``)."""

    def __init__(
        self,
        strategy: str | Strategy,
        comm: Collectives,
        lr: float = 0.1,
        *,
        micro_batches: int | None = None,
        does: frozenset[str] = frozenset(),
    ) -> None:
        self.comm = comm
        self.lr = lr
        rule = check_micro_batches(as_strategy(strategy, does), micro_batches)
        self.micro_batches = micro_batches
        ctx = Context(n_workers=comm.world_size, lr=lr, micro_batches=micro_batches or 1)
        #: the rule's world (a shrink replaces it with the live one: ``RuleDriver.followed``)
        self.ctx = ctx
        self.rule = RuleDriver(rule, ctx)
        self.step = 0
        self.now = 0.0
        #: dealt on demand: the stream positions the completed rounds dealt (the next round's
        #: first is this one: ``integrate.demand``); None under any other deal
        self.stream: int | None = 0 if "demand" in rule.needs else None
        self.sync = torch.cuda.synchronize if comm.device.type == "cuda" else None
        #: the job's ranks of ``comm``'s group, in order (a shrink's live ranks)
        self.live = tuple(range(comm.world_size))

    @property
    def strategy(self) -> Strategy:
        return self.rule.strategy

    def plan(self, units: int) -> tuple[AllreducePlan, int]:
        """The round's plan and its micro-batches per local step M, for ``units`` given."""
        plan = self.rule.plan()
        if plan.on_demand:  # the pool of N M, dealt as ranks ask (``integrate.sharded``)
            return plan, self.micro_batches or units
        if plan.shares is not None:
            wants = plan.shares[self.comm.rank]
            if units != wants:
                raise UsageError(
                    f"{self.strategy.describe()!r} deals this rank {wants} micro-batches "
                    f"this step, got {units}: give the count ``wants`` says (the step "
                    "record's, or the step's), or draw them with tailtrain.ShareSampler"
                )
            return plan, self.micro_batches or units
        h = plan.local_steps
        if units < 1 or units % h:
            raise UsageError(
                f"{self.strategy.describe()!r} runs {h} local step(s) per round: give a "
                f"multiple of {h} micro-batches per call, got {units}"
            )
        return plan, units // h

    def clock(self) -> float:
        """Wall seconds; on a GPU after the queued kernels finish (a unit's real time)."""
        if self.sync is not None:
            self.sync(self.comm.device)
        return time.perf_counter()

    def units(
        self, batches: Sequence[Any], plan: AllreducePlan, work: RoundProgress
    ) -> Iterator[Any]:
        """Yield micro-batches while tau allows; fill ``work`` with their measured times.

        A loop that owns its iteration (Lightning's over ``accumulate_grad_batches``) runs the
        same steps pushed one at a time: ``open``, then per unit ``admit`` and ``unit_done``,
        then ``seal``."""
        self.open(work, len(batches))
        for u, batch in enumerate(batches):
            if not self.admit(work, plan):
                break
            began = self.clock()
            yield batch
            self.unit_done(work, u, began)
        self.seal(work)

    def open(self, work: RoundProgress, units: int = 0) -> None:
        """Start the round's clock with ``units`` slots for unit times (a loop that learns its
        units one at a time adds them: ``RoundProgress.times`` grows)."""
        work.times = np.full(units, np.nan)
        work.stopped = False
        work.started = self.clock()

    def admit(self, work: RoundProgress, plan: AllreducePlan) -> bool:
        """May the round's next unit start? DropCompute Algorithm 1 between units
        (``strategies.dropcompute.may_start`` on the round's elapsed seconds); once a unit was
        refused no later one starts, and the round's compute ends there."""
        if work.stopped:
            return False
        now = self.clock()
        if may_start(now - work.started, plan.threshold, plan.preempt):
            return True
        self.stop(work, now)
        return False

    def stop(self, work: RoundProgress, now: float | None = None) -> None:
        """The round's compute ends at ``now`` (``clock``; None: this instant) and no later unit
        starts: ``admit``'s refusal, or a refusal this rank follows (a sharded model's group
        stops as one when any of its ranks is refused: ``integrate.sharded``)."""
        work.stopped = True
        work.compute = (self.clock() if now is None else now) - work.started

    def unit_done(self, work: RoundProgress, unit: int, began: float) -> None:
        """Unit ``unit``, begun at ``began`` (``clock``), finished: its measured time."""
        work.times[unit] = self.clock() - began

    def seal(self, work: RoundProgress) -> None:
        """The round's units are over: its compute seconds, unless a refusal ended them."""
        if not work.stopped:
            work.compute = self.clock() - work.started

    def wants(self) -> int | None:
        """Micro-batches this rank's next round computes: its share under a rule of shares
        (``rebalance``), None under any other (as many as the loop gives, or as many as it
        asks for under ``deal=demand``)."""
        plan = self.rule.plan()
        return None if plan.shares is None or plan.on_demand else int(plan.shares[self.comm.rank])

    def agree(
        self,
        work: RoundProgress,
        plan: AllreducePlan | None = None,
        dealt: Sequence[int] | None = None,
    ) -> Agreement:
        """All-gather every rank's counts and times; the rule's selection on them. Under a
        ``plan`` of shares the rows are as wide as the largest share and a rank's arrival
        counts its micro-batches against M (its weight C_n / M over N, as in ``train``);
        dealt on demand, as wide as the pool N M, and ``dealt`` (the k of each unit this rank
        was dealt, its counted ones first) joins the row as the runtime's does
        (``Agreement.dealt``). A step whose gradients can carry the rows gathers none: they
        ride in its weighted allreduce (``integrate.average.agreed_average``)."""
        rows = self.own_rows(work, plan, dealt)
        gathered = self.comm.gather(np.concatenate(rows))
        if dealt is None:
            return self.agreement(work, plan, gathered)
        main, index = np.split(gathered, [len(rows[0])], axis=1)
        return self.agreement(work, plan, main, index)

    def own_rows(
        self,
        work: RoundProgress,
        plan: AllreducePlan | None = None,
        dealt: Sequence[int] | None = None,
    ) -> list[np.ndarray]:
        """This rank's rows of the agreement (:meth:`agree`): [C_n, T~_n, loss sum,
        t_n^(1..U)] and, dealt on demand, the k of each unit it was dealt (-1 past them)."""
        times = work.times
        if plan is not None and plan.shares is not None:
            width = sum(plan.shares) if plan.on_demand else max(plan.shares)
            times = np.full(width, np.nan)
            times[: len(work.times)] = work.times
        rows = [np.concatenate([[work.done, work.compute, work.loss_sum], times])]
        if dealt is not None:
            rows.append(np.full(len(times), -1.0))
            rows[-1][: len(dealt)] = dealt
        return rows

    def own(self, work: RoundProgress, plan: AllreducePlan | None = None) -> OwnWeight:
        """This rank's weight w_n and the divisor from its own arrival alone
        (``RuleDriver.own_weight``), known before anything is exchanged, as ``train``'s round
        knows it (``runtime.allreduce``, 3.); the selection over every rank's rows
        (:meth:`agreement`) must then give the same."""
        units, step, now, rank = self._units(work, plan), self.step, self.now, self.comm.rank
        done, compute = work.done, work.compute
        return self.rule.own_weight(
            done, units, lambda: own_arrival(step, now, rank, done, compute, units)
        )

    def agreement(
        self,
        work: RoundProgress,
        plan: AllreducePlan | None,
        rows: np.ndarray,
        index: np.ndarray | None = None,
    ) -> Agreement:
        """The rule's selection over every rank's rows (:meth:`own_rows`, gathered):
        identical arrivals on every rank, this rank's weight and divisor; ``index``: dealt on
        demand, every rank's units' k."""
        rows = np.asarray(rows, dtype=np.float64)
        units = self._units(work, plan)
        arrivals = round_arrivals(self.step, self.now, rows[:, 0], rows[:, 1], units)
        selection = self.rule.select(arrivals)
        mine = weighting(selection, self.comm.rank)
        dealt = None if index is None else np.asarray(index).astype(np.int64)
        return Agreement(rows, arrivals, selection, mine, dealt)

    def _units(self, work: RoundProgress, plan: AllreducePlan | None) -> int:
        """The units an arrival counts against: the round's, or M under a plan of shares."""
        if plan is not None and plan.shares is not None:
            return self.micro_batches or len(work.times)
        return len(work.times)

    def close(
        self,
        plan: AllreducePlan,
        work: RoundProgress,
        agreed: Agreement,
        reduce: float,
        screened: bool,
    ) -> StepRecord:
        """Agree on T^c, the round's time and who was screened out (``screened``: this rank's
        gradient held a NaN or an infinity and joined with weight 0), ``adapt``, and record
        the round: ``timing``, then ``finish``."""
        return self.finish(plan, work, agreed, self.timing(reduce, work, screened))

    def timing(
        self, reduce: float, work: RoundProgress, screened: bool, asks: bool = False
    ) -> np.ndarray:
        """The round's last collective: every rank's [reduce seconds, round seconds, screened,
        asks] (``asks``: a shrinking step's lowest member saw a rank ask to join, so every
        rank takes it in after this round). Past it the round is complete on this rank (a
        shrink goes on from there)."""
        row = np.array([reduce, self.clock() - work.started, screened, asks])
        return self.comm.gather(row)

    def finish(
        self,
        plan: AllreducePlan,
        work: RoundProgress,
        agreed: Agreement,
        timing: np.ndarray,
        positions: list[list[int]] | None = None,
    ) -> StepRecord:
        """``close`` after its gather: ``adapt`` and the round's record, no collective.
        ``positions``: dealt on demand, the stream positions each rank computed."""
        comm, elapsed = round_times(timing)
        flags = timing[:, 2] > 0
        rows, arrivals = agreed.rows, agreed.arrivals
        done = rows[:, 0].astype(np.int64)
        loss = float(rows[:, 2].sum() / done.sum()) if done.sum() > 0 else math.nan
        stats = closed_step_stats(
            self.step,
            plan.k,
            self.now + elapsed,
            arrivals,
            screened_out(agreed.selection.used(), arrivals, flags),
            GradientStats(loss=loss),
            self.lr * plan.lr_scale,
            rows[:, FIRST_UNIT_TIME:],
            comm,
        )
        self.rule.adapt(stats)
        applied = without(agreed.selection.now, screened_keys(arrivals, flags))
        coefficients = applied.over(arrivals.keys)
        units = len(work.times)
        planned = sum(plan.shares) if plan.shares is not None else 0
        if plan.shares is not None:  # the global batch is N M, however it was dealt
            units = self.micro_batches or units
        record = StepRecord(
            step=self.step,
            threshold=plan.threshold,
            micro_batches=units // plan.local_steps,
            local_steps=plan.local_steps,
            completed=done.tolist(),
            weights=coefficients.tolist(),
            ranks=np.flatnonzero(coefficients != 0).tolist(),
            loss=loss,
            # dealt on demand the pool is N M whoever is live (a shrink keeps it)
            drop_rate=1.0 - float(done.sum()) / (planned if plan.on_demand else len(done) * units),
            compute_time=float(rows[:, 1].max()),
            comm_time=comm,
            time=elapsed,
            nonfinite=int(flags.sum()),
            shares=None if plan.shares is None or plan.on_demand else list(plan.shares),
            dealt=positions,
            wants=self.wants(),
            live=list(self.live),
            # the weights that entered, all 0: StragglerStep's total (sum_n w_n) is 0 too
            empty=not applied.weight.any(),
        )
        self.step, self.now = self.step + 1, stats.time
        return record

    # ---- checkpoints: the rule's state and the round count; never the process group --------
    def sealed(self, deadline: list[float] | None = None, **parts: Any) -> dict[str, Any]:
        """The envelope after the last round (``core.envelope``): the rule's state, the round
        count and clock, and dealt on demand the stream's place; the record is the user's, and
        so is torch's generator. A regroup's hand-over adds the learned ``deadline`` and
        ``parts`` (the model, the optimizer)."""
        rule, now = self.rule.state_dict(), self.now
        if self.stream is not None:
            parts["stream"] = {"taken": self.stream}
        return envelope.seal(
            step=self.step, now=now, rule=rule, rows=None, deadline=deadline, rng=False, **parts
        )

    def state_dict(self) -> dict[str, Any]:
        return self.sealed()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        # a StragglerStep checkpoint saved before the envelope named the rule "strategy"
        if "rule" not in state:
            state = {**state, "rule": state["strategy"], "now": state["time"], "torch_rng": None}
        stream = state.get("stream")
        if (stream is not None) != (self.stream is not None):
            raise UsageError(
                "load_state_dict: the state was saved by a step "
                + ("dealt on demand" if stream is not None else "not dealt on demand")
                + f", this one runs {self.strategy.describe()!r}"
            )
        envelope.unseal(state, rule=self.rule)
        self.step, self.now = int(state["step"]), float(state["now"])
        if stream is not None:
            self.stream = int(stream["taken"])
