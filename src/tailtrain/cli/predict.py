"""`tailtrain predict`: expected iteration time and throughput of every strategy, from theory."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from typing import TYPE_CHECKING, Any

from tailtrain.cli.scenario_args import add_group_arguments, seed_value
from tailtrain.errors import UsageError

if TYPE_CHECKING:  # the theory pulls in numpy and scipy: import it only when predict runs
    from tailtrain.delays import DelayModel
    from tailtrain.prediction import Prediction, Row

# the help's figures, written out: the parser imports neither the theory nor the simulator
# (tests/cli/test_cli_imports.py checks they stay prediction.scenario's and .families')
#: scenarios with at most this many workers get one row per K (``prediction.ALL_K_UP_TO``)
_ALL_K_UP_TO = 32
#: predict's timing-only simulation up to this many workers (``prediction.families``)
_SIM_MAX_WORKERS = 1024


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "predict",
        help="predict iteration time and speedup of every strategy (no training)",
        description=(
            "Expected iteration time, speedup over sync and effective speedup (samples per "
            "second relative to sync) of sync, K-sync, K-batch-sync, K-async, K-batch-async, "
            "async, DropCompute, Local-SGD, eager-SGD's partial collectives and DBW, each with "
            "the method that produced it: exact, numerical integration, seeded Monte Carlo or "
            f"a seeded timing-only simulation (up to N={_SIM_MAX_WORKERS})."
        ),
    )
    p.add_argument("--workers", type=int, required=True, metavar="N", help="number of workers N")
    p.add_argument(
        "--delay",
        required=True,
        metavar="SPEC",
        help="compute time of one gradient (of one micro-batch with --micro-batches), "
        "e.g. exp:rate=1 or const:value=0.5+dropcompute-noise:scale=0.5",
    )
    p.add_argument(
        "--pattern",
        default=None,
        metavar="P",
        help="worker pattern, e.g. subset:s=2,delay=1 "
        "(default: iid; any other pattern is predicted by Monte Carlo, except heterogeneous "
        "above 2048 workers: from its speeds' law)",
    )
    p.add_argument(
        "--micro-batches",
        type=int,
        default=None,
        metavar="M",
        help="micro-batches per worker per iteration; --delay is then per micro-batch",
    )
    p.add_argument(
        "--comm-time",
        default=None,
        metavar="SECONDS|SPEC",
        help="communication time T^c: per job (pull, compute, push) for the parameter-server "
        "families, once per update for DropCompute; seconds or a delay spec (default: 0, or "
        "with --delay trace:path=FILE the rounds' noncompute seconds FILE recorded)",
    )
    p.add_argument(
        "--k",
        default=None,
        metavar="LIST",
        help=f"K values to list, e.g. 1,4,16 or 'all' (default: every K for N <= {_ALL_K_UP_TO}, "
        "else a grid of 1, 2, 4, the eighths of N, N-1 and N)",
    )
    p.add_argument(
        "--samples",
        type=int,
        default=2000,
        help="Monte Carlo iterations where no exact method exists (default: %(default)s)",
    )
    p.add_argument(
        "--seed", type=seed_value, default=0, help="Monte Carlo seed (default: %(default)s)"
    )
    add_group_arguments(p)
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from tailtrain.core.capacity import check_memory
    from tailtrain.delays import parse_delay, parse_pattern
    from tailtrain.delays.groups import check_grouping
    from tailtrain.delays.trace import comm_note, replayed_comm
    from tailtrain.prediction import DelayScenario, k_grid, predict
    from tailtrain.prediction.families import with_families

    if args.workers >= 1:  # replica groups: the one-line refusal before any work
        check_grouping(args.workers, args.group_size, args.group_cost)
    if args.workers >= 1:  # arrays of one number per K (predict checks its Monte Carlo draws)
        check_memory(64 * args.workers, f"--workers {args.workers}", "per-K arrays")
    # a trace that recorded its rounds' noncompute seconds replays them unless told otherwise
    comm = replayed_comm(args.delay, args.comm_time)
    scenario = DelayScenario(
        workers=args.workers,
        delay=parse_delay(args.delay),
        pattern=None if args.pattern is None else parse_pattern(args.pattern),
        micro_batches=args.micro_batches,
        comm=parse_comm(comm or "0"),
        ks=parse_ks(args.k, args.workers // max(1, args.group_size)),
        samples=args.samples,
        seed=args.seed,
        group_size=args.group_size,
        group_cost=args.group_cost,
    )
    prediction = with_families(predict(scenario))
    if (note := comm_note(args.delay, comm)) is not None:
        prediction = dataclasses.replace(prediction, notes=(*prediction.notes, note))
    if args.json:
        ks = scenario.ks or k_grid(scenario.groups)
        json.dump(_finite(prediction.to_json(ks)), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        _print_table(prediction, scenario.ks or k_grid(scenario.groups, compact=True))
    return 0


def parse_comm(text: str) -> float | DelayModel:
    """``--comm-time``: a number of seconds (kept as a float), or a delay spec."""
    from tailtrain.delays.comm import parse_comm_time

    model = parse_comm_time(text)
    return model.mean if model.var == 0 else model


def parse_ks(text: str | None, workers: int) -> tuple[int, ...] | None:
    """``--k``: ``all`` or comma-separated integers in 1..N."""
    if workers < 1:
        raise UsageError(f"--workers must be >= 1, got {workers}")
    if text is None:
        return None
    if text.strip() == "all":
        return tuple(range(1, max(workers, 1) + 1))
    try:
        ks = tuple(sorted({int(part) for part in text.split(",")}))
    except ValueError:
        raise UsageError(f"--k {text!r}: give comma-separated integers or 'all'") from None
    for k in ks:
        if not 1 <= k <= workers:
            raise UsageError(f"--k {k} is out of range: K must lie in 1..N={workers}")
    return ks


def _print_table(prediction: Prediction, ks: list[int]) -> None:
    from rich.console import Console
    from rich.table import Table

    s = prediction.scenario.describe()
    title = (
        f"N={s['workers']}{_groups(s)}  delay={s['delay']}  pattern={s['pattern']}  "
        f"M={s['micro_batches'] or '-'}  T^c={s['comm_time']}"
    )
    table = Table(title=title, title_justify="left")
    for name in (
        "strategy",
        "K",
        "tau (s)",
        "drop",
        "E[T] (s)",
        "vs sync",
        "effective",
        "best",
        "method",
    ):
        table.add_column(name, justify="left" if name in ("strategy", "method") else "right")
    for row in prediction.shown(ks):
        table.add_row(*_cells(row))
    console = Console(file=sys.stdout, width=140, highlight=False)
    console.print(table)
    for note in (f"* {prediction.criterion}", *prediction.notes):
        console.print(note, soft_wrap=True)


def _groups(described: dict[str, Any]) -> str:
    """The title's replica groups (K counts groups then), if any."""
    size = described.get("group_size")
    if size is None:
        return ""
    groups = described["workers"] // size
    return f" ranks in {groups} groups of G={size} (+{described['group_cost']:g} s), K of groups"


def _cells(row: Row) -> list[str]:
    time = f"{row.iteration_time:.4g}"
    if row.iteration_time_stderr > 0:
        time += f" ± {row.iteration_time_stderr:.2g}"
    dc = row.strategy == "dropcompute"
    return [
        row.spec or row.strategy,
        str(row.k),
        f"{row.threshold:.4g}" if dc else "",
        f"{row.drop_rate:.1%}" if dc else "",
        time,
        f"{row.speedup_vs_sync:.3f}",
        f"{row.effective_speedup:.3f}",
        "*" if row.best else "",
        row.method,
    ]


def _finite(value: Any) -> Any:
    """JSON has no NaN or infinity: they become null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_finite(item) for item in value]
    return value
