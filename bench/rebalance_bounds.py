"""The bounds and optimal times of ``bench_rebalance.py``: ``predict``'s rows for the injected
laws (``optimal_share_time``, ``optimal_demand_time``, and ``optimal_time``, the one a spec is
read against), what any scheme can reach on those laws (``feasibility``, with the no-drop rate
bounds of ``synchronous_bounds``), what a synchronous step boundary costs the carried
combination (``boundary_cost``), and the best K of K-sync (``best_k_sync``)."""

from __future__ import annotations

import math
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from tailtrain.core.scenario import Scenario, World
from tailtrain.delays import parse_delay
from tailtrain.prediction.rebalance import demand_times, rebalance_times
from tailtrain.sim.run import simulate
from tailtrain.strategies.rebalance import optimal_shares
from tailtrain.strategies.registry import parse_strategy
from tailtrain.theory.dropcompute import carried_rates

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench import rebalance_setting as rs  # noqa: E402

#: Monte Carlo iterations of the optimal-share time (its standard error is reported)
OPTIMAL_DRAWS = 4000
#: the rule's default warm-up (``rebalance:warmup=``), steps at equal shares
WARMUP = 10
#: steps of draws behind the no-drop rate bounds (``synchronous_bounds``)
BOUND_DRAWS = 20000


def injected_draws(name: str, base: Scenario, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Scenario ``name``'s micro-batch times t[i, n, m] for predict's rows (OPTIMAL_DRAWS
    iterations: the noise times each worker's slowdown factor, fixed from time 0) and the
    workers' mean times."""
    scenario = rs.scenario_of(name, base)
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
    scenario = rs.scenario_of(name, base)
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
    scenario = replace(rs.scenario_of(name, base), task="none", target_loss=None)
    n, law = scenario.workers, parse_delay(scenario.delay).mean
    spec = rs.REBALANCE[1]
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
        sync = simulate(scenario, parse_strategy(rs.SYNC), seed)
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
    scenario = replace(rs.scenario_of(name, base), task="none", target_loss=None)
    n = scenario.workers
    rates = {}
    for k in sorted({n // 2, 3 * n // 4, n - 1}):
        record = simulate(scenario, parse_strategy(f"k-sync:k={k}"), 0)
        rates[k] = k / record.summary["mean_iteration_time"]
    k = max(rates, key=rates.get)
    return {"spec": f"k-sync:k={k}", "gradients_per_s": rates}
