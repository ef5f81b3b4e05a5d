"""One allreduce rank's state between its rounds (``runtime.allreduce.rounds``), grouped by what
moves it: the run's fixed parts, the agreed clock (:class:`Clock`), the elastic membership
under ``--on-rank-loss shrink`` (:class:`Membership`), and the rounds on their way to the
record (:class:`Exchange`, :class:`Unsettled`).

Data only: the round (``rounds``), its deal (``deal``), its accounting (``accounts``) and its
checkpoint (``keep``) all work on a :class:`AllreduceRank` and none of them on another's module,
so each names this one in its type hints."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from tailtrain.core.evaluation import Evaluator
from tailtrain.core.records import RunRecord
from tailtrain.core.scenario import World
from tailtrain.core.update import WeightedUpdate
from tailtrain.runtime.config import TrainConfig
from tailtrain.runtime.control import RuleDriver
from tailtrain.runtime.dealer import Dealer
from tailtrain.runtime.elastic.shrink import Shrinker
from tailtrain.runtime.grads import ModuleGrads
from tailtrain.runtime.inject import Injector
from tailtrain.runtime.keep import Keeper
from tailtrain.runtime.reduce import Collectives, SumBuffer
from tailtrain.runtime.telemetry import RankLog, Settled, TraceRows
from tailtrain.strategies.base import AllreducePlan as Plan
from tailtrain.strategies.base import StepStats
from tailtrain.topology.allreduce import RoundData

#: column of the first unit time in a gathered row [C_n, T~_n, injected, t_n^(1..U)]
TIMES = 3


class Exchange(NamedTuple):  # a tuple: made on every round's critical path
    """A round as its allreduce left it, for ``accounts.account``: its index, the agreed clock
    at its start, the plan and M, the gathered rows [C_n, T~_n, injected, t_n^(1..U)], the
    reduced [loss sum, units, sum ||G_n||^2, non-finite gradients, weight withheld], the
    gathered screened-out flags (> 0: that rank's gradient was), the weight this rank reduced
    with, the reduced sum of the weights with what screened ranks withheld, the agreed clock at
    the round's end, the latest agreed T^c, and the divisor the rule gave this rank's arrival
    alone (a static rule's update uses it)."""

    step: int
    start: float
    plan: Plan
    m: int
    rows: np.ndarray
    extras: np.ndarray
    screened: np.ndarray
    weight: float
    total: float
    time: float
    comm_time: float
    divisor: float | None
    #: on demand: the micro-batches each rank was dealt (its cut one included)
    dealt: np.ndarray | None = None


@dataclass
class Unsettled:
    """A round on its way to the record: its exchange, and its statistics once it is
    accounted (``accounts.account``); its row is made once its timings have come
    (``accounts.settle``, ``accounts.flush``). A rule that adapts is accounted at once, as its
    next plan needs the statistics; a static rule's rounds are accounted with their rows
    (``rounds`` module docstring, 4.)."""

    ex: Exchange
    stats: StepStats | None = None
    #: under ``--on-rank-loss shrink``: the original ranks of the round's generation, in
    #: their order (its arrival n is rank ``live[n]``'s), and the ranks lost just before it
    live: tuple[int, ...] | None = None
    dead: tuple[int, ...] = ()
    rejoined: tuple[int, ...] = ()
    #: under shrink: the index in its generation of the rank that made the exchange, and the
    #: rule as started for that generation's world
    index: int | None = None
    rule: RuleDriver | None = None
    #: under shrink: the wall clock (Unix seconds) when this rank applied the round's update
    committed: float = math.nan


@dataclass
class Clock:
    """The agreed clock of the rounds (``rounds`` module docstring, 5.): the same on every rank,
    it drives the time budget, the evaluation schedule and time-scheduled delay patterns."""

    #: settled rounds' wall seconds plus the latest round's estimate
    now: float = 0.0
    #: wall seconds of the settled rounds
    settled: float = 0.0
    #: the latest agreed T^c (NaN before any round settled)
    comm_time: float = math.nan
    #: this rank's [allreduce, round seconds] of the latest round, sent with the next one
    timing: tuple[float, float] = (math.nan, math.nan)


@dataclass
class Membership:
    """Who takes part, under ``--on-rank-loss shrink`` (``runtime.elastic.shrink``); without a
    shrinker the group is the launch's and nothing here moves."""

    #: the protocol (None: ``--on-rank-loss stop``)
    shrinker: Shrinker | None = None
    #: the delay draws as they stood before the round in flight drew its own
    drawn: dict[str, Any] | None = None
    #: the ranks lost and taken in again since the latest round, for its row
    lost: tuple[int, ...] = ()
    joined: tuple[int, ...] = ()
    #: this rank (the lowest member) saw a rank ask to join; the latest round's allreduce said
    #: some rank did (``grow``), so every member takes it in after the round
    joins_waiting: bool = False
    grow: bool = False


@dataclass
class AllreduceRank:
    """Mutable state of one rank's run; lives only inside ``rounds.train_allreduce``."""

    config: TrainConfig
    world: World
    rule: RuleDriver
    learner: RoundData
    injector: Injector
    comm: Collectives
    log: RankLog
    trace: TraceRows
    record: RunRecord
    evals: Evaluator
    update: WeightedUpdate
    grads: ModuleGrads
    keeper: Keeper
    #: this rank's original rank (its data shard and delays), whatever its generation's
    rank: int = 0
    step: int = 0
    clock: Clock = field(default_factory=Clock)
    membership: Membership = field(default_factory=Membership)
    unsettled: Unsettled | None = None
    #: settled rounds, with their gathered timings, whose record rows are still to be made
    #: (``accounts.settle``, ``accounts.flush``)
    settling: list[tuple[Unsettled, Settled, np.ndarray]] = field(default_factory=list)
    #: the reduce buffer, kept while the rounds' layout stays (``rounds.sum_buffer``)
    sums: SumBuffer | None = None
    #: the store's counters of rounds dealt on demand (``runtime.allreduce.demand``)
    dealer: Dealer | None = None
    #: a rank asked to stop (Ctrl-C) in the latest round's allreduce: every rank stops there
    interrupted: bool = False
