"""Sampling throughput of ``tailtrain.delays.DelayProcess``, in samples per second.

The headline case is DropCompute's simulated-delay setting (App. B.1) at the scale of its
extrapolation (Fig. 1): 2048 workers × 12 micro-batches × 1000 iterations = 24,576,000 unit
durations of ``const:value=0.5+dropcompute-noise:scale=0.5``. Other models and patterns follow.

    python bench/bench_delay_sampling.py            # human-readable lines
    python bench/bench_delay_sampling.py --json     # one JSON document
"""

from __future__ import annotations

import argparse
import json
import platform
import time

import numpy as np

from tailtrain.delays import DelayProcess

CASES = [  # (model, pattern); the first is the headline
    ("const:value=0.5+dropcompute-noise:scale=0.5", "iid"),
    ("exp:rate=1", "iid"),
    ("const:value=0.45+lognormal:mu=-1.84,sigma=0.83", "iid"),
    ("shifted-exp:shift=0.3,scale=0.7", "subset:s=4,delay=0.46"),
    ("exp:rate=1", "rotating"),
    ("gamma:shape=1,rate=4.5", "persistent:h=10"),
    ("exp:rate=1+bernoulli:p=0.5,value=0.45", "heterogeneous:low=1,high=2"),
]


def measure(model: str, pattern: str, args: argparse.Namespace) -> dict[str, object]:
    """Best wall time over ``--repeat`` runs of drawing all iterations in blocks."""
    best = float("inf")
    for run in range(args.repeat):
        process = DelayProcess(model, pattern, run, args.workers, args.micro_batches)
        start = time.perf_counter()
        left = args.iterations
        while left:
            block = process.next_block(min(args.block, left))
            left -= block.shape[0]
        best = min(best, time.perf_counter() - start)
    samples = args.iterations * args.workers * args.micro_batches
    return {
        "model": model,
        "pattern": pattern,
        "samples": samples,
        "seconds": best,
        "samples_per_second": samples / best,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2048)
    parser.add_argument("--micro-batches", type=int, default=12)
    parser.add_argument("--iterations", type=int, default=1000)
    parser.add_argument("--block", type=int, default=250, help="iterations per next_block call")
    parser.add_argument("--repeat", type=int, default=3, help="runs per case; the best counts")
    parser.add_argument("--headline-only", action="store_true", help="only the first case")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    args = parser.parse_args()
    results = [measure(m, p, args) for m, p in (CASES[:1] if args.headline_only else CASES)]
    if args.json:
        print(
            json.dumps(
                {
                    "workers": args.workers,
                    "micro_batches": args.micro_batches,
                    "iterations": args.iterations,
                    "block": args.block,
                    "numpy": np.__version__,
                    "machine": platform.machine(),
                    "results": results,
                },
                indent=2,
            )
        )
        return
    for r in results:
        print(
            f"{r['samples_per_second'] / 1e6:8.1f} M samples/s  {r['seconds']:6.2f} s  "
            f"{r['model']}  [{r['pattern']}]"
        )
    head = results[0]
    print(
        f"delay sampling throughput: {head['samples_per_second'] / 1e6:.1f} M samples/s "
        f"({head['samples']:,} samples = {args.workers} workers × {args.micro_batches} "
        f"micro-batches × {args.iterations} iterations in {head['seconds']:.2f} s; "
        f"{head['model']})"
    )


if __name__ == "__main__":
    main()
