"""`tailtrain store`: host a multi-node job's store apart from every node
(``runtime.launching.store_apart``; ``tailtrain launch --store apart``)."""

from __future__ import annotations

import argparse
import sys


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "store",
        help="host a multi-node job's store in a process of its own (launch --store apart)",
        description="Serve the store that every node's `tailtrain launch --store apart` meets "
        "at, on the address given only, so that losing any node, node 0 too, leaves the job "
        "going. Start it first, on a machine that stays up. A c10d store is unauthenticated, "
        "as torchrun's is: keep the job on a private network. Ends when every node's launcher "
        "ended (exit 0), or --timeout seconds after the first did, or on Ctrl-C (130).",
    )
    p.add_argument(
        "--rdzv-endpoint",
        required=True,
        help="HOST:PORT to listen on (an address of this machine; every node is given it)",
    )
    p.add_argument("--nnodes", type=int, required=True, help="the job's nodes")
    p.add_argument(
        "--timeout",
        type=float,
        default=300.0,
        help="seconds a client waits for the store, and the store for the other launchers' "
        "ends after the first (default 300)",
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from tailtrain.errors import UsageError
    from tailtrain.runtime.launching.endpoint import parse_endpoint

    endpoint = parse_endpoint(args.rdzv_endpoint)
    if endpoint.port == 0:
        raise UsageError(
            f"--rdzv-endpoint {args.rdzv_endpoint} needs a port every node can be told, not 0"
        )
    if args.nnodes < 1:
        raise UsageError(f"--nnodes must be >= 1, got {args.nnodes}")
    if not args.timeout > 0 or args.timeout == float("inf"):
        raise UsageError(f"--timeout must be finite seconds > 0, got {args.timeout}")
    from tailtrain.runtime.launching.store_apart import serve_store

    try:
        line = serve_store(endpoint, args.nnodes, args.timeout)
    except KeyboardInterrupt:
        print("tailtrain store: interrupted; the store is gone", file=sys.stderr)
        return 130
    print(f"tailtrain store: {line}", file=sys.stderr)
    return 0
