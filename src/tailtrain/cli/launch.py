"""`tailtrain launch`: your own training script on N local ranks, as torchrun starts it, whose
ranks' deaths the job survives with ``--on-rank-loss shrink`` (``runtime.launching.scripts``)."""

from __future__ import annotations

import argparse
import sys

from tailtrain.cli.train import DEFAULT_ON_RANK_LOSS  # written out there: the parser loads no torch


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "launch",
        help="run your own training script on N local ranks (torchrun's env://)",
        description="Start N local processes of `python SCRIPT ARGS...` with torch's env:// "
        "variables, the store hosted here (not in rank 0). With --on-rank-loss shrink a rank "
        "that dies is noted and the others go on: tailtrain.StragglerStep(..., "
        'on_rank_loss="shrink") shrinks to the survivors. Exit 0 when the job finished; 2 when '
        "the script refused its input (argparse, or a tailtrain.UsageError: its one line, "
        "once, not once per rank); 1 when a rank failed, or a rank started again ended before "
        "the live ranks took it in (a failed heal; its traceback, then one line naming it); "
        "130 after Ctrl-C (one line).",
    )
    p.add_argument("--nproc-per-node", type=int, default=1, help="local ranks N (default: 1)")
    p.add_argument(
        "--on-rank-loss",
        default=DEFAULT_ON_RANK_LOSS,
        help="stop: a rank that fails stops the others (torchrun's way; default); shrink: the "
        "job goes on without it",
    )
    p.add_argument(
        "--rdzv-endpoint",
        default="127.0.0.1:0",
        help="HOST:PORT of the job's store: hosted by this launcher on one node (default "
        "127.0.0.1 and a free port), by node 0's across nodes, or by `tailtrain store` with "
        "--store apart; it listens on that address only",
    )
    p.add_argument("--nnodes", type=int, default=1, help="the job's nodes (default: 1)")
    p.add_argument(
        "--node-rank", type=int, default=0, help="this node's index, 0..nnodes-1 (default: 0)"
    )
    p.add_argument(
        "--store",
        default="launcher",
        help="launcher: node 0's launcher hosts the store (the job ends if node 0 is lost; "
        "default); apart: `tailtrain store` hosts it, so losing any node leaves the job going",
    )
    p.add_argument(
        "--group-by",
        default=None,
        help="under shrink, what leaves the job when one of its ranks dies: node (its other "
        "ranks are stopped; the default across nodes) or rank (the default on one node)",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=300.0,
        help="seconds the store waits, and a rank may still run after the first one finished "
        "(then it is stopped: a hung rank the others went on without; default 300)",
    )
    p.add_argument(
        "--restart-lost",
        type=int,
        default=0,
        help="under shrink: start a rank that died again, at most N times per rank; it joins "
        "the live ranks at a step boundary and takes their state; one that ends before it "
        "was taken in fails the launch (default 0)",
    )
    p.add_argument("script", nargs="?", help="the training script (a Python file)")
    p.add_argument("script_args", nargs=argparse.REMAINDER, help="the script's own arguments")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from tailtrain.runtime.launching.failures import JobFailed
    from tailtrain.runtime.launching.script_rank import BAD_INPUT, INTERRUPTED
    from tailtrain.runtime.launching.scripts import check_launch, launch_script

    plan = check_launch(
        args.script,
        args.nproc_per_node,
        args.on_rank_loss,
        args.rdzv_endpoint,
        args.timeout,
        args.script_args,
        args.restart_lost,
        args.nnodes,
        args.node_rank,
        args.store,
        args.group_by,
    )
    try:
        outcome = launch_script(plan)
    except JobFailed as exc:  # the job failed: one line, status 1 (2 is for bad input)
        print(f"tailtrain launch: error: {exc}", file=sys.stderr)
        return 1
    if outcome.refused is not None:  # the script's bad input, as its rank put it: once
        print(outcome.refused, file=sys.stderr)
        return BAD_INPUT
    if outcome.interrupted:
        print("tailtrain launch: interrupted; the ranks were stopped", file=sys.stderr)
        return INTERRUPTED
    return 0
