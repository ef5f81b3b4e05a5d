"""AdaSync: gradually more synchrony (slow-and-stale paper §VI, Algorithm 1, Appendix D).

Training time is cut into intervals of ``interval`` (virtual) seconds. At the end of each,
while K < P (Algorithm 1 line 7), K is reset from the loss at the start of the new interval::

    K-async, K-batch-async:  K^2 = K0^2 F(w_0) / F(w_start)                      (Eq. 26)
    K-sync:                  K^2 / (P - K) = K0^2 / (P - K0) * F(w_0) / F(w_start)  (§VI)

then rounded and clipped to [1, P]. Mode and stale-acceptance follow the base variant
(``kfamily``). F is never computed exactly: F(w_0) is the mean of the first ``window``
mini-batch losses reported and F(w_start) the mean of the last ``window`` before the interval
ends, so both carry the same small averaging bias and the noise of a single mini-batch loss is
divided by ``window``. Steps without a finite loss leave K unchanged.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tailtrain.errors import UsageError
from tailtrain.spec import Spec
from tailtrain.strategies.base import Context, ServerPlan, StepStats, Strategy
from tailtrain.strategies.kfamily import VARIANTS, check_k, lr_scale, parse_lr_rule

#: the variants AdaSync adapts (slow-and-stale §VI and App. D give rules for these)
BASES = {name: VARIANTS[name] for name in ("k-sync", "k-async", "k-batch-async")}
DEFAULT_ADASYNC_WINDOW = 10


def k_sqrt_rule(k0: int, ratio: float) -> float:
    """Slow-and-stale Eq. (26): K = K0 sqrt(F(w_0) / F(w_start)); ``ratio`` = F(w_0)/F(w_start)."""
    return k0 * math.sqrt(ratio)


def k_sync_rule(k0: int, p: int, ratio: float) -> float:
    """Slow-and-stale §VI: the positive root of K^2 / (P - K) = c, c = K0^2/(P - K0) * ratio.

    K^2 + cK - cP = 0 gives K = (-c + sqrt(c^2 + 4cP))/2, written as 2P / (1 + sqrt(1 + 4P/c))
    so that it stays accurate for large c and gives K = P when K0 = P (c infinite).
    """
    if k0 >= p:
        return float(p)
    c = k0**2 / (p - k0) * ratio
    return 2.0 * p / (1.0 + math.sqrt(1.0 + 4.0 * p / c)) if c > 0 else 0.0


def next_k(base: str, k0: int, p: int, f0: float, f_start: float) -> int:
    """K for the next interval, rounded and clipped to [1, P]; P once the loss reaches 0."""
    ratio = f0 / f_start if f_start > 0 else math.inf
    if not ratio < math.inf:
        return p
    k = k_sync_rule(k0, p, ratio) if base == "k-sync" else k_sqrt_rule(k0, ratio)
    return int(min(max(round(min(k, p)), 1), p))


@dataclass(frozen=True)
class AdaSyncState:
    n: int
    k: int
    first: tuple[float, ...] = ()  # the first `window` losses: F(w_0)
    recent: tuple[float, ...] = ()  # the last `window` losses: F(w_start)
    next_change: float = math.inf  # virtual time of the next interval boundary


@dataclass(frozen=True)
class AdaSync(Strategy):
    """AdaSync over a K-family ``base`` starting at K = ``k0``, re-deciding every ``interval``."""

    name: str
    base: str
    k0: int
    interval: float
    window: int = DEFAULT_ADASYNC_WINDOW
    lr_rule: str = "fixed"

    def init(self, ctx: Context) -> AdaSyncState:
        check_k(self.k0, ctx.n_workers, self.name)
        return AdaSyncState(ctx.n_workers, self.k0, next_change=self.interval)

    def plan(self, state: AdaSyncState) -> ServerPlan:
        mode, stale = BASES[self.base]
        scale = lr_scale(self.lr_rule, state.k, state.n)
        return ServerPlan(k=state.k, mode=mode, accept_stale=stale, lr_scale=scale)

    def adapt(self, state: AdaSyncState, stats: StepStats) -> AdaSyncState:
        first, recent = state.first, state.recent
        if math.isfinite(stats.loss):
            first = first if len(first) >= self.window else (*first, stats.loss)
            recent = (*recent, stats.loss)[-self.window :]
        k, boundary = state.k, state.next_change
        if stats.time >= boundary:
            boundary = (math.floor(stats.time / self.interval) + 1) * self.interval
            if k < state.n and recent:  # Algorithm 1 line 7
                k = next_k(self.base, self.k0, state.n, mean(first), mean(recent))
        return AdaSyncState(state.n, k, first, recent, boundary)

    def describe(self) -> str:
        text = f"{self.name}:base={self.base},k0={self.k0},interval={self.interval:g}"
        if self.window != DEFAULT_ADASYNC_WINDOW:
            text += f",window={self.window}"
        return text + ("" if self.lr_rule == "fixed" else f",lr={self.lr_rule}")


def mean(values: tuple[float, ...]) -> float:
    return math.fsum(values) / len(values)


def build_adasync(spec: Spec) -> AdaSync:
    spec.require_known(["base", "k0", "interval", "window", "lr"])
    base = spec.get_str("base", "k-async")
    if base not in BASES:
        raise UsageError(f"{spec.text!r}: base={base!r} is unknown; use one of {', '.join(BASES)}")
    return AdaSync(
        "adasync",
        base,
        spec.get_int("k0", 1, minimum=1),
        spec.get_float("interval", positive=True),
        spec.get_int("window", DEFAULT_ADASYNC_WINDOW, minimum=1),
        parse_lr_rule(spec),
    )
