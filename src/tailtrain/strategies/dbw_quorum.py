"""``dbw-quorum``: eager-SGD's quorum collective with K chosen each round by DBW's rule.

No paper and no library has this strategy. It joins two ideas:

- the collective of eager-SGD (§4–§5): a partial allreduce initiated by the K-th process to
  arrive; the others contribute their send buffers, late processes adopt the latest result;
- the rule of DBW (Xu, Neglia & Sebastianelli 2020, §3): K = k_t of Eq. (19), the arg max of
  the estimated loss decrease per unit of time, gain from Eqs. (9)–(16) and round time
  T_hat_k = E[T_{k,k}] from the constrained least squares of Eq. (17).

Everything DBW-specific is reused from :mod:`tailtrain.strategies.dbw` and
:mod:`tailtrain.strategies.time_estimator`; this module only maps a collective round onto
DBW's quantities:

- iteration t is round t; its "update" is the round's completion;
- t_{h,i,t} is the time from the completion of round t-1 to the i-th call of a gradient made
  at round t's step (late calls of earlier steps feed their own, older cells, as in DBW §3.2),
  with h the K of round t-1 (P after a synchronous round, when everybody waited);
- the gain uses the round's fresh gradients: NAP of them, NAP >= K.

``lr=fixed`` (default) averages whatever entered the round, fresh or stale (DBW Eq. 4; the
count travels in one extra allreduce slot); ``lr=proportional`` divides by P as eager-SGD's
Alg. 2 does, which is DBW §4's proportional rule η·k/n.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

import numpy as np

from tailtrain.spec import Spec
from tailtrain.strategies.base import (
    ArrivalColumns,
    Context,
    Selection,
    StepStats,
    Strategy,
    SyncMode,
    Topology,
    Weighting,
)
from tailtrain.strategies.dbw import (
    DEFAULT_BETA,
    DEFAULT_DBW_WINDOW,
    Dbw,
    DbwState,
)
from tailtrain.strategies.eager import (
    EAGER_KEYS,
    REFERENCE_STALENESS_BOUND,
    Collective,
    EagerSGD,
    EagerState,
    RoundPlan,
    bound_params,
    fresh_mask,
    parse_bounds,
)
from tailtrain.strategies.kfamily import parse_lr_rule


@dataclass(frozen=True)
class DbwQuorumState:
    """The collective's counters and DBW's estimators; ``dbw.k`` is the next round's K."""

    eager: EagerState
    dbw: DbwState


@dataclass(frozen=True)
class DbwQuorum(Strategy):
    """The quorum partial allreduce with K = k_t of DBW Eq. (19)."""

    window: int = DEFAULT_DBW_WINDOW
    beta: float = DEFAULT_BETA
    lr_rule: str = "fixed"
    sync_every: int = 0
    staleness_bound: int = REFERENCE_STALENESS_BOUND
    name: str = "dbw-quorum"
    topology: ClassVar[Topology] = Topology.PARTIAL_COLLECTIVE

    @property
    def collective(self) -> EagerSGD:
        """The eager-SGD quorum rule whose K this strategy steers."""
        return EagerSGD(Collective.QUORUM, None, self.sync_every, self.staleness_bound)

    @property
    def dbw(self) -> Dbw:
        """DBW's rule (its estimators and its choice of Eq. 18)."""
        return Dbw("dbw", self.window, self.beta, SyncMode.PSW, self.lr_rule)

    def init(self, ctx: Context) -> DbwQuorumState:
        return DbwQuorumState(self.collective.init(ctx), self.dbw.init(ctx))

    def plan(self, state: DbwQuorumState) -> RoundPlan:
        return self.collective.plan(replace(state.eager, k=state.dbw.k))

    def select(self, state: DbwQuorumState, arrivals: ArrivalColumns) -> Selection:
        """Mean of the contributions (``fixed``) or their sum over P (``proportional``)."""
        count = state.eager.n_workers if self.lr_rule == "proportional" else len(arrivals)
        everyone = np.arange(len(arrivals))
        return Selection(now=Weighting.of(arrivals, everyone, 1.0, total=max(count, 1)))

    def adapt(self, state: DbwQuorumState, stats: StepStats) -> DbwQuorumState:
        eager = self.collective.adapt(state.eager, stats)
        return DbwQuorumState(eager, self.steer(state.dbw, stats))

    def steer(self, d: DbwState, stats: StepStats) -> DbwState:
        """DBW's own update on a collective round; the gain counts the fresh gradients (NAP)."""
        nap = int((fresh_mask(stats.arrivals, stats.step) & stats.used_mask()).sum())
        return self.dbw.observe(d, stats, used=nap, waited_for=stats.k)

    def describe(self) -> str:
        parts = [f"window={self.window}", f"beta={self.beta:g}"]
        if self.lr_rule != "fixed":
            parts.append(f"lr={self.lr_rule}")
        return f"{self.name}:{','.join([*parts, *bound_params(self)])}"


def build_dbw_quorum(spec: Spec) -> DbwQuorum:
    """``dbw-quorum:window=,beta=,lr=fixed|proportional,sync-every=,staleness-bound=``."""
    bounds = parse_bounds(spec)
    spec.require_known(("window", "beta", "lr", *EAGER_KEYS))
    window = spec.get_int("window", DEFAULT_DBW_WINDOW, minimum=1)
    beta = spec.get_float("beta", DEFAULT_BETA, minimum=1.0)
    return DbwQuorum(window, beta, parse_lr_rule(spec), **bounds)
