"""Strategy names to builders: ``parse_strategy("k-sync:k=8")``."""

from __future__ import annotations

from collections.abc import Callable

from tailtrain.errors import UsageError
from tailtrain.spec import Spec, parse_spec
from tailtrain.strategies import adasync, dbw, kfamily, lgc
from tailtrain.strategies.base import Strategy
from tailtrain.strategies.dbw_quorum import build_dbw_quorum
from tailtrain.strategies.dropcompute import build_dropcompute
from tailtrain.strategies.eager import build_eager
from tailtrain.strategies.local_sgd import build_local_sgd
from tailtrain.strategies.rebalance import build_rebalance

Builder = Callable[[Spec], Strategy]

BUILDERS: dict[str, Builder] = {
    "sync": kfamily.build_sync,
    "dropcompute": build_dropcompute,
    "local-sgd": build_local_sgd,
    "k-sync": kfamily.build_k_sync,
    "k-batch-sync": kfamily.build_k_batch_sync,
    "k-async": kfamily.build_k_async,
    "k-batch-async": kfamily.build_k_batch_async,
    "async": kfamily.build_async,
    "dbw": dbw.build_dbw,
    "b-dbw": dbw.build_b_dbw,
    "adasync": adasync.build_adasync,
    "lgc": lgc.build_lgc,
    "eager": build_eager,
    "dbw-quorum": build_dbw_quorum,
    "rebalance": build_rebalance,
}


def parse_strategy(text: str) -> Strategy:
    spec = parse_spec(text, what="strategy")
    builder = BUILDERS.get(spec.name)
    if builder is None:
        known = ", ".join(sorted(BUILDERS))
        raise UsageError(f"unknown strategy {spec.name!r}; choose one of: {known}")
    return builder(spec)


def parse_strategies(text: str) -> list[Strategy]:
    """Split a comma list of strategy specs; a comma followed by `key=` continues a spec."""
    parts: list[str] = []
    for piece in text.split(","):
        if parts and "=" in piece and ":" not in piece:
            parts[-1] += "," + piece
        else:
            parts.append(piece)
    return [parse_strategy(p) for p in parts if p.strip()]
