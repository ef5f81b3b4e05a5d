"""Live Gradient Compensation (LGC-SGD, Xu; LGC Algorithm 1).

Each step the server averages the fastest K fresh gradients and adds the compensation of the
previous step's stragglers (LGC Eq. 7, Algorithm 1 lines 14-21)::

    g_t = g'_t + e_{t-1},   g'_t = 1/K sum_{i in S_t} g_t^(i)
    e_t = 1/N sum_{i not in S_t} g_t^(i) - (N - K)/N g'_t

A straggler interrupted after r of its s blocks delivers (r/s) times the mean of those blocks
(LGC Eq. 6). As weights of ``base.Selection``: ``now = 1/K`` on each fresh gradient; ``later =
-(N-K)/(N K)`` on each fresh gradient and ``units/N`` on each straggler's partial arrival,
whose gradient the engine reports as the mean over its r blocks and whose ``units`` is r/s.
A straggler with no finished block contributes zero, as in Eq. (6) with r = 0.

The first ``warmup`` epochs run fully synchronously (LGC §III.A: "the first 2 epochs are run in
Full-SGD fashion as warmup").

``complete=true`` is LGC §III's simplifying assumption that "the stragglers can complete all
computations before the beginning of next iteration", and it is charged its real time: the
stragglers are not interrupted (push & wait) but compute their whole gradient of version t,
which enters e_t with r = s; update t+1 waits until every one of them has delivered, and only
then do they take a new version. So a step lasts at least as long as the slowest straggler of
the previous one, and the option costs time rather than crediting work never done.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from tailtrain.errors import UsageError
from tailtrain.spec import Spec
from tailtrain.strategies.base import (
    ArrivalColumns,
    Context,
    Selection,
    ServerPlan,
    StepStats,
    Strategy,
    SyncMode,
    Weighting,
    equal_weights,
)
from tailtrain.strategies.kfamily import check_k

DEFAULT_BLOCKS = 4  # s = 4 in LGC §III.C


@dataclass(frozen=True)
class LgcState:
    n: int
    k: int
    warmup_steps: int
    step: int = 0

    @property
    def warming_up(self) -> bool:
        return self.step < self.warmup_steps


@dataclass(frozen=True)
class Lgc(Strategy):
    """LGC-SGD with threshold ``k`` (K), ``blocks`` (s) and ``warmup`` epochs of full sync."""

    name: str
    k: int
    blocks: int = DEFAULT_BLOCKS
    warmup: float = 0.0
    complete: bool = False
    #: e_t (Eq. 7) weighs the stragglers' partial work into the next update
    defers: ClassVar[bool] = True

    def init(self, ctx: Context) -> LgcState:
        check_k(self.k, ctx.n_workers, self.name)
        steps = math.ceil(self.warmup * ctx.iterations_per_epoch)
        return LgcState(ctx.n_workers, self.k, steps)

    def plan(self, state: LgcState) -> ServerPlan:
        if state.warming_up:
            return ServerPlan(k=state.n, mode=SyncMode.PSI)
        return ServerPlan(
            k=state.k,
            # complete stragglers keep computing (push & wait); the engine drains them
            mode=SyncMode.PSW if self.complete else SyncMode.PSI,
            partial_blocks=self.blocks,
            complete_stragglers=self.complete,
        )

    def select(self, state: LgcState, arrivals: ArrivalColumns) -> Selection:
        if state.warming_up:
            return equal_weights(arrivals)
        return compensated_weights(arrivals, state.n)

    def adapt(self, state: LgcState, stats: StepStats) -> LgcState:
        del stats
        return LgcState(state.n, state.k, state.warmup_steps, state.step + 1)

    def describe(self) -> str:
        text = f"{self.name}:k={self.k},blocks={self.blocks}"
        if self.warmup:
            text += f",warmup={self.warmup:g}"
        return text + (",complete=true" if self.complete else "")


def compensated_weights(arrivals: ArrivalColumns, n: int) -> Selection:
    """LGC Algorithm 1 lines 15 and 19 as weights: ``now`` is g'_t, ``later`` is e_t (Eq. 7).

    K is the number of whole (fresh) arrivals, so the rule stays exact if an engine delivers
    more than it planned. ``later`` carries its coefficients already divided (total 1).
    """
    fresh = np.flatnonzero(~arrivals.partial)
    late = np.flatnonzero(arrivals.partial)
    k = fresh.size
    if k == 0:
        return Selection(now=Weighting.none())
    now = Weighting.of(arrivals, fresh, 1.0)
    both = np.concatenate([fresh, late]) if k < n else late
    coefficients = np.concatenate(
        [np.full(k if k < n else 0, -(n - k) / (n * k)), arrivals.units[late] / n]
    )
    return Selection(now=now, later=Weighting.of(arrivals, both, coefficients, total=1.0))


def build_lgc(spec: Spec) -> Lgc:
    spec.require_known(["k", "blocks", "warmup", "complete"])
    return Lgc(
        "lgc",
        spec.get_int("k", minimum=1),
        spec.get_int("blocks", DEFAULT_BLOCKS, minimum=1),
        spec.get_float("warmup", 0.0, minimum=0.0),
        parse_bool(spec, "complete", False),
    )


def parse_bool(spec: Spec, key: str, default: bool) -> bool:
    raw = spec.get_str(key, "true" if default else "false").lower()
    if raw not in ("true", "false"):
        raise UsageError(f"parameter {key}={raw!r} in {spec.text!r} must be true or false")
    return raw == "true"
