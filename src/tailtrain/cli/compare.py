"""`tailtrain compare`: several strategies on the same delay paths, over several seeds."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from tailtrain.cli.progress import console, step_progress
from tailtrain.cli.scenario_args import (
    add_group_arguments,
    add_scenario_arguments,
    scenario_from_args,
    seed_value,
)
from tailtrain.errors import UsageError

if TYPE_CHECKING:
    from rich.table import Table

    from tailtrain.sim.compare import Comparison


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "compare",
        help="compare strategies on the same sampled delays (common random numbers)",
        description="Run every strategy on every seed; print mean and spread; plot and save.",
    )
    p.add_argument(
        "--strategies",
        default="sync,k-sync:k=8,k-sync:k=12,b-dbw,dbw",
        help="comma-separated strategy specs (default: %(default)s)",
    )
    add_scenario_arguments(p)
    add_group_arguments(p)
    p.add_argument("--seeds", default="0,1,2", help="comma-separated seeds (default: 0,1,2)")
    p.add_argument(
        "--out",
        type=Path,
        default=Path("runs/compare"),
        help="folder for the plot, summary and run records (default: %(default)s)",
    )
    p.add_argument("--overwrite", action="store_true", help="replace the comparison --out holds")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    p.set_defaults(run=run)


#: what a comparison writes in --out; a folder holding any of them is not written over
COMPARE_FILES = ("summary.json", "compare.png", "runs")


def parse_seeds(text: str) -> list[int]:
    try:
        seeds = [seed_value(s) for s in text.split(",") if s.strip()]
    except argparse.ArgumentTypeError as exc:
        raise UsageError(f"--seeds {text!r}: {exc}; give e.g. 0,1,2") from None
    if not seeds:
        raise UsageError("--seeds is empty; give e.g. 0,1,2")
    again = sorted({s for s in seeds if seeds.count(s) > 1})
    if again:
        raise UsageError(f"--seeds {text!r} gives seed {again[0]} twice; each seed runs once")
    return seeds


def run(args: argparse.Namespace) -> int:
    from tailtrain.core.records import claim_folder, clean, clear_run, write_json
    from tailtrain.delays.trace import comm_note
    from tailtrain.plots import plot_comparison
    from tailtrain.sim.compare import CompareInterrupted, compare
    from tailtrain.strategies.registry import parse_strategies

    # as simulate (cli.run_folder.prepare_run): a trace's recorded noncompute seconds are its
    # T^c unless --comm-time is given, so both price the same trace's sync alike
    scenario = scenario_from_args(args).with_replayed_comm()
    strategies = parse_strategies(args.strategies)
    if not strategies:
        raise UsageError("--strategies is empty; give e.g. sync,k-sync:k=8")
    seeds = parse_seeds(args.seeds)
    out = claim_folder(args.out, COMPARE_FILES, overwrite=args.overwrite, resume_hint=False)
    kept: list[tuple[str, int]] = []

    def keep(name: str, seed: int, record) -> None:
        """Write each run as it finishes; the first one clears what --overwrite replaces."""
        if not kept:
            clear_run(out, COMPARE_FILES)
        record.write(out / "runs" / safe_name(name) / f"seed-{seed}")
        kept.append((name, seed))

    label = f"{len(strategies)} strategies x {len(seeds)} seeds"
    runs = len(strategies) * len(seeds)
    try:
        with step_progress(scenario, label, not args.no_progress, runs) as for_run:
            counter = iter(range(runs))
            on_run = (lambda _name, _seed: for_run(next(counter))) if for_run else None
            result = compare(scenario, strategies, seeds, on_run, keep)
    except CompareInterrupted as exc:
        if not kept:
            clear_run(out, COMPARE_FILES)
        partial = {
            "scenario": vars(scenario),
            "seeds": seeds,
            "results": exc.comparison.rows(),
            "plot": None,
            "partial": True,
            "finished_runs": [{"strategy": name, "seed": seed} for name, seed in kept],
            "interrupted": {"strategy": exc.strategy, "seed": exc.seed},
        }
        write_json(out / "summary.json", partial)
        print(
            f"tailtrain compare: interrupted during {exc.strategy} seed {exc.seed}; "
            f"{len(kept)} finished run(s) and a partial summary are in {out}",
            file=sys.stderr,
        )
        return 130
    rows = result.rows()
    plot = plot_comparison(result, out / "compare.png")
    summary = {"scenario": vars(scenario), "seeds": seeds, "results": rows, "plot": str(plot)}
    write_json(out / "summary.json", summary)
    if args.json:
        print(json.dumps(clean(summary), indent=2))
    else:
        print_table(rows, scenario.target_loss, eval_metric(result))
        print(f"plot: {plot}\nsummary: {out / 'summary.json'}")
    if (note := comm_note(scenario.delay, scenario.comm_time)) is not None:
        print(note, file=sys.stderr if args.json else sys.stdout)
    return 0


def eval_metric(result: Comparison) -> str | None:
    """What the runs' "final_eval" measures (``accuracy``, ``mse``, ``none``)."""
    return next((r.summary.get("eval_metric") for rs in result.runs.values() for r in rs), None)


def safe_name(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


#: characters per line of a strategy spec wrapped for a narrow terminal
NAME_WIDTH = 16
#: what ``summary["eval_metric"]`` measures, as a column header
METRIC_NAMES = {"accuracy": "final test accuracy", "mse": "final test MSE"}


def fmt(row: dict, key: str, sep: str = " ± ") -> str:
    mean, std = row.get(key), row.get(f"{key}_std")
    if mean is None:
        return "-"
    return f"{mean:.4g}" if std is None else f"{mean:.4g}{sep}{std:.2g}"


def print_table(rows: list[dict], target: float | None, metric: str | None = None) -> None:
    """Mean ± std over seeds, one line per strategy when the terminal is wide enough; else the
    spread goes below the mean and a long strategy spec wraps after its commas."""
    from rich.measure import Measurement

    out = console()
    table = results_table(rows, target, metric, narrow=False)
    if Measurement.get(out, out.options.update(max_width=10**4), table).maximum > out.width:
        table = results_table(rows, target, metric, narrow=True)
    out.print(table)


def results_table(
    rows: list[dict], target: float | None, metric: str | None, narrow: bool
) -> Table:
    from rich.table import Table

    from tailtrain.plots import wrap_spec

    sep = "\n± " if narrow else " ± "
    seeds = max((row["seeds"] for row in rows), default=0)
    table = Table(
        title=f"tailtrain compare: mean ± std over {seeds} seed{'s' * (seeds != 1)}",
        caption="Times are virtual seconds of the simulated clock."
        + (
            " (r/n): seeds that reached the target; time averaged over those."
            if target is not None
            else ""
        ),
    )
    names = [wrap_spec(row["strategy"], NAME_WIDTH if narrow else 10**6) for row in rows]
    table.add_column("strategy", no_wrap=True)
    headers = (
        *([f"time to train loss {target:g} (s)"] if target is not None else []),
        "final train loss",
        METRIC_NAMES.get(metric or "", "final eval"),
        "mean k",
        "iteration time (s)",
    )
    for header in headers:
        table.add_column(header, overflow="fold")
    for row, name in zip(rows, names, strict=True):
        reached = f"({row['reached_target']}/{row['seeds']})"
        to_target = [f"{fmt(row, 'time_to_target', sep)}{sep[0]}{reached}"]
        table.add_row(
            "\n".join(name),
            *(to_target if target is not None else []),
            fmt(row, "final_loss", sep),
            fmt(row, "final_eval", sep),
            fmt(row, "mean_k", sep),
            fmt(row, "mean_iteration_time", sep),
        )
    return table
