"""eager-SGD's partial collectives as a rule (Li et al., "Taming unbalanced training workloads
with partial collective operations", §4–§6, Alg. 2).

Every round is one allreduce of gradients; who counts depends on the collective:

- ``solo`` (§4.1): the first process to arrive initiates; the others are activated.
- ``majority`` (§4.2): the initiator is a rank drawn each round from a seed every process
  shares, so on average half of the processes arrive before it.
- ``quorum``: the K-th arrival initiates (our generalisation; NAP >= K).
- ``allreduce``: the synchronous collective everybody waits for.

Processes that arrived before the activation reached them are *active* and contribute fresh
gradients; the others contribute their send buffer: stale gradients, or nothing (§5, Fig. 7).
Alg. 2 line 6 divides the sum by P whoever contributed, so every contribution weighs 1/P.

Two mechanisms bound the drift: ``staleness-bound=B`` makes every B-th call a synchronous
allreduce (the reference code's solo limiter, ``LIMITER 32`` partial calls then one
synchronous call: B = 33), which bounds the staleness τ of Lemma 6.1; ``sync-every=S``
averages the processes' models every S rounds (§5: "we periodically synchronize the models").

The activation's message latency is not part of the rule: it is a property of the network
(``tailtrain.network``, ``--network hop=``), which the engines own.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any, ClassVar

import numpy as np

from tailtrain.errors import UsageError
from tailtrain.network import moved_to_network
from tailtrain.spec import Spec
from tailtrain.strategies.base import (
    ArrivalColumns,
    Context,
    Plan,
    Selection,
    StepStats,
    Strategy,
    Topology,
    Weighting,
)

#: the reference code's solo limiter: 32 partial calls, then one synchronous call
REFERENCE_STALENESS_BOUND = 33
#: stream tag that separates the majority initiator draws from every other seeded stream
_INITIATOR_STREAM = 0x6D616A  # "maj"


class Collective(StrEnum):
    """Which collective a round runs (eager-SGD §4)."""

    ALLREDUCE = "allreduce"
    SOLO = "solo"
    MAJORITY = "majority"
    QUORUM = "quorum"


PARTIAL_MODES = (Collective.SOLO, Collective.MAJORITY, Collective.QUORUM)


@dataclass(frozen=True)
class RoundPlan(Plan):
    """The plan of one partial-collective round.

    ``k`` is the quorum K (1 for solo and majority, P for allreduce); ``initiator`` is
    majority's designated rank (-1 otherwise); ``average_models`` asks for a model
    synchronisation after the round, which makes the round synchronous.
    """

    collective: Collective = Collective.ALLREDUCE
    initiator: int = -1
    average_models: bool = False

    @property
    def synchronous(self) -> bool:
        return self.collective is Collective.ALLREDUCE


@dataclass(frozen=True)
class EagerState:
    """Counters of the rule: the round index and the rounds since each kind of sync."""

    n_workers: int
    seed: int
    k: int
    round: int = 0
    since_sync: int = 0  # rounds since the last model synchronisation
    since_full: int = 0  # rounds since the last synchronous allreduce


def majority_initiator(seed: int, round_index: int, n_workers: int) -> int:
    """The rank that initiates majority round ``round_index`` (eager-SGD §4.2).

    A counter-based draw: every process computes it from the shared seed and the round
    number alone, so all agree without communicating (the reference code's ``rand_r`` on a
    shared seed, made stateless so the rule stays a pure function).
    """
    rng = np.random.default_rng([seed, _INITIATOR_STREAM, round_index])
    return int(rng.integers(n_workers))


def round_plan(rule: EagerSGD, state: EagerState) -> RoundPlan:
    """The collective of the next round: partial, or synchronous when a bound is due."""
    average = rule.sync_every > 0 and state.since_sync + 1 >= rule.sync_every
    full = average or (rule.staleness_bound > 0 and state.since_full + 1 >= rule.staleness_bound)
    n = state.n_workers
    if full:
        return RoundPlan(k=n, average_models=average)
    if rule.mode is Collective.MAJORITY:
        initiator = majority_initiator(state.seed, state.round, n)
        return RoundPlan(k=1, collective=rule.mode, initiator=initiator)
    return RoundPlan(k=state.k, collective=rule.mode)


def advance(rule: EagerSGD, state: EagerState) -> EagerState:
    """Counters after a round: one more round, and which synchronisations it ran."""
    plan = round_plan(rule, state)
    return replace(
        state,
        round=state.round + 1,
        since_sync=0 if plan.average_models else state.since_sync + 1,
        since_full=0 if plan.synchronous else state.since_full + 1,
    )


@dataclass(frozen=True)
class EagerSGD(Strategy):
    """eager-SGD with a solo, majority or quorum partial allreduce (eager-SGD Alg. 2)."""

    mode: Collective = Collective.SOLO
    k: int | None = None
    sync_every: int = 0
    staleness_bound: int = REFERENCE_STALENESS_BOUND
    name: str = "eager"
    topology: ClassVar[Topology] = Topology.PARTIAL_COLLECTIVE

    def init(self, ctx: Context) -> EagerState:
        return EagerState(ctx.n_workers, ctx.seed, quorum_size(self.mode, self.k, ctx.n_workers))

    def plan(self, state: EagerState) -> RoundPlan:
        return round_plan(self, state)

    def select(self, state: EagerState, arrivals: ArrivalColumns) -> Selection:
        """Alg. 2 line 6: the sum of every contribution, fresh or stale, divided by P."""
        everyone = np.arange(len(arrivals))
        return Selection(now=Weighting.of(arrivals, everyone, 1.0, total=state.n_workers))

    def adapt(self, state: EagerState, stats: StepStats) -> EagerState:
        del stats  # the counters depend on the plan alone
        return advance(self, state)

    def follow_world(self, state: EagerState, ctx: Context) -> EagerState:
        """The live world of ``ctx.n_workers`` ranks (``--on-rank-loss shrink``,
        ``runtime.partial.regroup``): Alg. 2's divisor P and majority's initiator draw become
        the live ranks, the quorum K is taken again for them (⌈L/2⌉ by default; a K above L
        becomes L, the most a smaller world can reach), and the round counters go on, so the
        bounds (staleness, model averages) keep their period."""
        n = ctx.n_workers
        k = None if self.k is None else min(self.k, n)
        return replace(state, n_workers=n, k=quorum_size(self.mode, k, n))

    def describe(self) -> str:
        parts = [f"mode={self.mode.value}"]
        if self.mode is Collective.QUORUM and self.k is not None:
            parts.append(f"k={self.k}")
        return f"{self.name}:{','.join([*parts, *bound_params(self)])}"


def bound_params(rule: EagerSGD | Any) -> list[str]:
    """The non-default synchronisation bounds, as spec text."""
    parts = []
    if rule.sync_every:
        parts.append(f"sync-every={rule.sync_every}")
    if rule.staleness_bound != REFERENCE_STALENESS_BOUND:
        parts.append(f"staleness-bound={rule.staleness_bound}")
    return parts


def quorum_size(mode: Collective, k: int | None, n_workers: int) -> int:
    """K of the quorum collective (default ⌈P/2⌉, majority's mean NAP); 1 for solo/majority."""
    if mode is not Collective.QUORUM:
        return 1
    size = -(-n_workers // 2) if k is None else k
    if not 1 <= size <= n_workers:
        raise UsageError(
            f"eager: k={size} must be between 1 and the number of workers ({n_workers})"
        )
    return size


def fresh_mask(arrivals: ArrivalColumns, round_index: int) -> np.ndarray:
    """Which contributions are fresh, i.e. computed at the round's own model step."""
    return arrivals.version == round_index


EAGER_KEYS = ("sync-every", "staleness-bound")


def parse_bounds(spec: Spec) -> dict[str, int]:
    """The synchronisation bounds every eager strategy takes."""
    if spec.has("hop"):
        raise moved_to_network("hop", spec.get_str("hop"), spec.text)
    return {
        "sync_every": spec.get_int("sync-every", 0, minimum=0),
        "staleness_bound": spec.get_int("staleness-bound", REFERENCE_STALENESS_BOUND, minimum=0),
    }


def build_eager(spec: Spec) -> EagerSGD:
    """``eager:mode=solo|majority|quorum,k=,sync-every=,staleness-bound=``."""
    parse_bounds(spec)  # names a moved key before the generic unknown-key message
    spec.require_known(("mode", "k", *EAGER_KEYS))
    raw = spec.get_str("mode", Collective.SOLO.value)
    if raw not in {m.value for m in PARTIAL_MODES}:
        known = ", ".join(m.value for m in PARTIAL_MODES)
        raise UsageError(f"{spec.text!r}: mode={raw!r} is unknown; use one of {known}")
    mode = Collective(raw)
    if spec.has("k") and mode is not Collective.QUORUM:
        raise UsageError(
            f"{spec.text!r}: k= only applies to mode=quorum; drop it or set mode=quorum"
        )
    k = spec.get_int("k", minimum=1) if spec.has("k") else None
    return EagerSGD(mode=mode, k=k, **parse_bounds(spec))
