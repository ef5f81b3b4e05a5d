"""The one place where the runtime talks to a strategy: ``plan``, ``select``, ``adapt``.

Every rank holds its own copy of the rule's state and calls the rule with identical inputs
(arrivals and statistics gathered or reduced over all ranks), so every rank reaches the same
decision without a broadcast; the reduced sum of the weights checks that they did.

``weighting`` is the only function that reads a :class:`~tailtrain.strategies.base.Selection`.
Today ``select`` returns weights already normalised (the update is ``sum_i now[i] g_i``), so
the denominator is 1; when ``select`` returns unnormalised weights the denominator becomes the
reduced ``sum_i w_i`` and only this function changes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

from tailtrain.errors import TailtrainError, UsageError
from tailtrain.strategies.base import Arrival, Context, Plan, Selection, StepStats, Strategy

#: relative tolerance of the check that every rank used the same weights
WEIGHT_RTOL = 1e-4


class Weighting(NamedTuple):
    """This rank's weight, the sum of all weights and the divisor of the reduced gradient."""

    weight: float
    total: float
    denominator: float
    used: list[int]


def weighting(selection: Selection, rank: int, n_workers: int) -> Weighting:
    """Turn the rule's selection into this rank's weight w_n and the update's denominator.

    The allreduce topology applies the update at once, so deferred (``later``) weights, such
    as LGC's compensation, have no place here.
    """
    if selection.later:
        raise TailtrainError("the allreduce topology applies no deferred (``later``) weights")
    now = selection.now
    used = [i for i in range(n_workers) if now.get(i, 0.0) != 0]
    return Weighting(now.get(rank, 0.0), float(sum(now.values())), 1.0, used)


def check_agreement(expected_total: float, reduced_total: float) -> None:
    """The allreduced sum of weights equals what this rank's selection says it should."""
    if not math.isclose(expected_total, reduced_total, rel_tol=WEIGHT_RTOL, abs_tol=1e-6):
        raise TailtrainError(
            f"ranks disagree on the weights: sum {reduced_total:.6g} reduced, "
            f"{expected_total:.6g} selected here"
        )


def runs_on_allreduce(strategy: Strategy) -> bool:
    """Whether the allreduce topology can run ``strategy``: an allreduce rule, or plain sync."""
    return strategy.engine == "allreduce" or strategy.name == "sync"


def check_topology(strategy: Strategy) -> None:
    if not runs_on_allreduce(strategy):
        raise UsageError(
            f"strategy {strategy.describe()!r} needs the {strategy.engine} topology, which "
            "`train` does not have yet; train runs sync, dropcompute and local-sgd"
        )


class RuleDriver:
    """A strategy and its state on one rank."""

    def __init__(self, strategy: Strategy, ctx: Context) -> None:
        check_topology(strategy)
        self.strategy = strategy
        self.n = ctx.n_workers
        self.state: Any = strategy.init(ctx)

    def plan(self) -> Plan:
        plan = self.strategy.plan(self.state)
        waits_for_fewer = plan.k != self.n or plan.accept_stale or plan.partial_blocks > 0
        # an allreduce rule's k is not used (every rank joins every allreduce), as in the sim
        if waits_for_fewer and self.strategy.engine != "allreduce":
            raise TailtrainError(
                f"{self.strategy.describe()}: a plan with k={plan.k} of {self.n}, stale or "
                "partial gradients needs a topology other than allreduce"
            )
        return plan

    def weights(self, arrivals: Sequence[Arrival], rank: int) -> Weighting:
        return weighting(self.strategy.select(self.state, arrivals), rank, self.n)

    def adapt(self, stats: StepStats) -> None:
        self.state = self.strategy.adapt(self.state, stats)
