"""Parity of `tailtrain train` (parameter server, real processes) with `tailtrain simulate`.

For each strategy, the same flags and seed run once on real processes (injected delays) and
once in the simulator. Reported: the share of steps in which both chose the same k_t and the
same contributors (as a set of workers), and the mean iteration time of each (wall seconds
vs virtual seconds). Delays come from a trace whose values lie on a 20 ms grid and differ
within every iteration (a permutation of 8 values per iteration), so that arrival order is
not decided by jitter of a millisecond.

    python bench/bench_ps_parity.py [--workers 8] [--iterations 60] [--json]
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
from pathlib import Path

import numpy as np

from tailtrain.runtime.config import TrainConfig
from tailtrain.runtime.launch import Endpoint, launch, reserve
from tailtrain.sim.run import simulate
from tailtrain.sim.scenario import Scenario
from tailtrain.strategies.registry import parse_strategy

CASES = ["k-sync:k=6", "k-async:k=4", "dbw", "lgc:k=6,blocks=4"]
GRID = 0.02  # seconds between two delay values


def write_trace(path: Path, workers: int, rows: int, seed: int, stagger: float = 0.0) -> None:
    """Per iteration, a random permutation of ``workers`` values 2..workers+1 times GRID,
    plus ``stagger`` seconds times the worker's index (so that sums of delays, which decide
    arrival order once workers drift apart, do not tie)."""
    rng = np.random.default_rng(seed)
    with path.open("w") as fh:
        fh.write("iteration,worker,seconds\n")
        for i in range(rows):
            values = (2 + rng.permutation(workers)) * GRID + stagger * np.arange(workers)
            for w, v in enumerate(values):
                fh.write(f"{i},{w},{v:.3f}\n")


def agreement(real: list[dict], sim: list[dict]) -> tuple[float, float]:
    """Shares of steps with the same k_t, and with the same k_t and contributors."""
    steps = min(len(real), len(sim))
    same_k = sum(real[i]["k"] == sim[i]["k"] for i in range(steps))
    same = sum(
        real[i]["k"] == sim[i]["k"] and sorted(real[i]["workers"]) == sorted(sim[i]["workers"])
        for i in range(steps)
    )
    return same_k / steps, same / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--iterations", type=int, default=60)
    parser.add_argument("--task", default="digits-cnn")
    parser.add_argument("--strategies", default=",".join(CASES), help="';'-separated specs")
    parser.add_argument("--stagger", type=float, default=0.0, help="seconds x worker index")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    cases = args.strategies.split(";") if ";" in args.strategies else CASES
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "grid.csv"
        write_trace(trace, args.workers, 4 * args.iterations, 0, args.stagger)
        scenario = Scenario(
            task=args.task,
            workers=args.workers,
            delay=f"trace:path={trace}",
            iterations=args.iterations,
            eval_every=args.iterations,
        )
        configs = [
            TrainConfig(scenario=scenario, strategy=s, seed=0, inject=True, timeout=60)
            for s in cases
        ]
        results = launch(configs, reserve(Endpoint("127.0.0.1", 0)))[0]
        rows = []
        for spec, result in zip(cases, results, strict=True):
            sim = simulate(scenario, parse_strategy(spec), seed=0)
            same_k, same = agreement(result.record.steps, sim.steps)
            real_t = result.record.summary["mean_iteration_time"]
            sim_t = sim.summary["mean_iteration_time"]
            rows.append(
                {
                    "strategy": spec,
                    "same_k": same_k,
                    "same_k_and_contributors": same,
                    "mean_iteration_train_s": real_t,
                    "mean_iteration_simulate_s": sim_t,
                    "time_ratio": real_t / sim_t,
                    "ghosts": result.record.summary["ghosts"],
                }
            )
    machine = platform.processor() or platform.machine()
    report = {"machine": machine, "stagger": args.stagger, "cases": rows}
    if args.json:
        print(json.dumps(report, indent=2))
        return
    for r in rows:
        print(
            f"{r['strategy']:>20}: same k {r['same_k']:.1%}, same k and contributors "
            f"{r['same_k_and_contributors']:.1%}; mean iteration train "
            f"{r['mean_iteration_train_s'] * 1e3:.1f} ms vs simulate "
            f"{r['mean_iteration_simulate_s'] * 1e3:.1f} ms (x{r['time_ratio']:.3f})"
        )


if __name__ == "__main__":
    main()
