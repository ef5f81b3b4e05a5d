"""The setting that ``bench_rebalance.py`` shares with its bounds (``rebalance_bounds.py``) and
its goals (``rebalance_goals.py``): the base scenario and its noise, the four scenarios
(``scenario_of``) and the strategies compared."""

from __future__ import annotations

from dataclasses import replace

from tailtrain.core.scenario import Scenario

NOISE = "const:value=0.01+dropcompute-noise:scale=0.01"
BASE = Scenario(
    task="digits-cnn", workers=8, micro_batches=12, delay=NOISE, time_budget=60.0, target_loss=0.3
)
SCENARIOS = {
    "a": {"pattern": "slowdown:at=0,fraction=0.125,factor=1.5"},
    "b": {"pattern": "slowdown:at=0,fraction=0.5,factor=1.4"},
    "c": {"pattern": "slowdown:at=0,fraction=0.5,factor=1.4", "partition": "noniid:classes=2"},
    "d": {"pattern": "iid"},
}
SYNC, DROPCOMPUTE = "sync", "dropcompute:threshold=auto"
REBALANCE = (
    "rebalance",
    "rebalance:then=dropcompute,defer=true",
    "rebalance:deal=demand",
)


def scenario_of(name: str, base: Scenario) -> Scenario:
    return replace(base, **SCENARIOS[name])
