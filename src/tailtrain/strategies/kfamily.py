"""Static K-of-P strategies of the slow-and-stale paper (§II-C) and DBW's static backup workers.

- ``sync``: wait for all P fresh gradients (fully synchronous SGD). Plain ``sync`` is one
  allreduce per step (:class:`Sync`), on every engine; ``sync:mode=...`` names a
  parameter-server schedule (DBW §2) and runs there, as K-sync with K = P.
- ``k-sync``: wait for the first K fresh gradients, cancel the rest (slow-and-stale Eq. 2;
  DBW Eq. 4 with b = P - K backup workers). ``lr=proportional`` scales η by K/P (DBW §4).
- ``k-batch-sync``: every worker keeps computing mini-batches at the same version; the first K
  mini-batches close the step and the rest are cancelled.
- ``k-async``: wait for the first K gradients, stale ones included, cancel nobody (Eq. 3).
  A worker counts at most once per step: after it pushes it is idle until the update, then
  starts on the new version (Fig. 5), so for Exp(mu) E[T] = E[X_{K:P}] (Thm. 2).
- ``k-batch-async``: any K mini-batches, whoever computed them; a worker that pushes pulls the
  current model at once. ``async`` is 1-batch-async.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from tailtrain.errors import UsageError
from tailtrain.spec import Spec
from tailtrain.strategies.base import (
    AllreducePlan,
    Context,
    ServerPlan,
    Strategy,
    SyncMode,
    Topology,
)

LR_RULES = ("fixed", "proportional")

#: variant -> (synchronisation mode, stale gradients accepted), slow-and-stale §II-C
VARIANTS: dict[str, tuple[SyncMode, bool]] = {
    "k-sync": (SyncMode.PSI, False),
    "k-batch-sync": (SyncMode.PULL_INTERRUPT, False),
    "k-async": (SyncMode.PSW, True),
    "k-batch-async": (SyncMode.PULL, True),
}


@dataclass(frozen=True)
class StaticState:
    k: int
    n_workers: int


@dataclass(frozen=True)
class StaticK(Strategy):
    """A fixed K with a fixed synchronisation mode; ``k=None`` means K = P."""

    name: str
    k: int | None
    mode: SyncMode
    accept_stale: bool
    lr_rule: str = "fixed"

    def init(self, ctx: Context) -> StaticState:
        k = ctx.n_workers if self.k is None else self.k
        check_k(k, ctx.n_workers, self.name)
        return StaticState(k=k, n_workers=ctx.n_workers)

    def plan(self, state: StaticState) -> ServerPlan:
        return ServerPlan(
            k=state.k,
            mode=self.mode,
            accept_stale=self.accept_stale,
            lr_scale=lr_scale(self.lr_rule, state.k, state.n_workers),
        )

    #: the mode the strategy's definition implies; only a different one is worth naming
    default_mode: SyncMode | None = None
    #: name the mode whatever it is (``sync:mode=M``: plain ``sync`` is another rule)
    mode_named: bool = False

    def describe(self) -> str:
        parts = [] if self.k is None or self.name == "async" else [f"k={self.k}"]
        if self.lr_rule != "fixed":
            parts.append(f"lr={self.lr_rule}")
        if self.mode_named or (self.default_mode is not None and self.mode != self.default_mode):
            parts.append(f"mode={self.mode.value}")
        return self.name + (":" + ",".join(parts) if parts else "")


def check_k(k: int, n_workers: int, name: str) -> None:
    if not 1 <= k <= n_workers:
        raise UsageError(f"{name}: k={k} must be between 1 and the number of workers ({n_workers})")


def lr_scale(rule: str, k: int, n_workers: int) -> float:
    """DBW §4: the `proportional` rule sets η(k) = η·k/n, the `fixed` rule keeps η."""
    return k / n_workers if rule == "proportional" else 1.0


def parse_lr_rule(spec: Spec) -> str:
    rule = spec.get_str("lr", "fixed")
    if rule not in LR_RULES:
        raise UsageError(f"{spec.text!r}: lr={rule!r} is unknown; use one of {', '.join(LR_RULES)}")
    return rule


@dataclass(frozen=True)
class Sync(Strategy):
    """Fully synchronous SGD as one allreduce a step: every worker's whole fresh gradient,
    averaged (slow-and-stale's K = P; DropCompute's baseline). The same round on the
    simulator's allreduce engine, ``train``'s allreduce topology and a user's loop."""

    name: str = "sync"
    topology: ClassVar[Topology] = Topology.ALLREDUCE

    def init(self, ctx: Context) -> int:
        return ctx.n_workers

    def plan(self, state: int) -> AllreducePlan:
        return AllreducePlan(k=state)


def build_sync(spec: Spec) -> Sync | StaticK:
    """``sync`` (:class:`Sync`, an allreduce), or ``sync:mode=M`` on a parameter server."""
    spec.require_known(["mode"])
    if not spec.has("mode"):
        return Sync()
    # K = P on a server, its mode always named: plain ``sync`` is the allreduce
    mode = parse_mode(spec, SyncMode.PSI)
    return StaticK("sync", None, mode, accept_stale=False, mode_named=True)


def build_k_sync(spec: Spec) -> StaticK:
    spec.require_known(["k", "lr", "mode"])
    mode = parse_mode(spec, VARIANTS["k-sync"][0])
    k = spec.get_int("k", minimum=1)
    return StaticK("k-sync", k, mode, False, parse_lr_rule(spec), default_mode=SyncMode.PSI)


def build_k_batch_sync(spec: Spec) -> StaticK:
    spec.require_known(["k", "lr"])
    k = spec.get_int("k", minimum=1)
    return StaticK("k-batch-sync", k, *VARIANTS["k-batch-sync"], parse_lr_rule(spec))


def build_k_async(spec: Spec) -> StaticK:
    spec.require_known(["k", "lr"])
    k = spec.get_int("k", minimum=1)
    return StaticK("k-async", k, *VARIANTS["k-async"], parse_lr_rule(spec))


def build_k_batch_async(spec: Spec) -> StaticK:
    spec.require_known(["k", "lr"])
    k = spec.get_int("k", minimum=1)
    return StaticK("k-batch-async", k, *VARIANTS["k-batch-async"], parse_lr_rule(spec))


def build_async(spec: Spec) -> StaticK:
    spec.require_known([])
    return StaticK("async", 1, SyncMode.PULL, True)


def parse_mode(spec: Spec, default: SyncMode) -> SyncMode:
    raw = spec.get_str("mode", default.value)
    try:
        return SyncMode(raw)
    except ValueError:
        known = ", ".join(m.value for m in SyncMode)
        raise UsageError(f"{spec.text!r}: mode={raw!r} is unknown; use one of {known}") from None
