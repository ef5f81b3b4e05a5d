"""`tailtrain bench collectives`: eager-SGD's collective microbenchmark on real processes.

The real-process twin of `tailtrain simulate collectives` (same flags where they mean the same,
same JSON: ``{allreduce, solo, majority, quorum: {latency, nap}}``, plus ``network``: the hop
latency, per-call overhead and allreduce time it measured, as the ``--network`` spec that
calibrates the simulator).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "bench",
        help="measure on real processes (torch.distributed, gloo)",
        description="Benchmarks on local processes.",
    )
    what = p.add_subparsers(dest="what", metavar="{collectives}", parser_class=type(p))
    what.required = True
    c = what.add_parser(
        "collectives",
        help="eager-SGD's collective microbenchmark (Fig. 8) on P local processes",
        description="Skew P local processes before each call (eager-SGD Fig. 8) and measure "
        "the mean latency per process and call and the NAP of the synchronous allreduce and "
        "of the solo, majority and quorum partial allreduces (tailtrain.runtime.partial); "
        "also the per-hop latency, per-call overhead and allreduce time, as a --network spec "
        "for `tailtrain simulate collectives`.",
    )
    c.add_argument("--procs", type=int, default=8, help="local processes P (default: 8)")
    c.add_argument(
        "--skew",
        default="linear:step=0.005",
        help="worker pattern slept before each call (default: %(default)s)",
    )
    c.add_argument("--iterations", type=int, default=64, help="calls per collective (default 64)")
    c.add_argument("--quorum", type=int, default=None, metavar="K", help="default: ceil(P/2)")
    c.add_argument(
        "--delay", default="const:value=0", help="compute time slept before each call too"
    )
    c.add_argument("--seed", type=int, default=0, help="seed of delays and majority's initiators")
    c.add_argument(
        "--timeout", type=float, default=120.0, metavar="SECONDS", help="bound on every wait"
    )
    c.add_argument(
        "--network-out",
        type=Path,
        default=None,
        metavar="FILE",
        help="write the measured --network spec to FILE",
    )
    c.add_argument("--json", action="store_true", help="print the results as JSON")
    c.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from tailtrain.cli.collectives import print_table
    from tailtrain.runtime.launch import JobFailed
    from tailtrain.runtime.microbench import RealBench, run_real_microbenchmark

    bench = RealBench(
        procs=args.procs,
        skew=args.skew,
        iterations=args.iterations,
        quorum=args.quorum,
        delay=args.delay,
        seed=args.seed,
        timeout=args.timeout,
    )
    try:
        results = run_real_microbenchmark(bench)
    except JobFailed as exc:
        print(f"tailtrain bench collectives: {exc}", file=sys.stderr)
        return 1
    spec = results.network.spec()
    if args.network_out is not None:
        args.network_out.write_text(spec + "\n")
    if args.json:
        out = {name: asdict(stats) for name, stats in results.stats.items()}
        out["network"] = {**asdict(results.network), "spec": spec}
        print(json.dumps(out, indent=2))
    else:
        print_table(bench, results.stats, command="bench collectives")
        print(f"--network {spec}")
    return 0
