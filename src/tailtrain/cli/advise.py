"""`tailtrain advise`: who is slow in a trace, what it costs, and which strategy to run."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from tailtrain.cli.predict import _finite
from tailtrain.cli.scenario_args import seed_value
from tailtrain.errors import UsageError

if TYPE_CHECKING:  # the advice pulls in numpy, scipy and the theory: only when advise runs
    from tailtrain.advice import Advice

#: the trace's columns for the help, written out: ``delays.trace.TRACE_FORMAT``'s (the parser
#: imports no numpy or scipy; tests/cli/test_cli_imports.py checks they stay the same)
TRACE_FORMAT = "iteration,worker[,micro_batch][,censored],seconds[,noncompute][,samples][,run]"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "advise",
        help="score the workers of a trace, cost the stragglers and recommend a strategy",
        description=(
            f"Reads a trace ({TRACE_FORMAT}), scores every worker "
            "(persistent straggler, intermittent or healthy), prices sync's wait for the "
            "slowest, ranks every strategy at its best setting by theory and by a timing-only "
            "simulation replaying the trace, and recommends one."
        ),
    )
    p.add_argument(
        "source",
        nargs="?",
        type=Path,
        default=None,
        metavar="FILE|DIR",
        help="trace CSV, or a folder with trace.csv (a StragglerProbe's or a run's)",
    )
    p.add_argument("--trace", default=None, metavar="FILE", help="trace CSV (as FILE|DIR)")
    p.add_argument(
        "--workers",
        type=int,
        default=None,
        metavar="N",
        help="workers to advise for (default: the trace's; worker n replays n mod W)",
    )
    p.add_argument("--micro-batches", type=int, default=None, metavar="M")
    p.add_argument(
        "--for",
        dest="setup",
        choices=("ddp", "loop", "tailtrain-train", "any"),
        default="any",
        help="the job to advise: a DDP job (the comm hook), an own loop (StragglerStep), "
        "tailtrain train (every strategy) or any (default: %(default)s)",
    )
    p.add_argument(
        "--comm-time",
        default=None,
        metavar="SECONDS|SPEC",
        help="communication time T^c per update, seconds or a delay spec (default: the "
        "rounds' noncompute seconds the trace recorded, as `train` writes them, else 0)",
    )
    p.add_argument("--seed", type=seed_value, default=0)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        metavar="DIR",
        help="write advice.json and heatmap.png there",
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from tailtrain.advice import advise
    from tailtrain.advice.heatmap import plot_heatmap
    from tailtrain.core.records import prepare_folder

    if (args.source is None) == (args.trace is None):
        raise UsageError(
            "advise reads one trace: give a trace file or a probe's folder (advise DIR), "
            "or --trace FILE"
        )
    found = advise(
        args.source or args.trace,
        workers=args.workers,
        micro_batches=args.micro_batches,
        seed=args.seed,
        setup=args.setup,
        comm_time=args.comm_time,
    )
    payload = _finite(found.to_json())
    if args.out is not None:
        folder = prepare_folder(args.out)
        (folder / "advice.json").write_text(json.dumps(payload, indent=2) + "\n")
        ids = [s.worker for s in found.stragglers]
        import numpy as np

        plot_heatmap(found.times, np.asarray(ids), found.persistent, folder / "heatmap.png")
    if args.json:
        json.dump(payload, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        _print(found)
    return 0


def _print(found: Advice) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(file=sys.stdout, width=140, highlight=False)
    slow = [s for s in found.stragglers if s.verdict != "healthy"]
    iterations, trace_workers = found.times.shape
    console.print(
        f"{found.trace}: {trace_workers} trace workers, {iterations} iterations, advising for "
        f"N={found.workers} workers (--for {found.setup})"
    )
    console.print(
        f"trace rows used: iterations 0..{iterations - 1} of every trace worker "
        f"({iterations * trace_workers} worker-iterations, each the sum of its micro-batches)"
    )
    for s in slow or []:
        console.print(
            f"  worker {s.worker}: {s.verdict}, score {s.score:.2f}, {s.slowdown:.2f}x the "
            f"other workers' median time, slower in {s.slower_share:.0%} of iterations "
            f"(p={s.p_value:.2g})"
        )
    if not slow:
        console.print("  no straggler: every worker is healthy")
    c = found.cost
    # with T^c the three figures add up only if it is named: E[T] = mean + wait + T^c
    comm = f", T^c {c.comm_time:.4g} s of it" if c.comm_time > 0 else ""
    console.print(
        f"sync E[T] {c.iteration_time:.4g} s per step (the table's sync row{comm}) vs mean "
        f"worker time {c.mean_worker_time:.4g} s: {c.overhead:.4g} s per step "
        f"({c.overhead_share:.0%} of sync's time) waiting for the slowest"
    )
    table = Table(title_justify="left")
    headers = ("#", "strategy", "E[T] (s per update)", "speedup (x sync's gradients/s)",
               "simulated speedup (x)", "+- (x)", "method")  # fmt: skip
    for name in headers:
        table.add_column(name, justify="left" if name in ("strategy", "method") else "right")
    for i, r in enumerate(found.ranked, start=1):
        sim = "" if r.simulated is None else f"{r.simulated.effective_speedup:.3f}"
        spec = r.as_dict()["spec"]
        table.add_row(
            str(i),
            spec,
            f"{r.row.iteration_time:.4g}",
            f"{r.row.effective_speedup:.3f}",
            sim,
            f"{r.uncertainty:.3f}",
            r.row.method,
        )
    console.print(table)
    console.print(f"recommendation: {found.recommendation}", soft_wrap=True)
    console.print(found.reason, soft_wrap=True)
    if found.adopt is not None:
        console.print(f"to adopt it (--for {found.setup}):", soft_wrap=True)
        for line in found.adopt.lines():
            console.print(f"    {line}", soft_wrap=True, markup=False)
    for note in found.notes:
        console.print(f"note: {note}", soft_wrap=True)
