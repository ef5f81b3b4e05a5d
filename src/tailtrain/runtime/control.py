"""The one place where the runtime talks to a strategy: ``plan``, ``select``, ``adapt``.

:class:`RuleDriver` is the only caller of a rule's methods in ``runtime/``: the allreduce's
rounds, the partial collective's reducer thread (``runtime.partial.rule.Rule``) and the
parameter server's loop (``runtime.ps.server.Server``) hold a driver, never the rule's state.

Every rank holds its own copy of the rule's state and calls the rule with identical inputs
(arrivals and statistics gathered or reduced over all ranks), so every rank reaches the same
decision without a broadcast; the reduced sum of the weights checks that they did.

``weighting`` is the only function that reads a :class:`~tailtrain.strategies.base.Selection`.
``select`` returns unnormalised weights w_i and, where the rule fixes it, their divisor (N for
DropCompute's divide-by-M); otherwise the divisor is the reduced sum_i w_i. One allreduce of
``[w_n G_n, w_n]`` therefore serves every weighting.

A rank must know its own weight before that allreduce, but the arrivals of the others only
after it: :meth:`RuleDriver.own_weight` asks the rule about this rank's arrival alone
(``own_arrival``). That is exact for every allreduce rule, whose weight of an arrival
depends on the units it counts only (sync: 1; DropCompute and Local-SGD: C_n / (H M)), so
the driver asks once per state and count and remembers the answer: a static rule's state
never changes, and its consultation leaves the round's critical path. Once the allreduce has
brought every rank's counts, :func:`check_own_weight` confirms the weight and
:func:`check_divisor` the divisor, so a rule that weighs more than the counts (the finish
time, say) is refused, not mis-weighted.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from tailtrain.core.session import screened as screened_from
from tailtrain.core.update import key_workers
from tailtrain.errors import TailtrainError
from tailtrain.strategies.base import (
    ArrivalColumns,
    Context,
    Plan,
    Selection,
    StepStats,
    Strategy,
    Weighting,
)
from tailtrain.topology.allreduce import as_allreduce

#: relative tolerance of the check that every rank used the same weights
WEIGHT_RTOL = 1e-4


class RankWeighting(NamedTuple):
    """This rank's weight w_n, the sum of all weights, the divisor the rule fixed (None: the
    reduced sum of the weights) and the keys of the arrivals used."""

    weight: float
    total: float
    divisor: float | None
    used: np.ndarray


class OwnWeight(NamedTuple):
    """This rank's weight w_n from its arrival alone, and the divisor the rule fixes for it
    (None: the reduced sum of the weights)."""

    weight: float
    divisor: float | None


def weighting(selection: Selection, rank: int) -> RankWeighting:
    """Turn the rule's selection into this rank's unnormalised weight and the divisor.

    The allreduce topology applies each round's update at once: no allreduce rule defers
    weights, and one that did would need a second reduction, so it is refused.
    """
    now = applied_now(selection)
    # a selection weighs only arrivals it was offered, so rank n's are those keyed by worker n
    own = float(now.weight[key_workers(now.keys) == rank].sum())
    return RankWeighting(own, float(now.weight.sum()), now.total, selection.used())


def applied_now(selection: Selection) -> Weighting:
    """``selection.now``; refuses deferred weights (:func:`weighting`)."""
    if len(selection.later):
        raise TailtrainError("the allreduce topology applies no deferred (``later``) weights")
    return selection.now


def check_agreement(expected_total: float, reduced_total: float, rtol: float = WEIGHT_RTOL) -> None:
    """The allreduced sum of weights equals what this rank's selection says it should, to
    ``rtol`` (a sum carried in half precision: ``carried_rtol``)."""
    if not math.isclose(expected_total, reduced_total, rel_tol=rtol, abs_tol=1e-6):
        raise TailtrainError(
            f"ranks disagree on the weights: sum {reduced_total:.6g} reduced, "
            f"{expected_total:.6g} selected here"
        )


def carried_rtol(eps: float, terms: int) -> float:
    """How far a sum of ``terms`` weights may be from the rule's total when a buffer of
    machine epsilon ``eps`` carries it (a half-precision gradient's: each weight and partial
    sum rounded, half an ulp each): :data:`WEIGHT_RTOL`, or that rounding where coarser."""
    return max(WEIGHT_RTOL, terms * eps)


def check_own_weight(used: float, selected: float) -> None:
    """The weight this rank reduced with equals its weight in the selection over all ranks."""
    if not math.isclose(used, selected, rel_tol=WEIGHT_RTOL, abs_tol=1e-9):
        raise TailtrainError(
            f"the rule weighs this rank {selected:.6g} among all ranks but {used:.6g} alone: "
            "the one-allreduce protocol needs weights that depend on a rank's own counts"
        )


def check_divisor(used: float | None, selected: float | None) -> None:
    """The divisor an update used before the selection over all ranks was made (a static
    rule's, ``runtime.allreduce``) equals that selection's."""
    same = used is selected is None or (
        used is not None
        and selected is not None
        and math.isclose(used, selected, rel_tol=WEIGHT_RTOL, abs_tol=1e-9)
    )
    if not same:
        raise TailtrainError(
            f"the rule divides by {selected!r} among all ranks but by {used!r} for one rank "
            "alone: a rule that keeps its state must fix its divisor from that state"
        )


#: ``RuleDriver.select``'s default: the rule's current state
_CURRENT = object()


class RuleDriver:
    """A strategy and its state on one rank.

    ``shape`` checks the rule's plan as the topology takes it (the allreduce's
    :func:`~tailtrain.topology.allreduce.as_allreduce`, by default; None: as the rule gives
    it). ``remember``: ask the plan once per state object, as the allreduce's rounds do (a
    pure rule plans the same from the same state: a static rule's every round); the other
    topologies ask it every time, as they always did."""

    def __init__(
        self,
        strategy: Strategy,
        ctx: Context,
        shape: Callable[[Plan], Plan] | None = as_allreduce,
        *,
        remember: bool = True,
    ) -> None:
        self.strategy = strategy
        self.n = ctx.n_workers
        self.state: Any = strategy.init(ctx)
        self.shape, self.remember = shape, remember
        self._planned: tuple[Any, Plan] | None = None
        #: own weights asked of the current state, by counted units (:meth:`own_weight`)
        self._own: tuple[Any, dict[tuple[int, int], OwnWeight]] | None = None

    def plan(self) -> Plan:
        """The rule's plan for its state (class docstring)."""
        if self.remember and self._planned is not None and self._planned[0] is self.state:
            return self._planned[1]
        plan = self.strategy.plan(self.state)
        if self.shape is not None:
            plan = self.shape(plan)
        if self.remember:
            self._planned = (self.state, plan)
        return plan

    def select(self, arrivals: ArrivalColumns, state: Any = _CURRENT) -> Selection:
        """The rule's selection of ``arrivals`` in its current state, or in ``state`` (the
        parameter server asks LGC's step again, in the state before its ``adapt``)."""
        return self.strategy.select(self.state if state is _CURRENT else state, arrivals)

    def weights(self, arrivals: ArrivalColumns, rank: int) -> RankWeighting:
        return weighting(self.select(arrivals), rank)

    @property
    def keeps_state(self) -> bool:
        """Whether the rule never adapts (``Strategy.keeps_state``)."""
        return self.strategy.keeps_state

    def own_weight(self, done: int, units: int, arrival: Callable[[], ArrivalColumns]) -> OwnWeight:
        """w_n and the divisor from this rank's arrival alone, which counted ``done`` of its
        ``units`` (``arrival()`` builds it: :func:`own_arrival`). All that the selection weighs
        is this rank's, as a selection weighs only what it was offered. Asked once per state,
        count and units (module docstring: a loop may give a call more units than the last);
        the checks after the allreduce hold the rule to that."""
        if self._own is None or self._own[0] is not self.state:
            self._own = (self.state, {})
        known, key = self._own[1], (done, units)
        if key not in known:
            now = applied_now(self.select(arrival()))
            divisor = None if now.total is None else float(now.total)
            known[key] = OwnWeight(float(now.weight.sum()), divisor)
        return known[key]

    def adapt(self, stats: StepStats) -> None:
        self.state = self.strategy.adapt(self.state, stats)

    def followed(self, ctx: Context) -> RuleDriver | None:
        """This rule for a live world of ``ctx.n_workers`` ranks (``Strategy.follow_world``:
        ``--on-rank-loss shrink``, or a resume after one), or None where it cannot follow."""
        state = self.strategy.follow_world(self.state, ctx)
        if state is None:
            return None
        # the topology's own shape and asking (the partial collective's: none, every time)
        driver = RuleDriver(self.strategy, ctx, self.shape, remember=self.remember)
        driver.state = state
        return driver

    def state_dict(self) -> dict[str, Any]:
        """The rule's state for a checkpoint (``Strategy.state_dict``)."""
        return self.strategy.state_dict(self.state)

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        self.state = self.strategy.load_state_dict(saved)


def screened_keys(arrivals: ArrivalColumns, screened: np.ndarray) -> np.ndarray:
    """The keys of the arrivals whose gradient was screened out (NaN or inf); ``screened``
    holds one gathered flag per rank."""
    return arrivals.keys[screened[arrivals.worker.astype(np.int64)]]


def screened_out(used: np.ndarray, arrivals: ArrivalColumns, screened: np.ndarray) -> np.ndarray:
    """The used arrival keys less those of screened-out gradients, which did not enter the
    update (``core.session.screened``, as every engine drops them before adapt and the row),
    for ``train`` and ``StragglerStep`` alike; ``screened`` flags the ranks."""
    if not screened.any():
        return used
    return screened_from(used, screened_keys(arrivals, screened))


def round_times(timing: np.ndarray) -> tuple[float, float]:
    """T^c and the round's seconds from every rank's gathered ``[allreduce seconds, round
    seconds, ...]`` (N, 2 or more), the same for ``train`` and ``StragglerStep``.

    T^c is the collective's own time: the smallest allreduce seconds over the ranks. Every
    rank's allreduce also holds its wait for the slowest rank to arrive, and the rank that
    arrives last waits least; DropCompute (§4.2, App. C.1-C.2) charges T^c once per
    iteration on top of the slowest worker's compute, T = T^c + max_n T_n, so the largest
    allreduce seconds would count the straggler's lead twice in Algorithm 2's S_i(tau). The
    round's seconds are the slowest rank's.
    """
    # Python's min and max: numpy's cost more on (N, 2) run cold, and this is on the round
    # path. Every entry is a measured time, so no NaN meets min() here.
    seconds = timing.tolist()
    return min(row[0] for row in seconds), max(row[1] for row in seconds)
