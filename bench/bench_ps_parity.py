"""Parity of `tailtrain train` (parameter server, real processes) with `tailtrain simulate`.

For each strategy, the same flags and seed run once on real processes (injected delays) and
once in the simulator. Reported: the share of steps in which both chose the same k_t and the
same contributors (as a set of workers), and the mean iteration time of each (wall seconds
vs virtual seconds).

Delays: worker w's every round trip lasts ``DELAYS_MS[w]`` (a ``trace:`` file), values at
least 20 ms apart. Arrival times are sums of delays (a job starts at a close, which is another
job's finish), so values on a common grid tie: under K-async, 40 + 100 = 60 + 80 ms, and a
tie within the real run's jitter (1-3 ms a job, stalls of 20 ms on a loaded machine) flips,
and every later step follows. These values were searched for the widest gap between the k-th
and the (k+1)-th arrival of K-async's (k = 4) schedule, which with constant delays is
periodic from the start: at least 21 ms in every step, and the same schedule with up to 4 ms
more per job. Sync-family rules (k-sync, DBW, LGC) restart everyone at each close, so their
arrivals are the delays themselves, >= 20 ms apart.

``same_when_replayed`` simulates again with the round trips the server measured (the injected
delay for jobs it never heard of): a rule or protocol difference between the two would still
diverge there, jitter would not.

    python bench/bench_ps_parity.py [--iterations 60] [--task digits-cnn] [--json]
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np

from tailtrain.core.scenario import Scenario
from tailtrain.runtime.config import TrainConfig
from tailtrain.runtime.launching.endpoint import Endpoint, reserve
from tailtrain.runtime.launching.launch import launch
from tailtrain.sim.run import simulate
from tailtrain.strategies.registry import parse_strategy

CASES = ["k-sync:k=6", "k-async:k=4", "dbw", "lgc:k=6,blocks=4"]
#: per-worker round trips (ms) for 8 workers, chosen as the module docstring says
DELAYS_MS = (107, 149, 211, 237, 272, 308, 346, 372)


def write_trace(path: Path, seconds: np.ndarray) -> None:
    """A ``trace:`` file with row i of ``seconds`` (jobs, workers) as iteration i."""
    with path.open("w") as fh:
        fh.write("iteration,worker,seconds\n")
        for i, row in enumerate(seconds):
            for w, v in enumerate(row):
                fh.write(f"{i},{w},{v:.6f}\n")


def agreement(real: list[dict], sim: list[dict]) -> tuple[float, float]:
    """Shares of steps with the same k_t, and with the same k_t and contributors."""
    steps = min(len(real), len(sim))
    same_k = sum(real[i]["k"] == sim[i]["k"] for i in range(steps))
    same = sum(
        real[i]["k"] == sim[i]["k"] and sorted(real[i]["workers"]) == sorted(sim[i]["workers"])
        for i in range(steps)
    )
    return same_k / steps, same / steps


def measured(injected: np.ndarray, rows: list[dict]) -> np.ndarray:
    """``injected`` with every job the server heard of replaced by its measured round trip."""
    seconds = injected.copy()
    for row in rows:
        for w, job, _, start, finish in row["arrived"]:
            seconds[job, w] = finish - start
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=60)
    parser.add_argument("--task", default="digits-cnn")
    parser.add_argument("--strategies", default=";".join(CASES), help="';'-separated specs")
    parser.add_argument(
        "--delays", default=",".join(map(str, DELAYS_MS)), help="ms per worker, comma-separated"
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    cases = args.strategies.split(";")
    delays = np.array([float(v) for v in args.delays.split(",")]) / 1e3
    injected = np.tile(delays, (4 * args.iterations + 8, 1))
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "delays.csv"
        write_trace(trace, injected)
        scenario = Scenario(
            task=args.task,
            workers=delays.size,
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
        for i, (spec, result) in enumerate(zip(cases, results, strict=True)):
            real = result.record.steps
            sim = simulate(scenario, parse_strategy(spec), seed=0)
            same_k, same = agreement(real, sim.steps)
            replayed = Path(tmp) / f"measured-{i}.csv"
            write_trace(replayed, measured(injected, real))
            again = replace(scenario, delay=f"trace:path={replayed}")
            _, same_replayed = agreement(real, simulate(again, parse_strategy(spec), 0).steps)
            real_t = result.record.summary["mean_iteration_time"]
            sim_t = sim.summary["mean_iteration_time"]
            rows.append(
                {
                    "strategy": spec,
                    "same_k": same_k,
                    "same_k_and_contributors": same,
                    "same_when_replayed": same_replayed,
                    "mean_iteration_train_s": real_t,
                    "mean_iteration_simulate_s": sim_t,
                    "time_ratio": real_t / sim_t,
                    "ghosts": result.record.summary["ghosts"],
                }
            )
    machine = platform.processor() or platform.machine()
    report = {"machine": machine, "delays_ms": (delays * 1e3).tolist(), "cases": rows}
    if args.json:
        print(json.dumps(report, indent=2))
        return
    for r in rows:
        print(
            f"{r['strategy']:>20}: same k {r['same_k']:.1%}, same k and contributors "
            f"{r['same_k_and_contributors']:.1%} (replayed {r['same_when_replayed']:.1%}); "
            f"mean iteration train {r['mean_iteration_train_s'] * 1e3:.1f} ms vs simulate "
            f"{r['mean_iteration_simulate_s'] * 1e3:.1f} ms (x{r['time_ratio']:.3f})"
        )


if __name__ == "__main__":
    main()
