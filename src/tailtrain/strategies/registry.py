"""Strategy names to builders: ``parse_strategy("k-sync:k=8")``."""

from __future__ import annotations

from collections.abc import Callable

from tailtrain.errors import UsageError
from tailtrain.spec import Spec, parse_spec
from tailtrain.strategies import kfamily
from tailtrain.strategies.base import Strategy

Builder = Callable[[Spec], Strategy]

BUILDERS: dict[str, Builder] = {
    "sync": kfamily.build_sync,
    "k-sync": kfamily.build_k_sync,
    "k-batch-sync": kfamily.build_k_batch_sync,
    "k-async": kfamily.build_k_async,
    "k-batch-async": kfamily.build_k_batch_async,
    "async": kfamily.build_async,
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
