"""`tailtrain bench collectives`: eager-SGD's collective microbenchmark on real processes.

The real-process twin of `tailtrain simulate collectives` (same flags where they mean the same,
same JSON: ``{allreduce, solo, majority, quorum: {latency, nap}}``, plus ``network``: the hop
latency, per-message send cost, per-call overhead and allreduce time it measured and the
runtime's direct activation, as the ``--network`` spec that calibrates the simulator).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

#: ``strategies.eager.Collective``'s values, written out: the parser imports no strategy (nor
#: numpy); tests/cli/test_cli_imports.py checks they stay the same
COLLECTIVES = ("allreduce", "solo", "majority", "quorum")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "bench",
        help="measure on real processes (torch.distributed, gloo)",
        description="Benchmarks on local processes.",
    )
    what = p.add_subparsers(dest="what", metavar="{collectives,hang}", parser_class=type(p))
    what.required = True
    c = what.add_parser(
        "collectives",
        help="eager-SGD's collective microbenchmark (Fig. 8) on P local processes",
        description="Skew P local processes before each call (eager-SGD Fig. 8) and measure "
        "the mean latency per process and call and the NAP of the synchronous allreduce and "
        "of the solo, majority and quorum partial allreduces "
        "(tailtrain.runtime.partial.collective); also the per-hop latency, per-message send "
        "cost, per-call overhead, allreduce time "
        "and the runtime's direct activation, as a --network spec for `tailtrain simulate "
        "collectives`.",
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
    register_hang(what)


def register_hang(what: argparse._SubParsersAction) -> None:
    h = what.add_parser(
        "hang",
        help="how long a partial collective's rounds wait for a hung process",
        description="P local processes call one collective round after round; one rank hangs "
        "(its main thread, or with --whole the whole process) for --seconds at its --at-th "
        "call. Prints, as JSON, the others' longest and mean wait per call, the rounds that "
        "completed while it hung and how it came back (tailtrain.runtime.drills.hang).",
    )
    h.add_argument("--procs", type=int, default=4, help="local processes P (default: 4)")
    h.add_argument(
        "--collective",
        choices=COLLECTIVES,
        default="solo",
        help="the collective of every round; quorum's K is P - 1 (default: solo)",
    )
    h.add_argument("--rank", type=int, default=1, help="the rank that hangs (default: 1)")
    h.add_argument("--at", type=int, default=5, help="at its N-th call (default: 5)")
    h.add_argument("--seconds", type=float, default=2.0, help="for this long (default: 2)")
    h.add_argument("--rounds", type=int, default=120, help="rounds in all (default: 120)")
    h.add_argument("--compute", type=float, default=0.01, help="seconds per step (0.01)")
    h.add_argument("--whole", action="store_true", help="stop the whole process (SIGSTOP)")
    h.add_argument(
        "--timeout", type=float, default=60.0, metavar="SECONDS", help="bound on every wait"
    )
    h.set_defaults(run=run_hang)


def run_hang(args: argparse.Namespace) -> int:
    from tailtrain.runtime.drills.hang import HangDrill, run_hang_drill
    from tailtrain.runtime.launching.failures import JobFailed
    from tailtrain.strategies.eager import Collective

    drill = HangDrill(
        procs=args.procs,
        collective=Collective(args.collective),
        rank=args.rank,
        at=args.at,
        seconds=args.seconds,
        rounds=args.rounds,
        compute=args.compute,
        whole=args.whole,
        timeout=args.timeout,
    )
    try:
        print(json.dumps(run_hang_drill(drill), indent=2))
    except JobFailed as exc:
        print(f"tailtrain bench hang: {exc}", file=sys.stderr)
        return 1
    return 0


def run(args: argparse.Namespace) -> int:
    from tailtrain.cli.collectives import print_collective_stats
    from tailtrain.runtime.drills.microbench import RealBench, run_real_microbenchmark
    from tailtrain.runtime.launching.failures import JobFailed

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
        print_collective_stats(bench, results.stats, command="bench collectives")
        print(f"--network {spec}")
    return 0
