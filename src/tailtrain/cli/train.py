"""`tailtrain train`: one strategy on N real processes (torch.distributed), same flags as simulate.

``--delay`` and ``--pattern`` are injected: extra seconds per unit of work on top of the real
compute, drawn from the simulator's seeded delay process; without ``--delay`` nothing is
injected. Under torchrun this process is one rank of that job; otherwise ``--workers N``
starts N local ranks (``tailtrain.runtime.launching.launch``).

``--out DIR`` is the run folder (as simulate's, ``cli.run_folder``): ``run.json`` holds the
flags, rank 0 appends each round's row to ``steps.jsonl`` and flushes it (a parameter server
writes an LGC row once its stragglers' blocks are in, a step late, and ``evals.jsonl`` at the
end, as it scores the evaluations after the run, ``runtime.ps``), ``--checkpoint-every U``
checkpoints every U rounds,
and when a rank dies or hangs a survivor checkpoints the last completed round
(``runtime.keep``). ``--resume DIR`` goes on with the flags in DIR;
``--max-restarts R`` lets the launcher restart a failed group, which goes on from the folder's
last checkpoint by itself. A restart needs no periodic checkpoint (the survivors write one),
so ``--max-restarts`` needs only ``--out``; ``--checkpoint-every`` bounds what is played again
when no rank survives to write it. Under torchrun, give torchrun's own ``--max-restarts``: a
restarted rank (``TORCHELASTIC_RESTART_COUNT`` > 0) continues the run in ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from tailtrain.cli.scenario_args import add_scenario_arguments, scenario_from_args, seed_value
from tailtrain.errors import UsageError
from tailtrain.strategies.names import strategy_help

DEFAULT_WORKERS = 16
#: --timeout and --max-restarts when a run starts without them (TrainConfig's defaults)
DEFAULT_TIMEOUT = 300.0  # written out: the CLI imports the runtime (and torch) only to run
DEFAULT_MAX_RESTARTS = 0
DEFAULT_ON_RANK_LOSS = "stop"
DEFAULT_RESTART_LOST = 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "train",
        help="train on N real processes (torch.distributed) under one strategy",
        description="Train with real ranks; the flags are simulate's, delays are injected.",
    )
    p.add_argument(
        "--strategy",
        default="sync",
        help=strategy_help(),
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
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="run folder: run.json, steps.jsonl (appended every round), evals.jsonl, "
        "summary.json, trace.csv and checkpoints; Ctrl-C keeps them, the summary partial",
    )
    p.add_argument(
        "--checkpoint-every",
        type=int,
        default=None,
        metavar="U",
        help="checkpoint in --out every U rounds or steps (default: only when a rank fails or "
        "on Ctrl-C, of the last completed one)",
    )
    p.add_argument(
        "--resume",
        type=Path,
        default=None,
        metavar="DIR",
        help="go on with the run in DIR from its checkpoint, with the flags it was started with",
    )
    p.add_argument(
        "--max-restarts",
        type=int,
        default=None,  # None: not given (a --resume keeps the run's); 0 when a run starts
        metavar="R",
        help="restart a failed group up to R times; it goes on from the last checkpoint in "
        "--out (needs --out; under torchrun give torchrun's own --max-restarts; default: "
        f"{DEFAULT_MAX_RESTARTS}, or the run's own with --resume)",
    )
    p.add_argument("--overwrite", action="store_true", help="replace the run --out already holds")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--no-progress", action="store_true", help="hide rank 0's progress bar")
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
        default=None,  # None: not given (a --resume keeps the run's)
        metavar="SECONDS",
        help="bound on the rendezvous and on every collective (default: "
        f"{DEFAULT_TIMEOUT:g}, or the run's own with --resume)",
    )
    p.add_argument(
        "--worker-timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="parameter server: a worker silent this long in a job is suspected hung and k is "
        "capped at the live workers until it delivers again (default: 10 times the longest "
        "round trip seen, at least 2 s, at most --timeout)",
    )
    p.add_argument(
        "--on-rank-loss",
        choices=("stop", "shrink"),
        default=None,
        help="allreduce and partial collectives: when a rank dies or stays silent past a "
        "deadline learned from the round times (at most --timeout), stop (census, "
        "checkpoint, exit; --max-restarts restarts the group) or shrink (the others go on "
        "without it, in place, no restart; local launch; sync, DropCompute (tau chosen again "
        "for the live ranks), Local-SGD, rebalance (shares dealt again over the live ranks) "
        "and eager (its quorum over the live ranks). Default: "
        f"{DEFAULT_ON_RANK_LOSS}, or the run's own with --resume",
    )
    p.add_argument(
        "--restart-lost",
        type=int,
        default=None,
        metavar="N",
        help="with --on-rank-loss shrink: start a rank that died again, up to N times; it "
        "rejoins the live ranks at a step boundary with a live peer's state (default: "
        f"{DEFAULT_RESTART_LOST}, or the run's own with --resume)",
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
        help="deprecated: the same as --inject-fault raise:rank=RANK,step=STEP",
    )
    p.add_argument(
        "--inject-fault",
        action="append",
        default=None,
        metavar="KIND:worker=W,step=S",
        help="fault drill, repeatable: nan:/inf: (worker W's gradient of update S), "
        "kill: (worker W's process is killed when it starts update S), "
        "freeze:...,seconds=X (it hangs X seconds there) or raise:rank=R,step=S (rank R "
        "raises there; a parameter server is rank 0); a kill, freeze or raise fires once "
        "per run, not again after a resume or restart",
    )
    p.add_argument(
        "--on-nonfinite",
        choices=("skip", "raise"),
        default="skip",
        help="a gradient with NaN or inf: skip drops it from its update and counts it "
        "(column nonfinite); raise stops the run (default: skip)",
    )
    p.set_defaults(run=run)
    p.set_defaults(defaults={a.dest: a.default for a in p._actions if a.dest != "help"})


def fault_value(text: str) -> str:
    """``--fail-at RANK:STEP`` as the raise drill it stands for."""
    rank, sep, step = text.partition(":")
    if not sep or not rank.isdigit() or not step.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} must be RANK:STEP, two integers >= 0")
    return raise_drill(int(rank), int(step))


def raise_drill(rank: int, step: int) -> str:
    return f"raise:rank={rank},step={step}"


def run(args: argparse.Namespace) -> int:
    from tailtrain.cli.simulate import print_summary
    from tailtrain.core.records import clean
    from tailtrain.runtime.interrupt import Interrupted
    from tailtrain.runtime.launching.failures import JobFailed
    from tailtrain.runtime.launching.launch import train

    if args.tensorboard is not None:  # a missing package fails before the ranks start
        from tailtrain.tensorboard import check_tensorboard

        check_tensorboard(args.tensorboard)
    config, prepare = resumed(args) if args.resume is not None else fresh(args)
    try:
        result = train(config, args.rdzv_endpoint, prepare)
    except JobFailed as exc:
        print(f"tailtrain train: {exc}", file=sys.stderr)
        return 1
    except Interrupted as exc:  # Ctrl-C: what finished is kept (runtime.keep); one line
        if str(exc):
            print(f"tailtrain train: {exc}", file=sys.stderr)
        return exc.exit_code
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


def fresh(args: argparse.Namespace):
    """A run from the flags, and what claims its --out folder once the input is checked."""
    from tailtrain.cli.run_folder import train_info
    from tailtrain.core.records import RUN_FILES, TRAIN_EXTRA, claim_folder, clear_run, write_json
    from tailtrain.faults import FaultPlan
    from tailtrain.runtime.config import TrainConfig
    from tailtrain.runtime.keep import restarts
    from tailtrain.runtime.launching.checks import default_backend, in_torchrun
    from tailtrain.runtime.launching.topologies import TOPOLOGY_SPECS
    from tailtrain.strategies.registry import parse_strategy

    if args.delay is None and args.pattern != "iid":
        raise UsageError("--pattern shapes injected delays; give --delay too")
    if args.overwrite and args.out is None:
        raise UsageError("--overwrite needs --out DIR, the folder the run is kept in")
    strategy = parse_strategy(args.strategy)
    extra = TOPOLOGY_SPECS[strategy.topology].extra_ranks  # a parameter server's own rank
    torchrun = in_torchrun()
    args.timeout = DEFAULT_TIMEOUT if args.timeout is None else args.timeout
    args.max_restarts = DEFAULT_MAX_RESTARTS if args.max_restarts is None else args.max_restarts
    args.on_rank_loss = args.on_rank_loss or DEFAULT_ON_RANK_LOSS
    args.restart_lost = DEFAULT_RESTART_LOST if args.restart_lost is None else args.restart_lost
    args.workers = workers(args.workers, os.environ if torchrun else None, extra)
    if args.fail_at is not None:  # the deprecated alias joins the drills it stands for
        args.inject_fault = [*(args.inject_fault or ()), args.fail_at]
    faults = FaultPlan.parse(args.inject_fault, args.workers, ranks=args.workers + extra)
    args.backend = args.backend or default_backend()
    config = TrainConfig(
        scenario=scenario_from_args(args),
        strategy=strategy,  # parsed once: every rank gets the object
        seed=args.seed,
        inject=args.delay is not None,
        backend=args.backend,
        timeout=args.timeout,
        out=args.out,
        threads=args.threads,
        verbose=args.verbose,
        progress=not args.no_progress,
        faults=faults,
        on_nonfinite=args.on_nonfinite,
        checkpoint_every=args.checkpoint_every,
        max_restarts=args.max_restarts,
        worker_timeout=args.worker_timeout,
        tensorboard=args.tensorboard,
        on_rank_loss=args.on_rank_loss,
        restart_lost=args.restart_lost,
    )
    folder = args.out
    # under torchrun, rank 0 claims the folder; a restarted rank continues the run in it
    if folder is None or (torchrun and (os.environ["RANK"] != "0" or restarts() > 0)):
        return config, None
    names = (*RUN_FILES, *TRAIN_EXTRA)
    claim_folder(folder, names, overwrite=args.overwrite, resume_hint=True)
    info = train_info(args, config.scenario, faults)

    def prepare() -> None:
        clear_run(folder, names)
        write_json(folder / "run.json", info)

    return config, prepare


def resumed(args: argparse.Namespace):
    """The run in ``--resume DIR``, with the flags it was started with (run.json)."""
    from tailtrain.cli.run_folder import resume_train
    from tailtrain.faults import FaultPlan
    from tailtrain.runtime.config import TrainConfig
    from tailtrain.runtime.launching.checks import default_backend, in_torchrun
    from tailtrain.runtime.launching.topologies import TOPOLOGY_SPECS
    from tailtrain.strategies.registry import parse_strategy

    info, scenario = resume_train(args)
    runtime = info["runtime"]
    strategy = parse_strategy(info["strategy"])
    extra = TOPOLOGY_SPECS[strategy.topology].extra_ranks
    workers(scenario.workers, os.environ if in_torchrun() else None, extra)
    drills = list(info["inject_fault"])
    if runtime["fail_at"] is not None:  # a run started with the deprecated --fail-at
        drills.append(raise_drill(*runtime["fail_at"]))
    every = args.checkpoint_every if args.checkpoint_every is not None else info["checkpoint_every"]
    config = TrainConfig(
        scenario=scenario,
        strategy=strategy,
        seed=info["seed"],
        inject=runtime["inject"],
        backend=runtime["backend"] or default_backend(),
        timeout=runtime["timeout"] if args.timeout is None else args.timeout,
        out=args.resume,
        threads=args.threads,
        verbose=args.verbose,
        progress=not args.no_progress,
        faults=FaultPlan.parse(drills, scenario.workers, ranks=scenario.workers + extra),
        on_nonfinite=info["on_nonfinite"],
        checkpoint_every=every,
        max_restarts=runtime["max_restarts"] if args.max_restarts is None else args.max_restarts,
        worker_timeout=runtime["worker_timeout"],
        tensorboard=args.tensorboard,
        # a run.json from before these were kept: the defaults it ran with
        on_rank_loss=args.on_rank_loss or runtime.get("on_rank_loss", DEFAULT_ON_RANK_LOSS),
        restart_lost=runtime.get("restart_lost", DEFAULT_RESTART_LOST)
        if args.restart_lost is None
        else args.restart_lost,
    )
    return config, None


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
