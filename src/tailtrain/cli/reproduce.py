"""`tailtrain reproduce`: the papers' figures and tables at laptop scale, with a report each."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from tailtrain.errors import UsageError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "reproduce",
        help="re-run a paper's figure or table at laptop scale and write a report",
        description="Run one experiment (or 'all') and write its PNG plots and report.md, with "
        "the paper's numbers beside ours and a sentence on each gap. --list names them.",
    )
    p.add_argument("name", nargs="?", help="experiment name from --list, or 'all'")
    p.add_argument("--list", action="store_true", help="list the experiments and their sizes")
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="folder for report.md and the plots (with 'all': one sub-folder per experiment)",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="small sizes (seconds per experiment, as in CI) instead of the full ones",
    )
    p.add_argument(
        "--task",
        default=None,
        help="run the experiment on this task instead (a built-in one or package.module:factory"
        "[:k=v,...]), with its own learning rate; only for experiments that train a model",
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from tailtrain.reproduce.registry import EXPERIMENTS, find
    from tailtrain.tasks import parse_task

    if args.list:
        for e in EXPERIMENTS:
            print(f"{e.name:<20} {e.paper} {e.figure}: {e.description}")
            print(f"{'':<20} {e.sizes.describe()}")
        return 0
    if args.name is None:
        raise UsageError("give an experiment name (see --list) or 'all'")
    chosen = find(args.name)
    if args.out is None:
        raise UsageError("give --out DIR for the report and plots")
    if args.task is not None:
        if args.name == "all":
            raise UsageError("--task applies to one experiment at a time; name one (see --list)")
        chosen[0].check_task(args.task)
        # built now, so that a bad spec or factory stops here with its one line
        parse_task(args.task)
    start, rows = time.perf_counter(), []
    for experiment in chosen:
        out = args.out / experiment.name if args.name == "all" else args.out
        report = experiment(out, args.quick, args.task)
        print(f"{experiment.name:<20} {report.seconds:6.1f} s  {out / 'report.md'}")
        rows.append(
            f"| [{experiment.name}]({experiment.name}/report.md) | {experiment.paper} "
            f"{experiment.figure} | {report.seconds:.1f} |"
        )
    if args.name == "all":
        total = time.perf_counter() - start
        print(f"{'total':<20} {total:6.1f} s")
        head = ["| experiment | paper, figure | seconds |", "| --- | --- | --- |"]
        size = "--quick" if args.quick else "full size"
        index = [f"# tailtrain reproduce all ({size}): {total:.0f} s", "", *head, *rows, ""]
        (args.out / "index.md").write_text("\n".join(index))
    return 0
