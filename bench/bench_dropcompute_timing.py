"""Timing-only throughput of the allreduce simulator under DropCompute, in micro-batches/second.

The headline case is DropCompute's simulated-delay setting (App. B.1) at the scale of its
extrapolation (Fig. 1): 2048 workers x 12 micro-batches of
``const:value=0.5+dropcompute-noise:scale=0.5`` seconds, T^c = 0.2 s, ``--task none``. A
"simulated micro-batch" is one sampled unit, computed or dropped: a round counts N x M. The
whole engine runs (rule calls, stop rule, records), as ``tailtrain simulate`` runs it.

    python bench/bench_dropcompute_timing.py            # human-readable lines
    python bench/bench_dropcompute_timing.py --json     # one JSON document
"""

from __future__ import annotations

import argparse
import json
import platform
import time

from tailtrain.core.scenario import Scenario
from tailtrain.sim.run import simulate
from tailtrain.strategies.registry import parse_strategy

DELAY = "const:value=0.5+dropcompute-noise:scale=0.5"
CASES = [  # strategy specs; the first is the headline
    "dropcompute:threshold=7.9",
    "dropcompute:threshold=auto,calibrate=20",
    "dropcompute:threshold=7.9,stop=between",
    "dropcompute:threshold=inf",
]


def measure(strategy: str, args: argparse.Namespace) -> dict[str, object]:
    """Best wall time over ``--repeat`` whole simulations."""
    scenario = Scenario(
        task="none",
        workers=args.workers,
        micro_batches=args.micro_batches,
        delay=DELAY,
        comm_time="0.2",
        iterations=args.iterations,
    )
    best, summary = float("inf"), {}
    for run in range(args.repeat):
        start = time.perf_counter()
        record = simulate(scenario, parse_strategy(strategy), run)
        best = min(best, time.perf_counter() - start)
        summary = record.summary
    units = args.iterations * args.workers * args.micro_batches
    return {
        "strategy": strategy,
        "micro_batches": units,
        "seconds": best,
        "micro_batches_per_second": units / best,
        "drop_rate": summary["drop_rate"],
        "effective_speedup": summary["effective_speedup"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2048)
    parser.add_argument("--micro-batches", type=int, default=12)
    parser.add_argument("--iterations", type=int, default=500)
    parser.add_argument("--repeat", type=int, default=3, help="runs per case; the best counts")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    args = parser.parse_args()
    results = [measure(case, args) for case in CASES]
    if args.json:
        meta = {"python": platform.python_version(), "machine": platform.machine()}
        print(json.dumps({"meta": meta, "results": results}, indent=2))
        return
    for r in results:
        print(
            f"{r['strategy']:<42} {r['micro_batches_per_second']:>12.3e} micro-batches/s "
            f"({r['seconds']:.3f} s; drop rate {r['drop_rate']:.3f}, "
            f"S_eff {r['effective_speedup']:.3f})"
        )


if __name__ == "__main__":
    main()
