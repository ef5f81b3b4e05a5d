"""Replay fidelity: `simulate` replaying a `train` run's own trace against the run itself.

    nice -n 10 python bench/bench_replay.py            # human-readable lines
    nice -n 10 python bench/bench_replay.py --json     # one JSON object
    nice -n 10 python bench/bench_replay.py --quick    # one run per strategy, fewer rounds

For each strategy (``sync`` and ``dropcompute:drop-rate=0.1``) on ``seq-lstm`` with 4 ranks and
``--micro-batches 4`` (no injected delay), ``--repeats`` times: ``train --out DIR``, then
``simulate --task none --delay trace:path=DIR/trace.csv`` with the same flags and seed and no
``--comm-time``, so that the replay charges whatever the trace recorded beyond compute
(``trace.csv``'s ``noncompute`` column; a trace without it replays compute only).
``ratio`` is the simulated mean iteration time over the real one (goal within 3% of 1); the
bench reports each run's ratio and their median. It also checks that no time ``train``
exported in ``steps.jsonl`` is negative (``negative_times``, goal 0).

The two sides come from one ``train`` run and its replay, so the ratio is not a comparison
of two timings on a loaded machine; the real mean iteration time itself moves with the load.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

TASK = "seq-lstm"
WORKERS, MICRO_BATCHES, SEED = 4, 4, 0
STRATEGIES = ("sync", "dropcompute:drop-rate=0.1")
TIME_COLUMNS = ("rank_compute", "rank_injected", "rank_wait", "rank_comm", "rank_overhead")


def cli(*args: str) -> None:
    """One ``tailtrain`` command in a subprocess (this tree's PYTHONPATH), output dropped."""
    command = [sys.executable, "-m", "tailtrain", *args]
    subprocess.run(command, check=True, env=os.environ, capture_output=True)


def flags(strategy: str, iterations: int) -> list[str]:
    return [
        "--strategy", strategy, "--workers", str(WORKERS), "--micro-batches",
        str(MICRO_BATCHES), "--iterations", str(iterations), "--seed", str(SEED),
    ]  # fmt: skip


def negatives(folder: Path) -> int:
    """Negative entries among the times steps.jsonl exports."""
    count = 0
    for line in (folder / "steps.jsonl").read_text().splitlines():
        row = json.loads(line)
        for name in TIME_COLUMNS:
            count += sum(1 for v in row.get(name) or [] if v is not None and v < 0)
        count += sum(1 for name in ("comm_time", "compute_time") if (row.get(name) or 0) < 0)
    return count


def one(strategy: str, iterations: int, folder: Path) -> dict:
    real_dir, sim_dir = folder / "real", folder / "sim"
    cli("train", "--task", TASK, *flags(strategy, iterations), "--out", str(real_dir),
        "--no-progress", "--overwrite")  # fmt: skip
    trace = real_dir / "trace.csv"
    cli("simulate", "--task", "none", "--delay", f"trace:path={trace}",
        *flags(strategy, iterations), "--out", str(sim_dir), "--no-progress")  # fmt: skip
    real = json.loads((real_dir / "summary.json").read_text())
    sim = json.loads((sim_dir / "summary.json").read_text())
    header = trace.open().readline().strip()
    return {
        "real_mean_iteration_time": real["mean_iteration_time"],
        "sim_mean_iteration_time": sim["mean_iteration_time"],
        "ratio": sim["mean_iteration_time"] / real["mean_iteration_time"],
        "negative_times": negatives(real_dir),
        "trace_columns": header,
        "real_summary_times": {k: v for k, v in real.items() if k.startswith("mean_") and
                               k.endswith("_time")},
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--quick", action="store_true", help="1 run each, 60 rounds")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--iterations", type=int, default=150)
    args = parser.parse_args()
    repeats, iterations = (1, 60) if args.quick else (args.repeats, args.iterations)
    out: dict = {"cpus": os.cpu_count(), "task": TASK, "workers": WORKERS,
                 "micro_batches": MICRO_BATCHES, "iterations": iterations}  # fmt: skip
    for strategy in STRATEGIES:
        runs = []
        for _ in range(repeats):
            with tempfile.TemporaryDirectory() as folder:
                runs.append(one(strategy, iterations, Path(folder)))
            if not args.json:
                print(f"{strategy}: {runs[-1]}", flush=True)
        ratios = [r["ratio"] for r in runs]
        out[strategy] = {
            "median_ratio": float(np.median(ratios)),
            "ratios": ratios,
            "negative_times": sum(r["negative_times"] for r in runs),
            "runs": runs,
        }
        if not args.json:
            print(f"{strategy}: median sim/real {np.median(ratios):.4f} over {ratios}")
    if args.json:
        print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
