"""Chaos: N workers for some minutes of random stragglers, one kill and one freeze.

For each strategy, two runs of `tailtrain train` (the CLI, real processes), same flags, same
seed, each for ``--minutes`` of wall clock (``--time-budget``):

* calm: random stragglers only: ``--delay shifted-exp:shift=0.02,scale=0.02`` and
  ``--pattern subset:s=1,delay=0.2`` (at every iteration one worker, drawn from the seed, is
  200 ms slower; eager-SGD §7.2.1);
* chaos: the same, plus ``--inject-fault kill:worker=A,step=S`` and
  ``freeze:worker=B,step=T,seconds=X``, drawn from ``--seed``: A != B, S and T uniform in
  [10%, 60%] of the steps the calm run completed, X uniform in [5, 10] s (at most a tenth of
  the budget, so that the worker returns while the run goes on).

``k-async:k=6`` runs on a parameter server, which goes on without a dead worker and takes a
frozen one back (``runtime.ps.liveness``). ``eager:mode=majority`` cannot leave a killed
process out of its partial collective's allreduce, so its chaos run restarts the group:
``--max-restarts 1 --out DIR``. No periodic checkpoints: the survivors of the kill write one of
the last round they all completed (``runtime.keep``), and periodic writes would make rank 0 a
straggler (measured: NAP 3.6 -> 3.25 with ``--checkpoint-every 1``). It is skipped, saying
why, when ``train --help`` has no ``--max-restarts``.

Reported per strategy and run: steps completed, steps lost (for each failure of the group in
``failures.jsonl``: the round in flight minus the round its checkpoint holds, i.e. completed
rounds played again; the goal is 0 beyond the one in flight), rows of a step written twice
(``steps.jsonl`` of a resumed run is cut back to its checkpoint, so 0), the final loss and
evaluation, the chaos run's final loss over the calm run's, the dead and hung workers, wall
seconds and exit status.

    python bench/chaos.py [--minutes 5] [--workers 8] [--json] [--only k-async|eager]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
STRATEGIES = {"k-async": "k-async:k=6", "eager": "eager:mode=majority"}
DELAY = ["--delay", "shifted-exp:shift=0.02,scale=0.02", "--pattern", "subset:s=1,delay=0.2"]
#: the share of the calm run's steps within which the kill and the freeze fall
WINDOW = (0.1, 0.6)
FREEZE = (5.0, 10.0)


def tailtrain(*args: str, timeout: float) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    return subprocess.run(
        [sys.executable, "-m", "tailtrain", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def has_restarts() -> bool:
    """Whether this `train` takes --max-restarts (checkpoints and restarts of the group)."""
    return "--max-restarts" in tailtrain("train", "--help", timeout=120).stdout


def run(strategy: str, out: Path, args: argparse.Namespace, extra: list[str]) -> dict[str, Any]:
    """One `train` run for ``--minutes``; what it reports, read from its run folder."""
    budget = 60 * args.minutes
    flags = ["train", "--workers", str(args.workers), "--task", args.task]
    flags += ["--strategy", strategy, "--time-budget", f"{budget:g}", *DELAY]
    flags += ["--seed", str(args.seed), "--timeout", str(args.timeout), "--out", str(out)]
    flags += ["--json", *extra]
    began = time.perf_counter()
    done = tailtrain(*flags, timeout=3 * budget + 300)
    wall = time.perf_counter() - began
    steps_file = out / "steps.jsonl"
    lines = steps_file.read_text().splitlines() if steps_file.exists() else []
    rows = [json.loads(line) for line in lines]
    counts = Counter(int(r["step"]) for r in rows)
    summary: dict[str, Any] = {}
    if done.returncode == 0:
        summary = json.loads(done.stdout)
    elif (out / "summary.json").exists():
        summary = json.loads((out / "summary.json").read_text())
    failures = out / "failures.jsonl"
    lines = failures.read_text().splitlines() if failures.exists() else []
    notes = [json.loads(line) for line in lines]
    return {
        "status": done.returncode,
        "wall": wall,
        "steps": len(counts),
        "steps_lost": sum(int(n["step"]) - int(n["checkpoint"] or 0) for n in notes),
        "duplicate_rows": sum(c - 1 for c in counts.values()),
        "failures": notes,
        "final_loss": summary.get("final_loss"),
        "final_eval": summary.get("final_eval"),
        "dead_workers": summary.get("dead_workers"),
        "hung_workers": summary.get("hung_workers"),
        "restarts": len(notes),  # each failure the survivors recorded restarted the group
        "error": done.stderr.strip().splitlines()[-1] if done.returncode else None,
        "log": [line for line in done.stderr.splitlines() if "worker" in line or "rank" in line],
    }


def faults(steps: int, workers: int, budget: float, rng: np.random.Generator) -> list[str]:
    """One kill and one freeze at random steps of the calm run's span (module docstring)."""
    low, high = max(1, int(WINDOW[0] * steps)), max(2, int(WINDOW[1] * steps))
    kill, freeze = rng.integers(low, high, size=2)
    a, b = rng.choice(workers, size=2, replace=False)
    seconds = min(rng.uniform(*FREEZE), budget / 10)
    return [
        *("--inject-fault", f"kill:worker={a},step={kill}"),
        *("--inject-fault", f"freeze:worker={b},step={freeze},seconds={seconds:.2f}"),
    ]


def chaos(name: str, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    strategy = STRATEGIES[name]
    extra: list[str] = []
    if name == "eager":
        if not has_restarts():
            return {
                "strategy": strategy,
                "skipped": "`train --help` has no --max-restarts: a killed process cannot be "
                "left out of eager's allreduce, and this train cannot restart the group",
            }
        extra = ["--max-restarts", "1"]  # the survivors checkpoint the last completed round
    rng = np.random.default_rng(args.seed)
    calm = run(strategy, tmp / f"{name}-calm", args, [])
    drills = faults(max(calm["steps"], 2), args.workers, 60 * args.minutes, rng)
    hit = run(strategy, tmp / f"{name}-chaos", args, [*extra, *drills])
    ratio = None
    if calm["final_loss"] and hit["final_loss"] is not None:
        ratio = hit["final_loss"] / calm["final_loss"]
    return {
        "strategy": strategy,
        "faults": drills[1::2],
        "calm": calm,
        "chaos": hit,
        "ratio": ratio,
    }


def show(report: dict[str, Any]) -> None:
    print(
        f"chaos: {report['workers']} workers, {report['minutes']:g} min per run, "
        f"seed {report['seed']}, task {report['task']}"
    )
    for entry in report["results"]:
        print(f"\n{entry['strategy']}")
        if "skipped" in entry:
            print(f"  skipped: {entry['skipped']}")
            continue
        print(f"  faults: {', '.join(entry['faults'])}")
        for kind in ("calm", "chaos"):
            r = entry[kind]
            loss = "-" if r["final_loss"] is None else f"{r['final_loss']:.4f}"
            evaluation = "-" if r["final_eval"] is None else f"{r['final_eval']:.4f}"
            print(
                f"  {kind:5}  exit {r['status']}  steps {r['steps']:6d}  lost {r['steps_lost']}  "
                f"final loss {loss}  eval {evaluation}  dead {r['dead_workers']}  "
                f"hung {r['hung_workers']}  wall {r['wall']:.1f}s"
            )
            if r["error"]:
                print(f"         {r['error']}")
            for note in r["failures"]:
                print(
                    f"         failure: round {note['step']} in flight, ranks {note['missing']} "
                    f"missing, checkpoint after {note['checkpoint']} rounds"
                )
        if entry["ratio"] is not None and math.isfinite(entry["ratio"]):
            print(f"  final loss, chaos / calm: {entry['ratio']:.3f}")
        for line in entry["chaos"]["log"]:
            print(f"  | {line}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=5.0, help="wall clock of each run")
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--task", default="logreg")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=60.0, help="train's --timeout")
    parser.add_argument("--only", choices=sorted(STRATEGIES), default=None)
    parser.add_argument("--out", type=Path, default=None, help="keep the run folders here")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    names = [args.only] if args.only else list(STRATEGIES)
    with tempfile.TemporaryDirectory(prefix="chaos-") as scratch:
        tmp = args.out or Path(scratch)
        tmp.mkdir(parents=True, exist_ok=True)
        results = [chaos(name, args, tmp) for name in names]
    report = {
        "minutes": args.minutes,
        "workers": args.workers,
        "seed": args.seed,
        "task": args.task,
        "results": results,
    }
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        show(report)


if __name__ == "__main__":
    main()
