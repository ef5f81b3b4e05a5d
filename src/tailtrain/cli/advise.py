"""`tailtrain advise`: who is slow in a trace, what it costs, and which strategy to run."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from tailtrain.cli.scenario_args import seed_value
from tailtrain.errors import UsageError

if TYPE_CHECKING:  # the advice pulls in numpy, scipy and the theory: only when advise runs
    from tailtrain.advice import Advice

#: the trace's columns for the help, written out: ``delays.trace.TRACE_FORMAT``'s (the parser
#: imports no numpy or scipy; tests/cli/test_cli_imports.py checks they stay the same)
_TRACE_FORMAT = "iteration,worker[,micro_batch][,censored],seconds[,noncompute][,samples][,run]"
#: --for's jobs, written out: ``advice.adopt.SETUPS``' (the same test holds them together)
_SETUPS = ("ddp", "loop", "lightning", "hf", "fsdp", "tailtrain-train", "any")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "advise",
        help="score the workers of a trace, cost the stragglers and recommend a strategy",
        description=(
            f"Reads a trace ({_TRACE_FORMAT}), scores every worker "
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
    p.add_argument(
        "--micro-batches",
        type=int,
        default=None,
        metavar="M",
        help="micro-batches per step to advise for (a per-step trace is split in M: each "
        "step as M i.i.d. Gamma parts given its recorded total)",
    )
    p.add_argument(
        "--for",
        dest="setup",
        choices=_SETUPS,
        default="any",
        help="the job to advise: a DDP job (the comm hook), an own loop (StragglerStep), a "
        "Lightning Trainer (StragglerStrategy), a transformers Trainer (ranked as a DDP job; "
        "rebalance as RebalancedTrainer, other remedies' lines for a loop you own), an FSDP2 "
        "job across replica groups (ShardedStep), tailtrain train (every strategy) or any "
        "(default: %(default)s)",
    )
    p.add_argument(
        "--comm-time",
        default=None,
        metavar="SECONDS|SPEC",
        help="communication time T^c per update, seconds or a delay spec (default: the "
        "rounds' noncompute seconds the trace recorded, as `train` writes them, else 0)",
    )
    p.add_argument(
        "--group-size",
        type=int,
        default=1,
        metavar="G",
        help="read the trace's ranks as replica groups of G (a hybrid-sharded job: G "
        "consecutive ranks in id order per group): a group's unit is the max over its ranks "
        "plus --group-cost, and every verdict, figure and row is of the groups, --workers "
        "counting groups (default: 1)",
    )
    p.add_argument(
        "--group-cost",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="exposed within-group collectives per group unit (default: 0)",
    )
    p.add_argument("--seed", type=seed_value, default=0)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument(
        "--patch",
        type=Path,
        default=None,
        metavar="SCRIPT",
        help="print the recommendation's change to SCRIPT as a unified diff (--for ddp)",
    )
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
    from tailtrain.cli.predict import _finite

    if (args.source is None) == (args.trace is None):
        raise UsageError(
            "advise reads one trace: give a trace file or a probe's folder (advise DIR), "
            "or --trace FILE"
        )
    if args.patch is not None:
        script = _read_script(args.patch, args.setup)
    found = advise(
        args.source or args.trace,
        workers=args.workers,
        micro_batches=args.micro_batches,
        seed=args.seed,
        setup=args.setup,
        comm_time=args.comm_time,
        group_size=args.group_size,
        group_cost=args.group_cost,
    )
    if args.patch is not None:
        sys.stdout.write(_diff(found, script, args.patch))
        return 0
    payload = _finite(found.to_json())
    if args.out is not None:
        import numpy as np

        from tailtrain.advice.heatmap import plot_heatmap
        from tailtrain.core.records import prepare_folder

        folder = prepare_folder(args.out)
        (folder / "advice.json").write_text(json.dumps(payload, indent=2) + "\n")
        ids = [s.worker for s in found.stragglers]
        plot_heatmap(found.times, np.asarray(ids), found.persistent, folder / "heatmap.png")
    if args.json:
        json.dump(payload, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        _print(found, args.group_size)
    return 0


def _read_script(path: Path, setup: str) -> str:
    if setup != "ddp":
        raise UsageError(f"--patch edits a DDP script: give --for ddp (not --for {setup})")
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError) as err:
        reason = getattr(err, "strerror", None) or str(err)
        raise UsageError(f"cannot read script {str(path)!r}: {reason}") from None


def _diff(found: Advice, script: str, path: Path) -> str:
    """The recommendation's edits applied to ``script``, as a unified diff (empty: sync,
    nothing to change); one line where the recommendation's lines have no edits."""
    from tailtrain.advice.patch import apply_edits, unified_diff

    edits = [] if found.adopt is None else found.adopt.edits()
    if not edits and found.choice.row.strategy != "sync":
        raise UsageError(
            f"--patch has no edits for {found.recommendation} at the trace's micro-batches "
            "(its edits are for a loop of one batch per step): adopt the printed lines by hand"
        )
    return unified_diff(script, apply_edits(script, edits), _diff_name(path))


def _diff_name(path: Path) -> str:
    """The script's path as ``patch -p1`` run here finds it: relative to the working
    directory where it lies under it (``examples/probe_ddp.py``, not ``probe_ddp.py``), else
    its name."""
    try:
        return path.resolve().relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return path.name


def _print(found: Advice, group_size: int = 1) -> None:
    """The advice as text; ``group_size`` > 1: the trace's workers are replica groups of that
    many ranks (``--group-size``), and the job's line says so."""
    from rich.console import Console
    from rich.table import Table

    from tailtrain.advice.units import TIME_TO_TARGET

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
    unit = found.unit
    if found.job is not None:
        job = found.job
        who = "rank" if group_size == 1 else "replica group"
        batch = (
            f"no samples column: figures per step (a {who}'s gradient), not per sample"
            if job.samples is None
            else f"samples per {who} per step {job.samples.tolist()}"
        )
        rate = "" if found.measured is None else f"; measured {found.measured:.4g} {unit}/s"
        workers = f"{job.workers} ranks"
        if group_size > 1:
            workers = f"{job.workers} replica groups of {group_size} ranks"
        under = "" if job.remedy is None else f" under {job.remedy}"
        per_step = f"{job.micro_batches} micro-batch(es) per step"
        if job.accumulation > 1:
            per_step = f"{job.accumulation} loader batches accumulated per step (no_sync)"
        console.print(f"job: {workers}, {per_step}{under}, {batch}{rate}")
    _print_runs(console, found)
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
    sync = next((r for r in found.ranked if r.row.strategy == "sync"), None)
    source = "the table's sync row"
    if sync is not None and sync.simulated is not None:  # the table shows the simulated E[T]
        source = (
            f"the trace replayed; simulated, the table's sync row reads {sync.iteration_time:.4g}"
        )
    console.print(
        f"sync E[T] {c.iteration_time:.4g} s per step ({source}{comm}) vs mean "
        f"worker time {c.mean_worker_time:.4g} s: {c.overhead:.4g} s per step "
        f"({c.overhead_share:.0%} of sync's time) waiting for the slowest"
    )
    applied = "samples" if unit == "samples" else "gradients"
    table = Table(title_justify="left")
    headers = (
        "#",
        "strategy",
        "needs",
        f"{applied}/s (x the job)",
        f"{applied}/s",
        "dropped",
        "time to target (x)",
        "+- (x)",
        "E[T] (s per update)",
        "method",
    )
    for name in headers:
        left = name in ("strategy", "needs", "method")
        table.add_column(name, justify="left" if left else "right")
    for i, r in enumerate(found.ranked, start=1):
        u = found.units(r)
        needs = "" if r.micro_batches is None else f"M={r.micro_batches}"
        needs = needs if r.shares is None else "shares " + "/".join(map(str, r.shares))
        table.add_row(
            str(i),
            r.as_dict()["spec"],
            needs,
            f"{u.ratio:.3f}",
            "" if u.per_second is None else f"{u.per_second:.4g}",
            f"{u.drop_rate:.0%}",
            "" if u.time_to_target is None else f"{u.time_to_target:.3f}",
            f"{r.uncertainty:.3f}",
            f"{r.iteration_time:.4g}",
            (r.simulated or r.row).method,
        )
    console.print(table)
    if (excluded := found.exclusion) is not None:
        absolute = excluded[f"{unit}_applied_per_second"]
        also = "" if absolute is None else f", {absolute:.4g} {unit}/s"
        console.print(
            f"without worker(s) {excluded['excluded']}: the other ranks alone apply "
            f"{excluded[f'{unit}_applied_ratio']:.3f}x the {applied} per second of the job as "
            f"measured{also} ({excluded['iteration_time']:.4g} s per step); replaced by ranks at "
            f"the others' pace, about {excluded['replaced_ratio']:.3f}x",
            soft_wrap=True,
        )
    kept = found.job.dealt if found.job is not None else None
    kept = None if found.setup == "tailtrain-train" else kept  # its sync is train's, not the job
    as_it_runs = (
        ""
        if kept is None or found.recommendation != "sync"
        else (f" (the job as it runs: its shares {list(kept)} kept)")
    )
    console.print(f"recommendation: {found.recommendation}{as_it_runs}", soft_wrap=True)
    console.print(found.reason, soft_wrap=True)
    if found.adopt is not None:
        console.print(f"to adopt it (--for {found.setup}):", soft_wrap=True)
        for line in found.adopt.lines():
            console.print(f"    {line}", soft_wrap=True, markup=False)
    console.print(f"note: {TIME_TO_TARGET}", soft_wrap=True)
    for note in found.notes:
        console.print(f"note: {note}", soft_wrap=True)


def _print_runs(console, found: Advice) -> None:
    """Before and after: every run of the file against the last, as measured."""
    report = found.before_after()
    if report is None:
        return
    unit = found.unit
    last = found.runs[-1]
    for r in found.runs:
        slow = ", ".join(f"{s.worker} {s.verdict}" for s in r.verdicts if s.verdict != "healthy")
        over = report["last_over"].get(str(r.run))
        gain = "" if over is None else f"; the last run applies {over:.3f}x this"
        dealt = "" if r.samples is None else f", samples per rank per step {list(r.samples)}"
        console.print(
            f"run {r.run}: {r.rate:.4g} {unit}/s measured over {r.steps} steps "
            f"({r.step_time:.4g} s per step{dealt}); not healthy: {slow or 'none'}{gain}",
            soft_wrap=True,
        )
    console.print(f"advising on the last run ({last.run})")
