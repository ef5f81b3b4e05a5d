"""DBW at scale (issue 9): timing-only worker-iterations per second of `dbw` against `k-sync`.

Both run `--task none` on the same workers and delays. DBW's extra cost is its rule: the
Eq. (17) estimator behind ``adapt``. Printed: both rates, their ratio (goal >= 0.2 at 2048
workers), the median and max wall time of one ``adapt`` and the pickled size of DBW's final
state. The ratio is measured within one run, so a noisy machine moves both sides together.
Run: python bench/bench_dbw_scale.py [--workers 2048] [--dbw-steps 300] [--json]
"""

from __future__ import annotations

import argparse
import json
import pickle
import statistics
import time
from typing import Any

from tailtrain.core.scenario import Scenario
from tailtrain.sim.run import simulate
from tailtrain.strategies.base import ArrivalColumns, Context, Plan, Selection, StepStats, Strategy
from tailtrain.strategies.registry import parse_strategy

DELAY = "shifted-exp:shift=1,scale=1"


class TimedAdapt(Strategy):
    """Delegates to a strategy, timing each ``adapt`` and keeping the latest state."""

    def __init__(self, inner: Strategy) -> None:
        self.inner = inner
        self.name = inner.name
        self.adapt_seconds: list[float] = []
        self.state: Any = None

    def init(self, ctx: Context) -> Any:
        self.state = self.inner.init(ctx)
        return self.state

    def plan(self, state: Any) -> Plan:
        return self.inner.plan(state)

    def select(self, state: Any, arrivals: ArrivalColumns) -> Selection:
        return self.inner.select(state, arrivals)

    def adapt(self, state: Any, stats: StepStats) -> Any:
        start = time.perf_counter()
        self.state = self.inner.adapt(state, stats)
        self.adapt_seconds.append(time.perf_counter() - start)
        return self.state

    def describe(self) -> str:
        return self.inner.describe()


def rate(text: str, workers: int, steps: int) -> tuple[float, TimedAdapt]:
    """Worker-iterations per second of one seeded timing-only run (after a short warm-up)."""
    warm = Scenario(task="none", workers=workers, delay=DELAY, iterations=3)
    simulate(warm, parse_strategy(text), 0)  # imports, caches
    scenario = Scenario(task="none", workers=workers, delay=DELAY, iterations=steps)
    timed = TimedAdapt(parse_strategy(text))
    start = time.perf_counter()
    record = simulate(scenario, timed, 1)
    wall = time.perf_counter() - start
    return workers * len(record.steps) / wall, timed


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, default=2048)
    p.add_argument("--ksync-steps", type=int, default=300)
    p.add_argument("--dbw-steps", type=int, default=300)
    p.add_argument("--strategy", default="dbw", help="the DBW variant: dbw or b-dbw")
    p.add_argument("--k", type=int, default=1536, help="k-sync's K (bench_simulator's 1536)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    ksync, _ = rate(f"k-sync:k={args.k}", args.workers, args.ksync_steps)
    dbw, timed = rate(args.strategy, args.workers, args.dbw_steps)
    adapt_ms = [1e3 * s for s in timed.adapt_seconds]
    result = {
        "workers": args.workers,
        "k_sync_worker_iterations_per_s": ksync,
        "dbw_worker_iterations_per_s": dbw,
        "ratio": dbw / ksync,
        "adapt_ms_median": statistics.median(adapt_ms),
        "adapt_ms_max": max(adapt_ms),
        "state_pickle_bytes": len(pickle.dumps(timed.state)),
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return
    n = args.workers
    print(f"timing-only, {n} workers, {DELAY}:")
    print(f"    k-sync:k={args.k:<8d} {ksync:12.4g} worker-iterations/s ({args.ksync_steps} steps)")
    print(f"    {args.strategy:15s} {dbw:12.4g} worker-iterations/s ({args.dbw_steps} steps)")
    print(f"    ratio {args.strategy} / k-sync: {result['ratio']:.3f} (goal >= 0.2)")
    print(
        f"    {args.strategy} adapt: median {result['adapt_ms_median']:.2f} ms, "
        f"max {result['adapt_ms_max']:.2f} ms; pickled state "
        f"{result['state_pickle_bytes'] / 2**20:.3f} MiB"
    )


if __name__ == "__main__":
    main()
