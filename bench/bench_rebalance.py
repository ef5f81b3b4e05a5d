"""Issue 25's benchmark: ``rebalance`` against sync, DropCompute and the best K-sync.

Four scenarios on ``digits-cnn``, 8 workers, 12 micro-batches of
``const:value=0.01+dropcompute-noise:scale=0.01`` seconds (DropCompute App. B.1 noise):
(a) one rank persistently 1.5x slower; (b) mixed hardware, half the ranks 1.4x slower;
(c) as (b) with ``noniid:classes=2``, so the slow ranks hold classes of their own;
(d) i.i.d. noise only. Strategies: ``sync``, ``dropcompute:threshold=auto``, the best
``k-sync:k=K`` on the parameter server (K among N/2, 3N/4, N-1 with the most samples per
second in a timing-only simulate of seed 0), ``rebalance``,
``rebalance:then=dropcompute,defer=true`` (its threshold's cut carried to the next step, so it
drops no sample; without ``defer=true`` it has the same clock and drops what this one defers)
and ``rebalance:deal=demand`` (each micro-batch to whichever rank asks next until N M are
complete, the units in flight then carried).

Two parts:

* ``simulate`` (virtual clock, deterministic, load-independent): 60 virtual seconds per run,
  over ``--seeds``. Per strategy: mean iteration time, samples per second (samples whose
  gradient entered an update, per virtual second), samples dropped and deferred per epoch,
  time to train loss 0.3, final test accuracy, and in (c) the test accuracy on the classes
  that only slow ranks hold and on every class a slow rank holds; mean, min and max over
  seeds. ``optimal_share_time`` is ``predict``'s rebalance row for the injected laws
  (``prediction.rebalance.rebalance_times``: optimal integer shares for the workers' mean
  micro-batch times, E[max_n S_n(m_n)] by Monte Carlo on 4000 iterations of draws, with its
  standard error; ``predict`` itself refuses a time-scheduled ``slowdown``, which with at=0
  is these fixed per-worker factors), and ``optimal_demand_time`` its ``rebalance:deal=demand``
  row on the same draws (``prediction.rebalance.demand_times``: the (N M)-th completion of
  fresh draws). Each spec's goal reads its time against its own row (``time_over_optimal``:
  deal=demand against ``optimal_demand_time``, rebalance and its combination against
  ``optimal_share_time``); ``time_over_optimal_share`` keeps every spec's static figure.
* ``real``: 8 gloo ranks through ``tailtrain train`` with the same flags but delays scaled by
  ``--real-scale`` (so injected sleeps dominate compute and this machine's noise) and
  ``--real-iterations`` updates, beside ``simulate`` with those very flags: the real/simulated
  ratio of mean iteration time. A strategy ``train`` refuses is reported with its one-line
  refusal, not run.

"Samples dropped per epoch": of the samples a strategy draws (sync's global batch, N M B a
step), those whose gradient never enters an update, per epoch of the train set (n_train
samples drawn): DropCompute's cut micro-batches, K-sync's ignored gradients. The carried cut
of ``rebalance:then=dropcompute,defer=true`` (and the units ``rebalance:deal=demand`` cuts in
flight) is "deferred" (computed one step later), not dropped; only what is still carried
when the run ends was never computed (``left_at_end``).

Its setting (the base scenario, the four scenarios and the strategies compared) is
``rebalance_setting.py``; the bounds and optimal times it reads the runs against,
``rebalance_bounds.py``; its goals, ``rebalance_goals.py``.

    python bench/bench_rebalance.py --json [--seeds 0 1 2] [--jobs 2]   # the full benchmark
    python bench/bench_rebalance.py --quick --json                       # a smoke test
    python bench/bench_rebalance.py --part real --out real.json          # real/simulated only
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tailtrain.core.scenario import Scenario, World
from tailtrain.sim.run import simulate
from tailtrain.strategies.registry import parse_strategy

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench import rebalance_bounds as rb  # noqa: E402
from bench import rebalance_goals as rg  # noqa: E402
from bench import rebalance_setting as rs  # noqa: E402


class CaptureTask:
    """Delegates to a task and keeps the parameters of its last evaluation (the final model)."""

    def __init__(self, task: Any) -> None:
        self._task = task
        self.theta: torch.Tensor | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._task, name)

    def evaluate(self, theta: torch.Tensor) -> dict[str, float]:
        self.theta = theta.clone()
        return self._task.evaluate(theta)


# ---- the virtual clock ---------------------------------------------------------------------
def slow_ranks(world: World) -> np.ndarray:
    """Ranks the pattern slows at time 0 (``slowdown`` with at=0 slows them for the run)."""
    n = world.scenario.workers
    return np.flatnonzero(world.process.time_factor(np.zeros(n), np.arange(n)) > 1.0)


def class_accuracy(task: Any, theta: torch.Tensor, classes: list[int]) -> float | None:
    """Test accuracy on the examples of ``classes`` (None: no class)."""
    if not classes:
        return None
    x, y = task.data.x_test, task.data.y_test
    keep = torch.isin(y, torch.tensor(classes))
    with torch.no_grad():
        out = task.module_at(theta)(x[keep])
    return float((out.argmax(-1) == y[keep]).float().mean())


def one_run(job: tuple[str, str, int, Scenario, bool, tuple[int, int]]) -> dict[str, Any]:
    """One simulate run's figures (module docstring). Without ``learn`` it runs timing only
    (``--task none``): the virtual clock, the shares and DropCompute's threshold depend on the
    drawn times alone, so its timing figures are the model run's, at a fraction of the cost."""
    name, spec, seed, base, learn, sizes = job
    scenario = rs.scenario_of(name, base)
    if not learn:
        scenario = replace(scenario, task="none", target_loss=None)
    world = World.build(scenario, seed)
    task = CaptureTask(world.task)
    record = simulate(scenario, parse_strategy(spec), seed, task=task)
    head = {"scenario": name, "strategy": spec, "seed": seed, "learned": learn}
    return head | figures(record, world, task, sizes, learn)


def figures(
    record: Any, world: World, task: CaptureTask, sizes: tuple[int, int], learn: bool
) -> dict[str, Any]:
    """Counts in micro-batches of B samples: ``used`` entered an update; without a carried
    cut the rest of the N M a step drew is dropped, with one it is deferred and only the last
    step's cut (``left``) was never computed. Per epoch: per n_train samples drawn."""
    batch, n_train = sizes
    steps, summary = record.steps, record.summary
    n, m = world.scenario.workers, world.scenario.micro_batches
    dealt = len(steps) * n * m
    if "completed" in steps[0]:  # allreduce: each rank's computed micro-batches
        used = sum(sum(row["completed"]) for row in steps)
    else:  # parameter server: K gradients of M micro-batches each; the others are ignored
        used = sum(row["k"] for row in steps) * m
    carried = "deferred" in steps[0]
    deferred = sum(row["deferred"] for row in steps) if carried else 0
    left = summary["dropped_micro_batches"] if carried else 0
    dropped = 0 if carried else dealt - used
    drawn = used + left if carried else dealt  # fresh micro-batches taken from the stream
    per_epoch = n_train / drawn
    out = {
        "iterations": len(steps),
        "mean_iteration_time": summary["mean_iteration_time"],
        "samples_per_s": used * batch / steps[-1]["time"],
        "dropped_per_epoch": dropped * per_epoch,
        "deferred_per_epoch": deferred * per_epoch,
        "left_at_end": left * batch,
    }
    if not learn:
        return out
    out["time_to_target"] = summary.get("time_to_target")
    out["final_accuracy"] = summary.get("final_eval")
    if world.partition is not None and world.partition.classes is not None:
        slow = slow_ranks(world)
        held = world.partition.classes
        fast = np.setdiff1d(np.arange(world.scenario.workers), slow)
        mine = sorted(set(held[slow].ravel().tolist()))
        own = sorted(set(mine) - set(held[fast].ravel().tolist()))
        out["slow_classes"], out["slow_own_classes"] = mine, own
        out["accuracy_slow_classes"] = class_accuracy(task, task.theta, mine)
        out["accuracy_slow_own_classes"] = class_accuracy(task, task.theta, own)
    return out


def spread(values: list[float | None]) -> dict[str, float | None]:
    """Mean, min and max over seeds (None where a seed has no value, e.g. a missed target)."""
    if not values or any(v is None for v in values):
        return {"mean": None, "min": None, "max": None, "missing": sum(v is None for v in values)}
    return {"mean": float(np.mean(values)), "min": min(values), "max": max(values)}


TIMING = (
    "iterations",
    "mean_iteration_time",
    "samples_per_s",
    "dropped_per_epoch",
    "deferred_per_epoch",
    "left_at_end",
)
LEARNING = (
    "time_to_target",
    "final_accuracy",
    "accuracy_slow_classes",
    "accuracy_slow_own_classes",
)


def aggregate(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Timing figures over every seed, learning figures over the seeds that trained a model."""
    learned = [r for r in runs if r["learned"]]
    out = {k: spread([r[k] for r in runs]) | {"seeds": len(runs)} for k in TIMING}
    for key in LEARNING:
        if learned and key in learned[0]:
            out[key] = spread([r[key] for r in learned]) | {"seeds": len(learned)}
    if learned and "slow_classes" in learned[0]:
        out["slow_classes"] = learned[0]["slow_classes"]
        out["slow_own_classes"] = learned[0]["slow_own_classes"]
    return out


def simulate_part(args: argparse.Namespace, base: Scenario) -> dict[str, Any]:
    out: dict[str, Any] = {}
    jobs, specs = [], {}
    task = World.build(replace(base, iterations=1, time_budget=None), 0).task
    sizes = (task.batch_size, task.n_train)
    for name in args.scenarios:
        k_sync = rb.best_k_sync(name, base)
        specs[name] = [rs.SYNC, rs.DROPCOMPUTE, k_sync["spec"], *rs.REBALANCE]
        out[name] = {
            "flags": scenario_flags(rs.scenario_of(name, base)),
            "best_k_sync": k_sync,
            "optimal_share_time": rb.optimal_share_time(name, base),
            "optimal_demand_time": rb.optimal_demand_time(name, base),
            "feasibility": rb.feasibility(name, base),
        }
        for spec in specs[name]:
            for seed in args.seeds:
                learn = name in args.learn_scenarios and seed in args.learn_seeds
                jobs.append((name, spec, seed, base, learn, sizes))
    jobs.sort(key=lambda job: not job[4])  # the long model runs first
    with ProcessPoolExecutor(args.jobs) as pool:
        runs = list(pool.map(one_run, jobs))
    for name in args.scenarios:
        mine = [r for r in runs if r["scenario"] == name]
        out[name]["strategies"] = {
            spec: aggregate([r for r in mine if r["strategy"] == spec]) for spec in specs[name]
        }
        out[name]["runs"] = mine
    return out


def scenario_flags(scenario: Scenario) -> list[str]:
    """The CLI flags of a scenario (``simulate`` and ``train`` take the same)."""
    flags = []
    for key, value in asdict(scenario).items():
        if value is not None and value != getattr(Scenario, key, None):
            flags += [f"--{key.replace('_', '-')}", str(value)]
    return flags


def merged(reports: list[dict[str, Any]]) -> dict[str, Any]:
    """The simulate parts of several runs of this benchmark (other seeds) as one: each
    scenario's runs pooled and aggregated again; its other entries from the first report."""
    out: dict[str, Any] = {}
    for report in reports:
        for name, part in report["simulate"].items():
            if name not in out:
                out[name] = {k: v for k, v in part.items() if k != "strategies"} | {"runs": {}}
            for run in part["runs"]:  # one run a (strategy, seed): a model run over timing only
                key = (run["strategy"], run["seed"])
                if key not in out[name]["runs"] or run["learned"]:
                    out[name]["runs"][key] = run
    for part in out.values():
        part["runs"] = list(part["runs"].values())
        specs = list(dict.fromkeys(r["strategy"] for r in part["runs"]))
        part["strategies"] = {
            spec: aggregate([r for r in part["runs"] if r["strategy"] == spec]) for spec in specs
        }
    return out


# ---- real processes ------------------------------------------------------------------------
def scaled(delay_scale: float) -> str:
    value = 0.01 * delay_scale
    return f"const:value={value:g}+dropcompute-noise:scale={value:g}"


def real_run(spec: str, scenario: Scenario, seed: int, timeout: float) -> dict[str, Any]:
    """``tailtrain train`` with the scenario's flags; its JSON summary, or its refusal."""
    with tempfile.TemporaryDirectory(prefix="bench-rebalance-") as folder:
        argv = [sys.executable, "-m", "tailtrain", "train", "--strategy", spec]
        argv += [*scenario_flags(scenario), "--seed", str(seed), "--json", "--no-progress"]
        argv += ["--out", folder, "--overwrite"]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        start = time.perf_counter()
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)
        wall = time.perf_counter() - start
    if done.returncode == 2:
        line = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else ""
        return {"status": "not supported by train yet", "refusal": line}
    if done.returncode != 0:
        return {"status": f"failed (exit {done.returncode})", "stderr": done.stderr[-2000:]}
    summary = json.loads(done.stdout)
    return {"status": "ran", "summary": summary, "wall_seconds": wall}


def real_part(args: argparse.Namespace, base: Scenario, k_specs: dict[str, str]) -> dict:
    """Each scenario through ``train`` and ``simulate`` with the same (scaled) flags."""
    out: dict[str, Any] = {"delay_scale": args.real_scale, "load_before": os.getloadavg()}
    for name in args.real_scenarios:
        scenario = replace(
            rs.scenario_of(name, base),
            delay=scaled(args.real_scale),
            time_budget=None,
            iterations=args.real_iterations,
            target_loss=None,
        )
        rows = {}
        # the simulate part's choice, or the same choice made here (timing only, cheap)
        k_sync = k_specs.get(name) or rb.best_k_sync(name, base)["spec"]
        # the combination that drops has the carried one's clock (both run on train)
        specs = [rs.SYNC, rs.DROPCOMPUTE, k_sync, "rebalance:then=dropcompute", *rs.REBALANCE]
        for spec in [s for s in specs if args.real_strategies is None or s in args.real_strategies]:
            real = real_run(spec, scenario, 0, args.real_timeout)
            row = {"real": real, "load_after": os.getloadavg()}
            if real["status"] == "ran":
                sim = simulate(scenario, parse_strategy(spec), 0).summary
                ratio = real["summary"]["mean_iteration_time"] / sim["mean_iteration_time"]
                row |= {
                    "simulated_mean_iteration_time": sim["mean_iteration_time"],
                    "real_mean_iteration_time": real["summary"]["mean_iteration_time"],
                    "real_over_simulated": ratio,
                    "within_5pct": abs(ratio - 1) <= 0.05,
                }
            rows[spec] = row
            ratio = row.get("real_over_simulated")
            said = real["status"] if ratio is None else f"real/sim {ratio:.3f}"
            print(f"({name}) {spec}: {said}, load {row['load_after']}", file=sys.stderr, flush=True)
        out[name] = {"flags": scenario_flags(scenario), "strategies": rows}
    out["load_after"] = os.getloadavg()
    return out


# ---- entry ---------------------------------------------------------------------------------
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument("--out", type=Path, help="also write the JSON document to this file")
    parser.add_argument("--quick", action="store_true", help="a smoke test: short, one seed")
    parser.add_argument(
        "--merge",
        nargs="+",
        metavar="JSON",
        help="re-aggregate the simulate runs of earlier --json outputs (other seeds)",
    )
    parser.add_argument(
        "--part", choices=("simulate", "real", "both", "feasibility"), default="both"
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--scenarios", nargs="+", default=list(rs.SCENARIOS), choices=rs.SCENARIOS)
    parser.add_argument("--jobs", type=int, default=1, help="simulate runs in parallel")
    parser.add_argument(
        "--learn-scenarios", nargs="+", default=list(rs.SCENARIOS), help="train the model in these"
    )
    parser.add_argument(
        "--learn-seeds", type=int, nargs="+", help="train the model for these (default: all)"
    )
    parser.add_argument("--real-scenarios", nargs="+", default=list(rs.SCENARIOS))
    parser.add_argument("--real-scale", type=float, default=10.0, help="delay multiple")
    parser.add_argument("--real-iterations", type=int, default=30)
    parser.add_argument("--real-timeout", type=float, default=600.0)
    parser.add_argument(
        "--real-strategies",
        nargs="+",
        help="run only these specs in the real part (default: all six, the best k-sync too)",
    )
    args = parser.parse_args()
    if args.learn_seeds is None:
        args.learn_seeds = args.seeds
    base = rs.BASE
    if args.quick:
        base = replace(rs.BASE, time_budget=3.0, target_loss=2.0)
        args.seeds, args.real_iterations = args.seeds[:1], 3
        args.real_scenarios = args.real_scenarios[:1]
    report: dict[str, Any] = {
        "meta": {
            "python": platform.python_version(),
            "machine": platform.machine(),
            "quick": args.quick,
            "seeds": args.seeds,
            "load_at_start": os.getloadavg(),
        }
    }
    k_specs: dict[str, str] = {}
    if args.merge:
        report["simulate"] = merged([json.loads(Path(p).read_text()) for p in args.merge])
        report["goals"] = rg.goals(report["simulate"])
        print(json.dumps(report, indent=1, default=float))
        return
    if args.part == "feasibility":  # the bounds alone: cheap, no run
        report["feasibility"] = {
            n: {
                "optimal_share_time": rb.optimal_share_time(n, base),
                "optimal_demand_time": rb.optimal_demand_time(n, base),
            }
            | rb.feasibility(n, base)
            | {"boundary": rb.boundary_cost(n, base, args.seeds)}
            for n in args.scenarios
        }
    if args.part in ("simulate", "both"):
        report["simulate"] = simulate_part(args, base)
        report["goals"] = rg.goals(report["simulate"])
        k_specs = {n: p["best_k_sync"]["spec"] for n, p in report["simulate"].items()}
    if args.part in ("real", "both"):
        report["real"] = real_part(args, base, k_specs)
    if args.out:
        args.out.write_text(json.dumps(report, indent=1, default=float))
    if args.json:
        print(json.dumps(report, indent=1, default=float))
        return
    print_table(report)


def print_table(report: dict[str, Any]) -> None:
    for name, part in report.get("simulate", {}).items():
        opt, own = part["optimal_share_time"], part["optimal_demand_time"]
        print(
            f"({name}) optimal-share time {opt['time']:.4f} s (+- {opt['stderr']:.4f}), "
            f"deal=demand's {own['time']:.4f} s (+- {own['stderr']:.4f})"
        )
        for spec, row in part["strategies"].items():
            t2t = row.get("time_to_target", {}).get("mean")
            acc = row.get("final_accuracy", {}).get("mean")
            print(
                f"  {spec:28s} {row['mean_iteration_time']['mean']:.4f} s/iter "
                f"{row['samples_per_s']['mean']:8.1f} samples/s "
                f"dropped/epoch {row['dropped_per_epoch']['mean']:7.1f} "
                f"target {'-' if t2t is None else f'{t2t:.1f} s'} "
                f"acc {'-' if acc is None else f'{acc:.3f}'}"
            )
    real = report.get("real")
    if real:
        print(f"real processes (delays x{real['delay_scale']:g}), load {real['load_before']}")
        for name, part in real.items():
            if not isinstance(part, dict) or "strategies" not in part:
                continue
            print(f"({name})")
            for spec, row in part["strategies"].items():
                if "real_over_simulated" not in row:
                    print(f"  {spec:38s} {row['real']['status']}")
                    continue
                load = ", ".join(f"{x:.2f}" for x in row["load_after"])
                print(
                    f"  {spec:38s} real {row['real_mean_iteration_time']:.4f} s "
                    f"sim {row['simulated_mean_iteration_time']:.4f} s "
                    f"real/sim {row['real_over_simulated']:.3f} load after {load}"
                )
    if "goals" in report:
        print(json.dumps(report["goals"], indent=1))


if __name__ == "__main__":
    main()
