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

    python bench/bench_rebalance.py --json [--seeds 0 1 2] [--jobs 2]   # the full benchmark
    python bench/bench_rebalance.py --quick --json                       # a smoke test
    python bench/bench_rebalance.py --part real --out real.json          # real/simulated only
"""

from __future__ import annotations

import argparse
import json
import math
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
from tailtrain.delays import parse_delay
from tailtrain.prediction.rebalance import demand_times, rebalance_times
from tailtrain.sim.run import simulate
from tailtrain.strategies.rebalance import optimal_shares
from tailtrain.strategies.registry import parse_strategy
from tailtrain.theory.dropcompute import carried_rates

NOISE = "const:value=0.01+dropcompute-noise:scale=0.01"
BASE = Scenario(
    task="digits-cnn", workers=8, micro_batches=12, delay=NOISE, time_budget=60.0, target_loss=0.3
)
SCENARIOS = {
    "a": {"pattern": "slowdown:at=0,fraction=0.125,factor=1.5"},
    "b": {"pattern": "slowdown:at=0,fraction=0.5,factor=1.4"},
    "c": {"pattern": "slowdown:at=0,fraction=0.5,factor=1.4", "partition": "noniid:classes=2"},
    "d": {"pattern": "iid"},
}
SYNC, DROPCOMPUTE = "sync", "dropcompute:threshold=auto"
REBALANCE = (
    "rebalance",
    "rebalance:then=dropcompute,defer=true",
    "rebalance:deal=demand",
)
#: Monte Carlo iterations of the optimal-share time (its standard error is reported)
OPTIMAL_DRAWS = 4000
#: the rule's default warm-up (``rebalance:warmup=``), steps at equal shares
WARMUP = 10
#: steps of draws behind the no-drop rate bounds (``synchronous_bounds``)
BOUND_DRAWS = 20000


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
def scenario_of(name: str, base: Scenario) -> Scenario:
    return replace(base, **SCENARIOS[name])


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
    scenario = scenario_of(name, base)
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


def injected_draws(name: str, base: Scenario, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Scenario ``name``'s micro-batch times t[i, n, m] for predict's rows (OPTIMAL_DRAWS
    iterations: the noise times each worker's slowdown factor, fixed from time 0) and the
    workers' mean times."""
    scenario = scenario_of(name, base)
    n, m = scenario.workers, scenario.micro_batches
    factor = World.build(replace(scenario, task="none"), seed).process.time_factor(
        np.zeros(n), np.arange(n)
    )
    delay = parse_delay(scenario.delay)
    rng = np.random.default_rng(seed)
    t = delay.sample(rng, (OPTIMAL_DRAWS, n, m)) * factor[None, :, None]
    return t, delay.mean * factor


def optimal_share_time(name: str, base: Scenario, seed: int = 0) -> dict[str, float]:
    """``predict``'s rebalance row for scenario ``name``'s injected laws: worker n's micro-batch
    time is the noise times its slowdown factor (fixed from time 0); shares optimal for the
    means, E[max_n S_n(m_n)] by Monte Carlo (``prediction.rebalance.rebalance_times``)."""
    t, means = injected_draws(name, base, seed)
    mean, stderr, closed, shares = rebalance_times(t, np.zeros(OPTIMAL_DRAWS), means)
    return {"time": mean, "stderr": stderr, "closed_form": closed, "shares": shares.tolist()}


def optimal_demand_time(name: str, base: Scenario, seed: int = 0) -> dict[str, Any]:
    """``predict``'s ``rebalance:deal=demand`` row for scenario ``name``'s injected laws (the
    draws of :func:`optimal_share_time`): the (N M)-th completion of the workers' fresh
    draws, by Monte Carlo (``prediction.rebalance.demand_times``); its closed form T* (exact
    for constant times) beside it."""
    t, means = injected_draws(name, base, seed)
    mean, stderr, closed, units = demand_times(t, np.zeros(OPTIMAL_DRAWS), means)
    return {"time": mean, "stderr": stderr, "closed_form": closed, "draws_per_step": units}


def optimal_time(part: dict[str, Any], spec: str) -> float:
    """The time ``predict`` computes for ``spec`` at its best: deal=demand's own row, the
    optimal static shares' for rebalance and its combination."""
    key = "optimal_demand_time" if "deal=demand" in spec else "optimal_share_time"
    return part[key]["time"]


def feasibility(name: str, base: Scenario, seed: int = 0) -> dict[str, float]:
    """What any scheme can reach on scenario ``name``'s laws, in micro-batches per second.

    ``ceiling``: every rank busy all the time, sum_n 1/mu_n (no scheme computes faster, with
    or without drops; T^c is 0 here). ``fluid_step``: N M / ceiling, the step of a no-drop
    scheme that splits work perfectly. ``greedy_step``: a no-drop step whose N M micro-batches
    go, one by one, to whichever rank is free (dynamic dealing, the best a no-drop scheme can
    do without knowing the draws): Monte Carlo over 2000 steps of the same draws the rule sees.
    """
    scenario = scenario_of(name, base)
    n, m = scenario.workers, scenario.micro_batches
    factor = World.build(replace(scenario, task="none"), seed).process.time_factor(
        np.zeros(n), np.arange(n)
    )
    delay = parse_delay(scenario.delay)
    ceiling = float((1.0 / (delay.mean * factor)).sum())
    rng = np.random.default_rng(seed)
    steps = 2000
    t = delay.sample(rng, (steps, n, n * m)) * factor[None, :, None]
    greedy = np.empty(steps)
    for step in range(steps):  # list scheduling, the next micro-batch to the first free rank
        free, used = np.zeros(n), np.zeros(n, dtype=np.int64)
        for _ in range(n * m):
            rank = int(np.argmin(free))
            free[rank] += t[step, rank, used[rank]]
            used[rank] += 1
        greedy[step] = free.max()
    return {
        "ceiling_micro_batches_per_s": ceiling,
        "fluid_step": n * m / ceiling,
        "greedy_step": float(greedy.mean()),
        "greedy_step_stderr": float(greedy.std(ddof=1) / math.sqrt(steps)),
    } | synchronous_bounds(delay, factor, m, seed)


def synchronous_bounds(delay: Any, factor: np.ndarray, m: int, seed: int) -> dict[str, Any]:
    """Rates in micro-batches per second of no-drop schemes with one allreduce per step and at
    most N M micro-batches a step, on ``BOUND_DRAWS`` steps of the scenario's laws (T^c = 0),
    against sync's long-run rate on the same draws.

    ``static_threshold``: static shares m_n and one threshold tau whose cut is carried (the
    rule's family, ``rebalance:then=dropcompute,defer=true`` in steady state): the rate
    sum completed / sum min(tau, T_i) at the best tau
    (``theory.dropcompute.carried_rates``, the argmax on the draws themselves, so
    optimistic), for the optimal shares of the means and for the best shares a local search
    finds (moving one micro-batch between two ranks while the best rate grows).
    ``dealt_on_demand``: every rank computes until tau or until N M micro-batches are
    complete in all, whichever is first (the step's N M micro-batches dealt on demand to
    whichever rank is free, as ``rebalance:deal=demand`` does with no tau), best tau on a grid: the
    micro-batch in flight at the boundary is lost, nothing else; a reference for what a
    synchronous step boundary costs at best, not a theorem about every scheme."""
    n = factor.size
    total = n * m
    rng = np.random.default_rng(seed)
    t = delay.sample(rng, (BOUND_DRAWS, n, 3 * m)) * factor[None, :, None]
    comm = np.zeros(BOUND_DRAWS)
    cumulative = np.cumsum(t, axis=2)
    sync = total / float(cumulative[:, :, m - 1].max(axis=1).mean())

    def best(shares: np.ndarray) -> tuple[float, float]:
        tau, rate = carried_rates(t[:, :, : int(shares.max())], comm, shares)
        k = int(np.argmax(rate))
        return float(rate[k]), float(tau[k])

    shares = optimal_shares(delay.mean * factor, total)
    start = best(shares)
    found, rate = shares.copy(), start
    for _ in range(4 * total):  # local search; each pass tries every one-unit move
        # ranks of one law and one share are interchangeable: one move per kind of pair
        kinds = {
            (factor[i], found[i], factor[j], found[j]): (i, j)
            for i in range(n)
            for j in range(n)
            if i != j and found[i] > 1
        }
        tried = [(best(shifted(found, i, j)), shifted(found, i, j)) for i, j in kinds.values()]
        top = max(tried, key=lambda pair: pair[0][0])
        if top[0][0] <= rate[0]:
            break
        rate, found = top
    # dealt on demand: the step ends at min(tau, the (N M)-th completion over all ranks)
    ends = np.sort(cumulative.reshape(BOUND_DRAWS, -1), axis=1)[:, total - 1]
    grid = np.linspace(0.5, 1.5, 201) * total / float((1.0 / (delay.mean * factor)).sum())
    done = np.array([np.minimum((cumulative < g).sum(axis=(1, 2)), total).mean() for g in grid])
    demand = done / np.array([np.minimum(g, ends).mean() for g in grid])
    k = int(np.argmax(demand))
    return {
        "bound_draws": BOUND_DRAWS,
        "sync_long_run_micro_batches_per_s": sync,
        "static_threshold_optimal_shares": {
            "shares": shares.tolist(),
            "micro_batches_per_s": start[0],
            "tau": start[1],
            "over_sync": start[0] / sync,
        },
        "static_threshold_best_shares": {
            "shares": found.tolist(),
            "micro_batches_per_s": rate[0],
            "tau": rate[1],
            "over_sync": rate[0] / sync,
        },
        "dealt_on_demand": {
            "micro_batches_per_s": float(demand[k]),
            "tau": float(grid[k]),
            "over_sync": float(demand[k] / sync),
        },
    }


def shifted(shares: np.ndarray, source: int, target: int) -> np.ndarray:
    """``shares`` with one micro-batch moved from rank ``source`` to rank ``target``."""
    out = shares.copy()
    out[source] -= 1
    out[target] += 1
    return out


class StepLog:
    """Wraps a rule and keeps, per step, each rank's counted busy seconds (the sum of its
    completed micro-batches' measured times) and compute seconds (until it stopped): what
    ``adapt`` is shown (``StepStats``), which the record rows do not keep per rank."""

    def __init__(self, rule: Any) -> None:
        self._rule = rule
        self.busy: list[np.ndarray] = []
        self.compute: list[np.ndarray] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._rule, name)

    def adapt(self, state: Any, stats: Any) -> Any:
        self.busy.append(np.nansum(stats.micro_batch_times, axis=1))
        self.compute.append(stats.arrivals.finish - stats.arrivals.start)
        return self._rule.adapt(state, stats)


def boundary_cost(name: str, base: Scenario, seeds: list[int]) -> dict[str, Any]:
    """What a synchronous step boundary costs the carried combination, measured on its
    timing-only simulated runs (``--task none``, 60 virtual seconds, ``seeds``), and whether
    ``ceiling`` x (1 - that cost) bounds what a no-drop scheme reaches.

    Per rank and step, the step T (its slowest rank's compute plus T^c) minus the rank's
    counted busy seconds is idle (it finished its share and waits) plus wasted (the part of the
    micro-batch in flight when the threshold cut it, computed again next step).
    ``fraction``: the mean of that per rank per step over the mean step; ``weighted_fraction``
    the same weighted by the ranks' speeds 1/mu_n, so that ceiling x (1 - it) is
    sum_n (1 - f_n) / mu_n: what the ranks would compute at their laws' means mu_n in the time
    they were busy. That is an upper bound on the micro-batches per second only if a counted
    micro-batch takes mu_n on average; ``own_rate_over_it`` checks it on the runs' own count
    (``is_an_upper_bound``: at most 1 on every seed), and ``counted_mean_over_law_mean``
    (each rank's counted micro-batches' mean time over mu_n) says why it may not be: the
    threshold cuts the long micro-batches in flight and a fresh draw computes them again."""
    scenario = replace(scenario_of(name, base), task="none", target_loss=None)
    n, law = scenario.workers, parse_delay(scenario.delay).mean
    spec = REBALANCE[1]
    lost, steps, computes, own, sync_rates, speed_lost, counted_means = [], [], [], [], [], [], []
    settled: list[float] = []
    for seed in seeds:
        # the seed picks which ranks are slow: each run's own laws
        mu = law * World.build(scenario, seed).process.time_factor(np.zeros(n), np.arange(n))
        log = StepLog(parse_strategy(spec))
        record = simulate(scenario, log, seed)
        step = record.column("compute_time") + record.column("comm_time")
        done = np.array([row["completed"] for row in record.steps])
        idle_wasted = step[:, None] - np.array(log.busy)
        lost.append(idle_wasted)
        steps.append(step)
        computes.append(np.array(log.compute))
        speed_lost.append(float((idle_wasted.sum(axis=0) / mu).sum()))
        counted_means.append((np.array(log.busy).sum(axis=0) / done.sum(axis=0) / mu).tolist())
        own.append(done.sum() / step.sum())
        # past the warm-up (the shares move, the threshold is calibrated): its steady pace
        settled.append(done[WARMUP:].sum() / step[WARMUP:].sum())
        sync = simulate(scenario, parse_strategy(SYNC), seed)
        sync_rates.append(sum(sum(row["completed"]) for row in sync.steps) / sync.steps[-1]["time"])
    ceiling = float((1.0 / mu).sum())  # the same for every seed: the same factors, permuted
    step, idle_wasted = np.concatenate(steps), np.concatenate(lost)
    compute = np.concatenate(computes)
    weighted = sum(speed_lost) / (step.sum() * ceiling)
    bound = ceiling * (1.0 - weighted)
    sync_rate = float(np.mean(sync_rates))
    over = [float(rate / bound) for rate in own]
    return {
        "strategy": spec,
        "seeds": seeds,
        "steps": len(step),
        "mean_step": float(step.mean()),
        "idle_wasted_per_rank_per_step": float(idle_wasted.mean()),
        "wasted_per_rank_per_step": float((compute - (step[:, None] - idle_wasted)).mean()),
        "idle_per_rank_per_step": float((step[:, None] - compute).mean()),
        "fraction": float(idle_wasted.mean() / step.mean()),
        "weighted_fraction": float(weighted),
        "ceiling_micro_batches_per_s": ceiling,
        "ceiling_x_1_minus_f": float(bound),
        "sync_micro_batches_per_s": sync_rate,
        "ceiling_x_1_minus_f_over_sync": float(bound / sync_rate),
        "reaches_1.3x_sync": bool(bound / sync_rate >= 1.3),
        # the largest weighted_fraction with which ceiling x (1 - it) still makes 1.3x sync
        "fraction_that_allows_1.3x_sync": 1.0 - 1.3 * sync_rate / ceiling,
        "own_rate_over_it": over,
        "own_micro_batches_per_s": [float(r) for r in own],
        "own_over_sync": float(np.mean(own) / sync_rate),
        "own_micro_batches_per_s_after_warmup": [float(r) for r in settled],
        "own_after_warmup_over_sync": float(np.mean(settled) / sync_rate),
        "is_an_upper_bound": bool(max(over) <= 1.0),
        "counted_mean_over_law_mean": counted_means,
    }


def best_k_sync(name: str, base: Scenario) -> dict[str, Any]:
    """K among N/2, 3N/4 and N-1 with the most samples per second, timing only (``--task
    none``), seed 0 (three candidates, not every K: this machine is shared)."""
    scenario = replace(scenario_of(name, base), task="none", target_loss=None)
    n = scenario.workers
    rates = {}
    for k in sorted({n // 2, 3 * n // 4, n - 1}):
        record = simulate(scenario, parse_strategy(f"k-sync:k={k}"), 0)
        rates[k] = k / record.summary["mean_iteration_time"]
    k = max(rates, key=rates.get)
    return {"spec": f"k-sync:k={k}", "gradients_per_s": rates}


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
        k_sync = best_k_sync(name, base)
        specs[name] = [SYNC, DROPCOMPUTE, k_sync["spec"], *REBALANCE]
        out[name] = {
            "flags": scenario_flags(scenario_of(name, base)),
            "best_k_sync": k_sync,
            "optimal_share_time": optimal_share_time(name, base),
            "optimal_demand_time": optimal_demand_time(name, base),
            "feasibility": feasibility(name, base),
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


# ---- goals (issue 25's "Done when", as booleans) -------------------------------------------
def mean(part: dict[str, Any], spec: str, key: str) -> float | None:
    return part["strategies"][spec][key]["mean"]


def not_longer(part: dict[str, Any], spec: str, other: str) -> bool:
    """Time to target no longer than ``other``'s within the spread of the seeds: the mean is at
    most the other's mean plus the larger of the two ranges (a missed target is infinite)."""
    mine, theirs = (
        part["strategies"][spec]["time_to_target"],
        part["strategies"][other]["time_to_target"],
    )
    if mine["mean"] is None:
        return False
    if theirs["mean"] is None:
        return True
    width = max(mine["max"] - mine["min"], theirs["max"] - theirs["min"])
    return mine["mean"] <= theirs["mean"] + width


def persistent_goals(part: dict[str, Any], spec: str, with_classes: bool) -> dict[str, Any]:
    """Issue 25's goals in (a)-(c) for ``spec``; None where the run measured nothing to judge
    (no model trained), and then ``all`` is None too."""
    rate = mean(part, spec, "samples_per_s")
    optimal = part["optimal_share_time"]["time"]
    others = [s for s in part["strategies"] if s != spec]
    learned = "time_to_target" in part["strategies"][spec]
    time = mean(part, spec, "mean_iteration_time")
    out: dict[str, Any] = {
        "time_over_optimal": time / optimal_time(part, spec),
        "time_over_optimal_share": time / optimal,
        "samples_per_s_over_sync": rate / mean(part, SYNC, "samples_per_s"),
        "samples_per_s_over_dropcompute": rate / mean(part, DROPCOMPUTE, "samples_per_s"),
    }
    # the goal reads each spec against its own predicted time (time_over_optimal)
    out["within_5pct_of_optimal_time"] = abs(out["time_over_optimal"] - 1) <= 0.05
    out["at_least_1.3x_sync"] = out["samples_per_s_over_sync"] >= 1.3
    out["at_least_0.97x_dropcompute"] = out["samples_per_s_over_dropcompute"] >= 0.97
    out["drops_no_sample"] = part["strategies"][spec]["dropped_per_epoch"]["max"] == 0
    out["time_to_target_not_longer_than_any"] = (
        all(not_longer(part, spec, o) for o in others) if learned else None
    )
    if with_classes:
        own = learned and part["strategies"][spec].get("slow_own_classes")
        key = "accuracy_slow_own_classes" if own else "accuracy_slow_classes"
        out["slow_class_accuracy_key"] = key
        out["slow_class_accuracy"] = (
            {s: mean(part, s, key) for s in part["strategies"]} if learned else None
        )
        bar = max(mean(part, DROPCOMPUTE, key), mean(part, SYNC, key)) if learned else None
        out["slow_class_accuracy_at_least_dc_and_sync_minus_0.5pt"] = (
            mean(part, spec, key) >= bar - 0.005 if learned else None
        )
    verdicts = [
        v
        for k, v in out.items()
        if k.startswith(("within", "at_", "drops", "time_to", "slow_class_accuracy_at"))
    ]
    out["all"] = None if None in verdicts else all(verdicts)
    return out


def goals(sim: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, part in sim.items():
        if name == "d":
            out[name] = {}
            for spec in REBALANCE:
                ratio = mean(part, spec, "samples_per_s") / mean(part, DROPCOMPUTE, "samples_per_s")
                out[name][spec] = {
                    "samples_per_s_over_dropcompute": ratio,
                    "costs_at_most_2pct_vs_dropcompute": ratio >= 0.98,
                }
            out[name]["met"] = any(
                v["costs_at_most_2pct_vs_dropcompute"] for v in out[name].values()
            )
            continue
        out[name] = {spec: persistent_goals(part, spec, name == "c") for spec in REBALANCE}
        verdicts = [out[name][spec]["all"] for spec in REBALANCE]
        out[name]["met"] = True if True in verdicts else None if None in verdicts else False
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
            scenario_of(name, base),
            delay=scaled(args.real_scale),
            time_budget=None,
            iterations=args.real_iterations,
            target_loss=None,
        )
        rows = {}
        # the simulate part's choice, or the same choice made here (timing only, cheap)
        k_sync = k_specs.get(name) or best_k_sync(name, base)["spec"]
        # the combination that drops has the carried one's clock (both run on train)
        specs = [SYNC, DROPCOMPUTE, k_sync, "rebalance:then=dropcompute", *REBALANCE]
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
    parser.add_argument("--scenarios", nargs="+", default=list(SCENARIOS), choices=SCENARIOS)
    parser.add_argument("--jobs", type=int, default=1, help="simulate runs in parallel")
    parser.add_argument(
        "--learn-scenarios", nargs="+", default=list(SCENARIOS), help="train the model in these"
    )
    parser.add_argument(
        "--learn-seeds", type=int, nargs="+", help="train the model for these (default: all)"
    )
    parser.add_argument("--real-scenarios", nargs="+", default=list(SCENARIOS))
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
    base = BASE
    if args.quick:
        base = replace(BASE, time_budget=3.0, target_loss=2.0)
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
        report["goals"] = goals(report["simulate"])
        print(json.dumps(report, indent=1, default=float))
        return
    if args.part == "feasibility":  # the bounds alone: cheap, no run
        report["feasibility"] = {
            n: {
                "optimal_share_time": optimal_share_time(n, base),
                "optimal_demand_time": optimal_demand_time(n, base),
            }
            | feasibility(n, base)
            | {"boundary": boundary_cost(n, base, args.seeds)}
            for n in args.scenarios
        }
    if args.part in ("simulate", "both"):
        report["simulate"] = simulate_part(args, base)
        report["goals"] = goals(report["simulate"])
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
