"""The one place where the runtime talks to a strategy: ``plan``, ``select``, ``adapt``.

Every rank holds its own copy of the rule's state and calls the rule with identical inputs
(arrivals and statistics gathered or reduced over all ranks), so every rank reaches the same
decision without a broadcast; the reduced sum of the weights checks that they did.

``weighting`` is the only function that reads a :class:`~tailtrain.strategies.base.Selection`.
``select`` returns unnormalised weights w_i and, where the rule fixes it, their divisor (N for
DropCompute's divide-by-M); otherwise the divisor is the reduced sum_i w_i. One allreduce of
``[w_n G_n, w_n]`` therefore serves every weighting.

A rank must know its own weight before that allreduce, but the arrivals of the others only
after it: :meth:`RuleDriver.own_weight` asks the rule about this rank's arrival alone
(:func:`own_arrival`). That is exact for every allreduce rule, whose weight of an arrival
depends on that arrival only (sync: 1; DropCompute and Local-SGD: C_n / (H M)), and
:func:`check_own_weight` confirms it once the allreduce has brought every rank's counts.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

from tailtrain.errors import TailtrainError
from tailtrain.strategies.base import (
    AllreducePlan,
    ArrivalColumns,
    Context,
    Plan,
    Selection,
    ServerPlan,
    StepStats,
    Strategy,
)
from tailtrain.update import key_workers

#: relative tolerance of the check that every rank used the same weights
WEIGHT_RTOL = 1e-4


class Weighting(NamedTuple):
    """This rank's weight w_n, the sum of all weights, the divisor the rule fixed (None: the
    reduced sum of the weights) and the keys of the arrivals used."""

    weight: float
    total: float
    divisor: float | None
    used: np.ndarray


def weighting(selection: Selection, rank: int) -> Weighting:
    """Turn the rule's selection into this rank's unnormalised weight and the divisor.

    The allreduce topology applies each round's update at once: no allreduce rule defers
    weights, and one that did would need a second reduction, so it is refused.
    """
    now = selection.now
    return Weighting(
        own_share(selection, rank), float(now.weight.sum()), now.total, selection.used()
    )


def own_share(selection: Selection, rank: int) -> float:
    """Rank ``rank``'s unnormalised weight in ``selection``; refuses deferred weights
    (:func:`weighting`)."""
    if len(selection.later):
        raise TailtrainError("the allreduce topology applies no deferred (``later``) weights")
    now = selection.now
    # a selection weighs only arrivals it was offered, so rank n's are those keyed by worker n
    return float(now.weight[key_workers(now.keys) == rank].sum())


def check_agreement(expected_total: float, reduced_total: float) -> None:
    """The allreduced sum of weights equals what this rank's selection says it should."""
    if not math.isclose(expected_total, reduced_total, rel_tol=WEIGHT_RTOL, abs_tol=1e-6):
        raise TailtrainError(
            f"ranks disagree on the weights: sum {reduced_total:.6g} reduced, "
            f"{expected_total:.6g} selected here"
        )


def round_arrivals(
    step: int, now: float, done: np.ndarray, compute: np.ndarray, units: int
) -> ArrivalColumns:
    """An allreduce round's arrivals from gathered per-rank counts C_n and compute seconds
    T~_n. Built from gathered rows, they are identical on every rank."""
    done, compute = np.asarray(done, dtype=np.float64), np.asarray(compute, dtype=np.float64)
    return _round_columns(np.arange(len(done)), step, now, done, compute, units)


def own_arrival(
    step: int, now: float, rank: int, done: int, compute: float, units: int
) -> ArrivalColumns:
    """This rank's row of :func:`round_arrivals`, known before anything is exchanged."""
    return _round_columns(
        np.array([rank]), step, now, np.array([float(done)]), np.array([compute]), units
    )


def _round_columns(
    worker: np.ndarray, step: int, now: float, done: np.ndarray, compute: np.ndarray, units: int
) -> ArrivalColumns:
    """Rank n's r-th round is its r-th job, from model r, a fraction C_n / units of a full
    one."""
    steps = np.full(len(worker), step)
    return ArrivalColumns(
        worker, steps, steps.copy(), np.full(len(worker), now), now + compute, done / units
    )


def check_own_weight(used: float, selected: float) -> None:
    """The weight this rank reduced with equals its weight in the selection over all ranks."""
    if not math.isclose(used, selected, rel_tol=WEIGHT_RTOL, abs_tol=1e-9):
        raise TailtrainError(
            f"the rule weighs this rank {selected:.6g} among all ranks but {used:.6g} alone: "
            "the one-allreduce protocol needs weights that depend on a rank's own arrival"
        )


def as_allreduce(plan: Plan, n: int) -> AllreducePlan:
    """An allreduce rule's plan as it is; sync's server plan (k = n, fresh only, nothing
    partial) is the same round on an allreduce: every rank's whole gradient, averaged."""
    if isinstance(plan, AllreducePlan):
        return plan
    if isinstance(plan, ServerPlan) and (plan.k, plan.accept_stale, plan.partial_blocks) == (
        n,
        False,
        0,
    ):
        return AllreducePlan(k=n, lr_scale=plan.lr_scale)
    raise TailtrainError(f"a plan {plan!r} needs a topology other than allreduce")


class RuleDriver:
    """A strategy and its state on one rank."""

    def __init__(self, strategy: Strategy, ctx: Context) -> None:
        self.strategy = strategy
        self.n = ctx.n_workers
        self.state: Any = strategy.init(ctx)

    def plan(self) -> AllreducePlan:
        return as_allreduce(self.strategy.plan(self.state), self.n)

    def select(self, arrivals: ArrivalColumns) -> Selection:
        return self.strategy.select(self.state, arrivals)

    def weights(self, arrivals: ArrivalColumns, rank: int) -> Weighting:
        return weighting(self.select(arrivals), rank)

    def own_weight(self, arrival: ArrivalColumns, rank: int) -> float:
        """w_n from this rank's arrival alone (:func:`own_arrival`; module docstring)."""
        return own_share(self.select(arrival), rank)

    def adapt(self, stats: StepStats) -> None:
        self.state = self.strategy.adapt(self.state, stats)
