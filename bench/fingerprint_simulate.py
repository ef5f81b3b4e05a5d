"""Fingerprints of `simulate` records: one SHA-256 per configuration, over the record's rows
exactly as ``simulate --out`` writes them (``steps.jsonl``, ``evals.jsonl``,
``summary.json``), for every strategy family on each topology.

A change meant to leave results alone (a speed-up, a move of code) is checked by running this
script on the commit before it and on the tree after it, on the same machine, and comparing:

    git worktree add /tmp/base <commit>
    PYTHONPATH=/tmp/base/src python bench/fingerprint_simulate.py --save base.json
    PYTHONPATH=src python bench/fingerprint_simulate.py --check base.json

Model runs hash float32 losses, which CPUs with other instruction sets round apart, so
fingerprints compare on one machine only (the golden trajectories, ``tests/golden``, are the
cross-machine check with a tolerance; ``tests/sim/test_fingerprints.py`` stores the timing-only
ones). ``--quick`` leaves out the 2048-worker runs of ``bench_simulator.py --parts a``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from typing import Any

#: one model run's scenario: small, and long enough for adaptive rules to adapt
MODEL = {"task": "logreg", "workers": 8, "delay": "exp:rate=1", "iterations": 24, "eval_every": 6}
#: timing-only (no model): more workers, many steps
TIMING = {"task": "none", "workers": 64, "delay": "shifted-exp:shift=1,scale=1", "iterations": 80}
HETERO = {"pattern": "heterogeneous:low=1,high=3", "micro_batches": 3}

#: name -> (strategy spec, scenario overrides, base scenario, seed)
CASES: dict[str, tuple[str, dict[str, Any], dict[str, Any], int]] = {
    # parameter server: the K family and its modes
    "sync:mode=pull": ("sync:mode=pull", {}, MODEL, 1),
    "sync:mode=psi": ("sync:mode=psi", {}, MODEL, 2),
    "sync:mode=psw": ("sync:mode=psw", {"comm_time": "exp:rate=4"}, MODEL, 3),
    "k-sync": ("k-sync:k=3", {}, MODEL, 4),
    "k-sync-psw": ("k-sync:k=2,mode=psw", {}, MODEL, 5),
    "k-sync-micro": ("k-sync:k=5", {"micro_batches": 2, "pattern": "persistent:h=3"}, MODEL, 6),
    "k-batch-sync": ("k-batch-sync:k=3", {}, MODEL, 7),
    "k-async": ("k-async:k=3", {}, MODEL, 8),
    "k-batch-async": ("k-batch-async:k=3", {}, MODEL, 9),
    "async": ("async", {}, MODEL, 10),
    "dbw": ("dbw:window=3", {}, MODEL, 11),
    "dbw-psw": ("dbw:mode=psw", {}, MODEL, 12),
    "b-dbw": ("b-dbw", {}, MODEL, 13),
    "adasync": ("adasync:interval=4", {}, MODEL, 14),
    "dbw-quorum": ("dbw-quorum:lr=proportional", {}, MODEL, 15),
    "lgc": ("lgc:k=3,blocks=4", {"micro_batches": 2}, MODEL, 16),
    "lgc-complete": ("lgc:k=2,blocks=2,complete=true", {}, MODEL, 17),
    "lgc-time": (
        "lgc:k=3,blocks=4",
        {"iterations": None, "time_budget": 12.0, "eval_every": None, "eval_interval": 1.5},
        MODEL,
        18,
    ),
    # allreduce
    "sync": ("sync", {}, MODEL, 19),
    "dropcompute": ("dropcompute:threshold=auto,calibrate=3", {"micro_batches": 3}, MODEL, 20),
    "dropcompute-rate": ("dropcompute:drop-rate=0.1", {"micro_batches": 4}, MODEL, 21),
    "local-sgd": ("local-sgd:period=2", {"comm_time": "exp:rate=4"}, MODEL, 22),
    "rebalance": ("rebalance:warmup=2", {**HETERO, "delay": "const:value=1"}, MODEL, 23),
    "rebalance-demand": ("rebalance:deal=demand", HETERO, MODEL, 24),
    "rebalance-carry": (
        "rebalance:warmup=2,then=dropcompute,calibrate=2,defer=true",
        HETERO,
        MODEL,
        25,
    ),
    # partial collectives
    "eager-majority": ("eager:mode=majority", {}, MODEL, 26),
    "eager-solo": ("eager:mode=solo", {}, MODEL, 27),
    "eager-quorum": ("eager:mode=quorum,k=3", {"comm_time": "exp:rate=4"}, MODEL, 28),
    # timing only, many workers
    "t:sync": ("sync", {}, TIMING, 1),
    "t:sync:mode=pull": ("sync:mode=pull", {}, TIMING, 2),
    "t:k-sync": ("k-sync:k=48", {}, TIMING, 3),
    "t:k-batch-sync": ("k-batch-sync:k=32", {}, TIMING, 4),
    "t:k-async": ("k-async:k=32", {}, TIMING, 5),
    "t:k-batch-async": ("k-batch-async:k=32", {}, TIMING, 6),
    "t:k-sync-psw": ("k-sync:k=40,mode=psw", {}, TIMING, 7),
    "t:lgc-complete": ("lgc:k=40,blocks=4,complete=true", {"micro_batches": 2}, TIMING, 8),
    "t:dropcompute": ("dropcompute:threshold=auto,calibrate=3", {"micro_batches": 3}, TIMING, 9),
    "t:eager-majority": ("eager:mode=majority", {}, TIMING, 10),
    # ties: every job lasts as long (events at one instant, ordered by worker)
    "t:k-async-ties": ("k-async:k=32", {"delay": "const:value=1"}, TIMING, 11),
    "t:k-batch-async-ties": ("k-batch-async:k=32", {"delay": "const:value=1"}, TIMING, 12),
    "t:k-batch-sync-ties": (
        "k-batch-sync:k=48",
        {"delay": "const:value=1", "pattern": "heterogeneous:low=1,high=2"},
        TIMING,
        13,
    ),
    "t:dbw": ("dbw:window=3", {}, TIMING, 14),
    "t:sync:mode=pull-comm": ("sync:mode=pull", {"comm_time": "exp:rate=4"}, TIMING, 15),
    "t:k-async-slowdown": (
        "k-async:k=24",
        {"pattern": "slowdown:at=5,fraction=0.25,factor=4"},
        TIMING,
        16,
    ),
    "t:k-sync-2048": ("k-sync:k=1536", {"workers": 2048, "iterations": 30}, TIMING, 17),
    "t:k-batch-async-2048": (
        "k-batch-async:k=1024",
        {"workers": 2048, "iterations": 30},
        TIMING,
        18,
    ),
}
#: ``bench_simulator.py --parts a``'s runs (2048 workers, 300 steps, seed 1)
LARGE = {
    f"a:{spec}": (spec, {"workers": 2048, "iterations": 300}, TIMING, 1)
    for spec in ("sync", "k-sync:k=1536", "k-async:k=1024", "k-batch-async:k=1024")
}


def record_bytes(spec: str, scenario: dict[str, Any], seed: int) -> bytes:
    """The record's three files as ``RunRecord.write`` writes them, one after the other."""
    from tailtrain.core.records import clean
    from tailtrain.core.scenario import Scenario
    from tailtrain.sim.run import simulate
    from tailtrain.strategies.registry import parse_strategy

    record = simulate(Scenario(**scenario), parse_strategy(spec), seed)
    lines = [json.dumps(clean(row)) for row in record.steps]
    lines += ["--", *(json.dumps(clean(row)) for row in record.evals)]
    lines += ["--", json.dumps(clean(record.summary), indent=1)]
    return "\n".join(lines).encode()


def fingerprint(spec: str, overrides: dict[str, Any], base: dict[str, Any], seed: int) -> str:
    """The SHA-256 of one configuration's record; a refused run fingerprints its error."""
    try:
        data = record_bytes(spec, {**base, **overrides}, seed)
    except Exception as exc:  # both trees must refuse alike
        return f"error: {type(exc).__name__}: {exc}"
    return hashlib.sha256(data).hexdigest()


def fingerprints(cases: dict[str, tuple]) -> dict[str, str]:
    return {name: fingerprint(*case) for name, case in cases.items()}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="leave out the 2048-worker runs")
    p.add_argument("--save", help="write the fingerprints to this JSON file")
    p.add_argument("--check", help="compare with fingerprints a --save wrote; exit 1 if any differ")
    args = p.parse_args()
    cases = CASES if args.quick else {**CASES, **LARGE}
    got = fingerprints(cases)
    if args.save:
        with open(args.save, "w") as fh:
            json.dump(got, fh, indent=1)
    differ = 0
    stored = {}
    if args.check:
        with open(args.check) as fh:
            stored = json.load(fh)
    for name, value in got.items():
        mark = ""
        if args.check:
            same = stored.get(name) == value
            differ += not same
            mark = "  same" if same else f"  DIFFERS (was {stored.get(name, 'missing')[:16]})"
        print(f"{name:22s} {value[:64]}{mark}")
    if args.check:
        print(f"{len(got) - differ} of {len(got)} the same")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
