"""`tailtrain train`: one strategy on N real processes (torch.distributed), same flags as simulate.

``--delay`` and ``--pattern`` are injected: extra seconds per unit of work on top of the real
compute, drawn from the simulator's seeded delay process; without ``--delay`` nothing is
injected. Under torchrun this process is one rank of that job; otherwise ``--workers N``
starts N local ranks (``tailtrain.runtime.launch``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from tailtrain.cli.scenario_args import add_scenario_arguments, scenario_from_args, seed_value
from tailtrain.errors import UsageError

DEFAULT_WORKERS = 16


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "train",
        help="train on N real processes (torch.distributed) under one strategy",
        description="Train with real ranks; the flags are simulate's, delays are injected.",
    )
    p.add_argument(
        "--strategy",
        default="sync",
        help="sync, dropcompute[:...], local-sgd:period=H, eager:mode=..., dbw-quorum, or a "
        "parameter-server strategy (k-sync:k=K, k-async:k=K, dbw, lgc:k=K, ...; one extra rank "
        "serves)",
    )
    add_scenario_arguments(p)
    p.set_defaults(workers=None)
    for action in p._actions:  # the shared help speaks of simulated workers
        if action.dest == "workers":
            action.help = (
                "workers N (default: 16; under torchrun, its WORLD_SIZE, less one for a "
                "parameter server, which runs as an extra rank)"
            )
        if action.dest == "time_budget":
            action.help = "wall-clock seconds to train"
        if action.dest == "delay":
            action.help = "seconds injected per unit of work, e.g. exp:rate=10 (default: none)"
    p.add_argument(
        "--seed", type=seed_value, default=0, help="seed of delays, data and init (default 0)"
    )
    p.add_argument("--out", type=Path, default=None, help="folder for the run record and trace.csv")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument(
        "--tensorboard",
        type=Path,
        default=None,
        metavar="DIR",
        help="rank 0 logs each step's and evaluation's scalars for TensorBoard into DIR as it "
        "trains (step = updates applied, wall time = training seconds); needs pip install "
        "tailtrain[tensorboard]",
    )
    p.add_argument(
        "--backend",
        choices=("gloo", "nccl"),
        default=None,
        help="torch.distributed backend (default: nccl with CUDA, else gloo)",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=300.0,
        metavar="SECONDS",
        help="bound on the rendezvous and on every collective (default: %(default)s)",
    )
    p.add_argument(
        "--rdzv-endpoint",
        default="127.0.0.1:0",
        metavar="HOST:PORT",
        help="where a local launch hosts the rendezvous; port 0 picks a free one",
    )
    p.add_argument(
        "--fail-at",
        type=fault_value,
        default=None,
        metavar="RANK:STEP",
        help="fault injection: RANK raises at the start of STEP (to test failure handling)",
    )
    p.set_defaults(run=run)


def fault_value(text: str):
    from tailtrain.runtime.config import Fault

    rank, sep, step = text.partition(":")
    if not sep or not rank.isdigit() or not step.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} must be RANK:STEP, two integers >= 0")
    return Fault(int(rank), int(step))


def run(args: argparse.Namespace) -> int:
    from tailtrain.cli.simulate import print_summary
    from tailtrain.runtime.config import TrainConfig
    from tailtrain.runtime.launch import JobFailed, default_backend, in_torchrun, train
    from tailtrain.sim.records import clean

    if args.delay is None and args.pattern != "iid":
        raise UsageError("--pattern shapes injected delays; give --delay too")
    if args.tensorboard is not None:  # a missing package fails before the ranks start
        from tailtrain.tensorboard import check_tensorboard

        check_tensorboard(args.tensorboard)
    from tailtrain.runtime.topologies import processes
    from tailtrain.strategies.registry import parse_strategy

    extra = processes(parse_strategy(args.strategy), 0)  # a parameter server's own rank
    args.workers = workers(args.workers, os.environ if in_torchrun() else None, extra)
    config = TrainConfig(
        scenario=scenario_from_args(args),
        strategy=args.strategy,
        seed=args.seed,
        inject=args.delay is not None,
        backend=args.backend or default_backend(),
        timeout=args.timeout,
        out=args.out,
        threads=args.threads,
        verbose=args.verbose,
        fault=args.fail_at,
        tensorboard=args.tensorboard,
    )
    try:
        result = train(config, args.rdzv_endpoint)
    except JobFailed as exc:
        print(f"tailtrain train: {exc}", file=sys.stderr)
        return 1
    if result.rank != 0:
        return 0
    if args.json:
        print(json.dumps(clean(result.record.summary), indent=2))
    else:
        print_summary(result.record.summary, command="train")
        if args.tensorboard is not None:
            board = args.tensorboard
            print(f"tensorboard: {board} (view: tensorboard --logdir {board})")
    return 0


def workers(given: int | None, torchrun_env, extra: int = 0) -> int:
    """--workers, or under torchrun the job's WORLD_SIZE less ``extra`` ranks that are no
    workers (a parameter server's), which --workers must then match."""
    if torchrun_env is None:
        return DEFAULT_WORKERS if given is None else given
    world = int(torchrun_env["WORLD_SIZE"])
    if world - extra < 1:
        raise UsageError(f"torchrun started {world} ranks; this strategy needs {extra + 1} or more")
    if given is not None and given != world - extra:
        raise UsageError(
            f"--workers {given} but torchrun started {world} ranks"
            + (f" ({extra} of them the server's)" if extra else "")
            + "; drop --workers"
        )
    return world - extra
