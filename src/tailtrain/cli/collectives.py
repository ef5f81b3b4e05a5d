"""`tailtrain simulate collectives`: eager-SGD's partial-allreduce microbenchmark (Fig. 8/9)."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from typing import TYPE_CHECKING

from tailtrain.errors import UsageError
from tailtrain.network import DEFAULT_HOP, NetworkModel, parse_network

if TYPE_CHECKING:  # the simulator pulls in torch: import it only when the command runs
    from tailtrain.topology.partial import CollectiveStats


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "collectives",
        help="eager-SGD's collective microbenchmark (Fig. 8) in virtual time",
        description="Skew P processes before each collective (eager-SGD Fig. 8) and report the "
        "mean latency per process and the number of active processes (NAP) of the synchronous "
        "allreduce and of the solo, majority and quorum partial allreduces.",
    )
    p.add_argument("--procs", type=int, default=32, help="processes P (default: 32)")
    p.add_argument(
        "--skew",
        default="linear:step=0.001",
        help="worker pattern applied before each call (default: %(default)s, "
        "Fig. 8's usleep(pid * 1000))",
    )
    p.add_argument("--iterations", type=int, default=64, help="collective calls (default: 64)")
    p.add_argument(
        "--quorum",
        type=int,
        default=None,
        metavar="K",
        help="K of the quorum collective (default: ceil(P/2))",
    )
    p.add_argument(
        "--hop-latency",
        type=float,
        default=None,
        metavar="SECONDS",
        help="latency of one activation message; activation takes ceil(log2 P) hops "
        f"(default: {DEFAULT_HOP:g}, an Aries-class latency; the paper gives none)",
    )
    p.add_argument(
        "--allreduce-time",
        type=float,
        default=None,
        metavar="SECONDS",
        help="duration of the allreduce itself (default: ceil(log2 P) hops, "
        "recursive doubling of a one-element buffer)",
    )
    p.add_argument(
        "--call-overhead",
        type=float,
        default=None,
        metavar="SECONDS",
        help="software cost every call pays, even when the result is ready (default: 0)",
    )
    p.add_argument(
        "--network",
        default=None,
        metavar="hop=,overhead=,allreduce=,direct=,send=",
        help="the three above as one spec, e.g. what `tailtrain bench collectives` measured "
        "(--network-out); give either this or the separate flags. direct=D: up to D processes "
        "the initiator activates everyone itself, one message after another, each costing "
        "send= seconds (the runtime's direct activation; default 0: ceil(log2 P) hops)",
    )
    p.add_argument(
        "--delay",
        default="const:value=0",
        help="compute time before each call, a delay spec (default: none)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of delays and majority's initiators")
    p.add_argument(
        "--json",
        action="store_true",
        help="print {allreduce, solo, majority, quorum: {latency, nap}} as JSON",
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from tailtrain.core.capacity import check_memory
    from tailtrain.sim.partial.microbench import Microbenchmark, run_microbenchmark

    if args.procs >= 1 and args.iterations >= 1:  # the skew and delay draws, a few copies
        need = 8 * 4 * args.procs * args.iterations
        check_memory(need, f"--procs {args.procs} x --iterations {args.iterations}", "draws")
    network = network_of(args)
    bench = Microbenchmark(
        procs=args.procs,
        skew=args.skew,
        iterations=args.iterations,
        hop=network.hop,
        allreduce=network.allreduce,
        quorum=args.quorum,
        overhead=network.overhead,
        delay=args.delay,
        seed=args.seed,
        direct=network.direct,
        send=network.send,
    )
    results = run_microbenchmark(bench)
    if args.json:
        print(json.dumps({name: asdict(stats) for name, stats in results.items()}, indent=2))
    else:
        print_collective_stats(bench, results)
    return 0


def network_of(args: argparse.Namespace) -> NetworkModel:
    """--network, or the separate flags (not both); unset values keep the defaults."""
    flags = {"--hop-latency": args.hop_latency, "--call-overhead": args.call_overhead}
    flags["--allreduce-time"] = args.allreduce_time
    given = [name for name, value in flags.items() if value is not None]
    if args.network is not None:
        if given:
            raise UsageError(f"give --network or {given[0]}, not both")
        return parse_network(args.network)
    return NetworkModel(
        hop=DEFAULT_HOP if args.hop_latency is None else args.hop_latency,
        overhead=0.0 if args.call_overhead is None else args.call_overhead,
        allreduce=args.allreduce_time,
    )


def print_collective_stats(
    bench, results: dict[str, CollectiveStats], command: str = "simulate collectives"
) -> None:
    from rich.console import Console
    from rich.table import Table

    base = results["allreduce"].latency
    table = Table(
        title=f"tailtrain {command}: {bench.procs} processes, {bench.skew}, "
        f"{bench.iterations} iterations"
    )
    for column in ("collective", "mean latency", "vs allreduce", "NAP"):
        table.add_column(column, justify="left" if column == "collective" else "right")
    for name, stats in results.items():
        ratio = base / stats.latency if stats.latency > 0 else float("inf")
        table.add_row(name, f"{stats.latency * 1e3:.4g} ms", f"{ratio:.3g}x", f"{stats.nap:.2f}")
    Console().print(table)
