"""`tailtrain simulate`: one strategy on N simulated workers with a virtual clock."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tailtrain.cli import collectives
from tailtrain.cli.progress import console, step_progress
from tailtrain.cli.run_folder import add_run_arguments
from tailtrain.cli.scenario_args import (
    add_group_arguments,
    add_scenario_arguments,
    seed_value,
)

#: the figure ``--out`` gets: loss and k_t (or τ, or NAP) against virtual time
FIGURE = "simulate.png"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "simulate",
        help="train a real model on N simulated workers under one strategy (virtual clock)",
        description="Simulate one strategy deterministically and write its run record.",
    )
    p.add_argument(
        "--strategy", default="sync", help="e.g. sync, k-sync:k=8, dbw, lgc:k=7,blocks=4"
    )
    add_scenario_arguments(p)
    add_group_arguments(p)
    p.add_argument(
        "--seed", type=seed_value, default=0, help="seed of delays, data and init (default 0)"
    )
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="folder for steps.jsonl, evals.jsonl, summary.json and the figure simulate.png",
    )
    p.add_argument(
        "--tensorboard",
        type=Path,
        default=None,
        metavar="DIR",
        help="also log the run's scalars for TensorBoard into DIR (step = updates applied, "
        "wall time = virtual time); needs pip install tailtrain[tensorboard]",
    )
    add_run_arguments(p)
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    p.set_defaults(run=run)
    p.set_defaults(defaults={a.dest: a.default for a in p._actions if a.dest != "help"})
    # `tailtrain simulate collectives ...`: the eager-SGD microbenchmark, its own options
    collectives.register(
        p.add_subparsers(dest="what", metavar="{collectives}", parser_class=type(p))
    )


def run(args: argparse.Namespace) -> int:
    from tailtrain.cli.run_folder import prepare_run, resume_run
    from tailtrain.core.records import clean
    from tailtrain.core.session import RunInterrupted
    from tailtrain.delays.trace import comm_note
    from tailtrain.sim.run import simulate

    job = resume_run(args) if args.resume is not None else prepare_run(args)
    scenario, strategy = job.scenario, job.strategy
    if args.tensorboard is not None:  # a missing package fails before the run, not after
        from tailtrain.tensorboard import check_tensorboard

        check_tensorboard(args.tensorboard)
    try:
        with step_progress(scenario, strategy.describe(), not args.no_progress) as for_run:
            progress = for_run(0) if for_run else None
            record = simulate(scenario, strategy, job.seed, progress, control=job.control)
    except RunInterrupted as exc:
        print(f"tailtrain simulate: interrupted at update {exc.step}{job.kept()}", file=sys.stderr)
        return 130
    folder, plot = job.control.folder, None
    if folder is not None:
        from tailtrain.plots import plot_runs

        plot = plot_runs({strategy.describe(): [record]}, scenario, [job.seed], folder / FIGURE)
    if args.tensorboard is not None:
        from tailtrain.tensorboard import TensorBoardLog

        with TensorBoardLog(args.tensorboard, record.summary.get("eval_metric", "eval")) as board:
            board.add_record(record.steps, record.evals)
    if args.json:
        print(json.dumps(clean(record.summary), indent=2))
    else:
        print_summary(record.summary)
    # with --json, standard output is the JSON alone: say where files went on standard error
    where = sys.stderr if args.json else sys.stdout
    if (note := comm_note(scenario.delay, scenario.comm_time)) is not None:
        print(note, file=where)
    if plot is not None:
        print(f"records: {folder}/steps.jsonl, evals.jsonl, summary.json", file=where)
        print(f"plot: {plot}", file=where)
    if args.tensorboard is not None:
        print(
            f"tensorboard: {args.tensorboard} (view: tensorboard --logdir {args.tensorboard})",
            file=where,
        )
    return 0


def print_summary(summary: dict, command: str = "simulate") -> None:
    from rich.table import Table

    clock = "virtual seconds of the simulated clock" if command == "simulate" else "wall seconds"
    table = Table(
        title=f"tailtrain {command}: {summary['strategy']}",
        caption=f"Times are {clock}.",
        show_header=False,
    )
    for key, value in summary.items():
        table.add_row(
            key,
            "-" if value is None else f"{value:.4g}" if isinstance(value, float) else str(value),
        )
    console().print(table)
