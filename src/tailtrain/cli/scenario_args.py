"""Command-line flags of `simulate`, `compare` and `train`, and their conversion to a Scenario."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from tailtrain.errors import UsageError

if TYPE_CHECKING:  # the simulator pulls in torch: import it only when a command runs
    from tailtrain.core.scenario import Scenario


#: the delay model when --delay is not given (None in the parsed args, so that `train` can
#: tell "not given", which for it means: inject nothing)
DEFAULT_DELAY = "shifted-exp:shift=0,scale=1"


def add_scenario_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--task",
        default="digits-cnn",
        help="digits-cnn, digits-mlp, logreg, hyperplane:dim=D, seq-lstm (heavy-tailed "
        "sequence lengths: classes=,features=,hidden=,min-len=,max-len=,shape=,n=,test=,signal=), "
        "tiny-gpt (a small transformer on the standard library's source: layers=,width=,heads=,"
        "context=,batch=,dropout=,n=,test=,lr=), none (timing only), cifar10, mnist, or your "
        "own: package.module:factory[:key=value,...] (docs/your-model.md) "
        "(default: %(default)s)",
    )
    p.add_argument("--data", default=None, help="folder with the cifar10 or mnist files")
    p.add_argument(
        "--partition", default="iid", help="iid, shared or noniid:classes=C (default: %(default)s)"
    )
    p.add_argument("--workers", type=int, default=16, help="simulated workers N (default: 16)")
    p.add_argument(
        "--delay",
        default=None,
        help=f"compute-time model of one gradient, e.g. exp:rate=1 (default: {DEFAULT_DELAY})",
    )
    p.add_argument(
        "--pattern",
        default="iid",
        help="which worker is slow when, e.g. persistent:h=10 (default: iid)",
    )
    p.add_argument(
        "--micro-batches",
        type=int,
        default=None,
        metavar="M",
        help="micro-batches per iteration; the delay model is then per micro-batch",
    )
    p.add_argument(
        "--comm-time",
        default=None,
        metavar="SECONDS|SPEC",
        help="communication time T^c, seconds or a delay spec: per job (pull, compute, push) "
        "on a parameter server, per update for allreduce, per collective for eager",
    )
    p.add_argument(
        "--network",
        default=None,
        metavar="hop=S,overhead=S",
        help="interconnect latencies for partial collectives: activation hop and per-call "
        "overhead in seconds (default: hop=1.5e-6,overhead=0, activation along a tree); "
        "`train` activates directly up to 8 processes, which direct=8 reproduces",
    )
    budget = p.add_mutually_exclusive_group()
    budget.add_argument("--iterations", type=int, default=None, help="number of updates")
    budget.add_argument(
        "--time-budget",
        type=float,
        default=None,
        metavar="SECONDS",
        help="virtual seconds to simulate",
    )
    p.add_argument("--lr", type=float, default=None, help="learning rate (default: the task's)")
    evals = p.add_mutually_exclusive_group()
    evals.add_argument(
        "--eval-interval",
        type=float,
        default=None,
        metavar="SECONDS",
        help="evaluate every this many virtual seconds, the same instants for every strategy "
        "(default with --time-budget: 1/100 of it)",
    )
    evals.add_argument(
        "--eval-every",
        type=int,
        default=None,
        metavar="UPDATES",
        help="evaluate every this many updates instead (default with --iterations: 10)",
    )
    p.add_argument(
        "--target-loss",
        type=float,
        default=None,
        help="report the virtual time at which the train loss first reaches this "
        "(interpolated between the two evaluations around it)",
    )


def add_group_arguments(p: argparse.ArgumentParser) -> None:
    """--group-size and --group-cost (replica groups of a hybrid-sharded job, issue 38):
    `simulate`, `compare` and `predict`, not `train` (which runs one DDP rank per worker)."""
    p.add_argument(
        "--group-size",
        type=int,
        default=1,
        metavar="G",
        help="ranks per replica group of a hybrid-sharded (HSDP) job: the --workers ranks "
        "form N/G groups of G consecutive ranks, a group's micro-batch is the max over its "
        "ranks plus --group-cost, and the strategy acts on the groups (default: 1, each rank "
        "its own worker)",
    )
    p.add_argument(
        "--group-cost",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="exposed within-group collectives (all-gather, reduce-scatter) per group "
        "micro-batch (default: 0, FSDP2 overlaps them with compute; give a measured figure)",
    )


MAX_SEED = 2**63 - 1
#: evaluations a time grid may ask for; each one scores the model on the data set
MAX_EVALS = 1e6


def seed_value(text: str) -> int:
    """argparse type of a seed: an integer in 0..2^63-1 (numpy and torch both accept those)."""
    try:
        seed = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"seed {text!r} is not an integer") from None
    if not 0 <= seed <= MAX_SEED:
        raise argparse.ArgumentTypeError(f"seed {seed} must lie in 0..2^63-1")
    return seed


def scenario_from_args(args: argparse.Namespace, *, default_iterations: int = 200) -> Scenario:
    from tailtrain.core.scenario import Scenario

    if args.target_loss is not None and args.target_loss < 0:
        # a library task may have a negative loss; no built-in task has
        raise UsageError(
            f"--target-loss {args.target_loss:g} is never reached: every built-in task's "
            "loss is >= 0; give a target >= 0"
        )
    budget, interval = args.time_budget, args.eval_interval
    if (
        budget is not None
        and interval is not None
        and interval > 0
        and budget / interval > MAX_EVALS
    ):
        raise UsageError(
            f"--eval-interval {interval:g} asks for {budget / interval:.3g} evaluations within "
            f"--time-budget {budget:g}; at most {MAX_EVALS:g}: give a larger interval"
        )
    iterations = args.iterations
    if iterations is None and args.time_budget is None:
        iterations = default_iterations
    return Scenario(
        task=args.task,
        workers=args.workers,
        delay=DEFAULT_DELAY if args.delay is None else args.delay,
        pattern=args.pattern,
        micro_batches=args.micro_batches,
        comm_time=args.comm_time,
        network=args.network,
        partition=args.partition,
        data=args.data,
        lr=args.lr,
        iterations=iterations,
        time_budget=args.time_budget,
        eval_every=args.eval_every,
        eval_interval=args.eval_interval,
        target_loss=args.target_loss,
        group_size=getattr(args, "group_size", 1),
        group_cost=getattr(args, "group_cost", 0.0),
    )
