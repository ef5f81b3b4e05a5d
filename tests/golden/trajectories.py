"""Golden trajectories: small run records of a few strategies, stored as JSON fixtures.

The test (``test_golden.py``) checks that today's simulator reproduces them: decisions,
counts and times exactly, float32 losses to 1e-6 relative (CPUs round them apart). They are
regenerated only on purpose, when a change of results is intended and explained in its commit:

    python tests/golden/trajectories.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).parent

#: name -> (strategy spec, scenario keyword arguments, seed); one per topology and rule kind
CASES = {
    "k-sync": ("k-sync:k=3", {"task": "logreg", "delay": "exp:rate=1"}, 0),
    "dbw": ("dbw:window=3", {"task": "logreg", "delay": "exp:rate=1"}, 1),
    "lgc": ("lgc:k=3,blocks=4", {"task": "logreg", "delay": "exp:rate=1", "micro_batches": 2}, 2),
    "dropcompute": (
        "dropcompute:threshold=auto,calibrate=3,divide-by=computed",
        {"task": "logreg", "delay": "exp:rate=4", "micro_batches": 4},
        3,
    ),
    "eager-majority": ("eager:mode=majority", {"task": "logreg", "delay": "exp:rate=1"}, 4),
}
COMMON = {"workers": 5, "iterations": 12, "eval_every": 4}


def record_of(name: str) -> dict:
    from tailtrain.core.records import clean
    from tailtrain.core.scenario import Scenario
    from tailtrain.sim.run import simulate
    from tailtrain.strategies.registry import parse_strategy

    spec, scenario, seed = CASES[name]
    record = simulate(Scenario(**COMMON, **scenario), parse_strategy(spec), seed)
    return clean({"strategy": spec, "steps": record.steps, "evals": record.evals})


def path_of(name: str) -> Path:
    return HERE / f"{name}.json"


def regenerate() -> None:
    for name in CASES:
        path_of(name).write_text(json.dumps(record_of(name), indent=1) + "\n")
        print("wrote", path_of(name))


if __name__ == "__main__":
    sys.exit(regenerate())
