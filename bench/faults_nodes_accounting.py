"""The accounting of ``bench_faults_nodes.py``'s runs: a run's commits and final history read
from its ranks' logs (a tailtrain record's ``live`` and ``completed``; a peer's committing
workers), its global batch, and the times its rows are read against: the bench's bound (every
live rank always busy) and each row's own rule under the bench's law, from the law's mean and
one micro-batch's compute (measured alone, ``calibrate_compute``)."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench import faults_measure as fm  # noqa: E402
from bench import faults_nodes_setting as ns  # noqa: E402


def commits_and_history(
    rows: list[dict[str, Any]], cfg: argparse.Namespace
) -> tuple[list[dict[str, Any]], dict[int, dict[str, Any]]]:
    """Commits (one per process and step it committed, its own clock) and the final history:
    per step, the last commit of each worker. A tailtrain row's record names the ranks that
    entered (``live``) and each one's micro-batches (``completed``): the history takes them
    from it (the absent node's samples counted: the record says they did not enter); a peer's
    contributors are the workers that committed the step, their micro-batches M each."""
    done = [r for r in rows if r.get("committed") and "t0" in r and r.get("part", True)]
    commits = [{k: r[k] for k in ("worker", "pid", "step", "t")} for r in done]
    last: dict[tuple[int, int], dict[str, Any]] = {}
    for r in sorted(done, key=lambda r: r["t"]):
        last[(r["worker"], r["step"])] = r
    by_step: dict[int, list[dict[str, Any]]] = {}
    for (_, step), r in last.items():
        by_step.setdefault(step, []).append(r)
    unit = fm.unit_samples(cfg)
    history: dict[int, dict[str, Any]] = {}
    for step, got in by_step.items():
        record = next((r for r in got if r.get("live") is not None), None)
        if record is not None:  # tailtrain: the record says who entered, with what
            live, completed = record["live"], record.get("completed") or []
            # dealt on demand the live ranks compute the absent node's share: none is absent
            kept = sum(completed) >= ns.WORKERS * cfg.micro_batches
            absent = 0 if kept else ns.WORKERS - len(live)
            history[step] = {
                "loss": record["loss"],
                "contributors": len(live),
                "absent": absent,
                "per_rank": unit,
                "counted": absent * unit,
                "micro_batches": int(sum(completed)) or len(live) * cfg.micro_batches,
                "live": live,
            }
        else:
            history[step] = {
                "loss": float(np.mean([r["loss"] for r in got])),
                "contributors": len(got),
                "per_rank": unit,
                "micro_batches": len(got) * cfg.micro_batches,
                "live": sorted(r["worker"] for r in got),
            }
    return commits, history


def global_batch(history: dict[int, dict[str, Any]], fault: dict[str, Any] | None) -> Any:
    """Micro-batches per update: the median before the fault's step, and the median and the
    smallest from it on (``None`` where a side has no step)."""
    if not history:
        return None
    at = int(fault["step"]) if fault else max(history) + 1
    before = [h["micro_batches"] for s, h in history.items() if s < at]
    after = [h["micro_batches"] for s, h in history.items() if s >= at]
    return {
        "before": int(np.median(before)) if before else None,
        "after": int(np.median(after)) if after else None,
        "after_min": min(after) if after else None,
    }


def bound_time(
    history: dict[int, dict[str, Any]],
    cell: dict[str, Any],
    cfg: argparse.Namespace,
    slow: dict[str, Any] | None,
) -> dict[str, Any]:
    """The best time to the row's own target step under the bench's law: each update's
    micro-batches spread over the ranks live in it so that every one is always busy, a rank's
    micro-batch taking its mean injected seconds (``--slow-factor`` times them on the slow
    node) plus ``compute_s`` (one micro-batch's forward and backward, measured alone at the
    start): sum over steps 1..target of G_k / sum over live ranks of 1 / t_r."""
    step = cell.get("target_step")
    if step is None:
        return {"bound_time_to_target": None}
    mean_draw = mean_delay(cfg.delay)
    slow_workers = set(slow["workers"]) if slow else set()
    total = 0.0
    for s in range(1, int(step) + 1):
        h = history.get(s)
        if h is None:
            continue
        rates = [
            1.0 / ((cfg.slow_factor if r in slow_workers else 1.0) * mean_draw + cfg.compute_s)
            for r in h["live"]
        ]
        total += h["micro_batches"] / sum(rates)
    ttt = cell.get("time_to_target")
    ratio = None if not ttt or not total else round(ttt / total, 3)
    return {"bound_time_to_target": round(total, 3), "time_to_target_over_bound": ratio}


def law_time(
    row: str,
    history: dict[int, dict[str, Any]],
    cell: dict[str, Any],
    cfg: argparse.Namespace,
    slow: dict[str, Any] | None,
    draws: int = 4000,
) -> dict[str, Any]:
    """The row's own rule under the bench's law with no overhead, to its target step: each
    step's expected time over ``draws`` seeded draws of its live ranks' micro-batches (the
    injected seconds, ``--slow-factor`` on the slow node, plus ``compute_s``). Sync (and the
    peers, which run sync) waits for its slowest rank's M; ``deal=demand`` deals the pool of
    N M in ask order, the step ending at its last unit (``strategies.rebalance.pool_end``,
    the rule ``StragglerStep`` runs). Between ``bound_time_to_target`` (every rank always
    busy) and the measured time: what the rule reaches before any communication."""
    step = cell.get("target_step")
    if step is None:
        return {"law_time_to_target": None}
    from tailtrain.strategies.rebalance import pool_end  # the parent loads no torch

    demand = "deal=demand" in ns.STRATEGY.get(row, "sync")
    fields = dict(re.findall(r"(\w+)=([0-9.eE+-]+)", cfg.delay))
    shift, scale = float(fields.get("shift", 0.0)), float(fields.get("scale", 0.0))
    slow_workers = set(slow["workers"]) if slow else set()
    m, pool = cfg.micro_batches, ns.WORKERS * cfg.micro_batches
    means: dict[tuple[int, ...], float] = {}
    total = 0.0
    for s in range(1, int(step) + 1):
        h = history.get(s)
        if h is None:
            continue
        live = tuple(h["live"])
        if live not in means:
            rng = np.random.default_rng([cfg.seed, len(live)])
            factor = np.array([cfg.slow_factor if r in slow_workers else 1.0 for r in live])
            units = pool if demand else m
            t = shift + rng.exponential(scale, (draws, len(live), units)) if scale else None
            t = np.full((draws, len(live), units), shift) if t is None else t
            t = t * factor[None, :, None] + cfg.compute_s
            if demand:
                means[live] = float(pool_end(np.cumsum(t, axis=-1), pool).mean())
            else:
                means[live] = float(t.sum(axis=-1).max(axis=-1).mean())
        total += means[live] * (h["micro_batches"] / (pool if demand else len(live) * m))
    ttt = cell.get("time_to_target")
    ratio = None if not ttt or not total else round(ttt / total, 3)
    return {"law_time_to_target": round(total, 3), "time_to_target_over_law": ratio}


def mean_delay(spec: str) -> float:
    """The mean of a ``shifted-exp:shift=A,scale=B`` micro-batch's seconds (A + B)."""
    fields = dict(re.findall(r"(\w+)=([0-9.eE+-]+)", spec))
    return float(fields.get("shift", 0.0)) + float(fields.get("scale", 0.0))


def calibrate_compute(cfg: argparse.Namespace, reps: int = 30) -> float:
    """One micro-batch's forward and backward of the task, one thread, the median of
    ``reps`` (in a child process: this one keeps torch unloaded)."""
    code = (
        "import sys, time, statistics, torch, torch.nn.functional as F\n"
        "sys.path.insert(0, sys.argv[1])\n"
        "from faults_peer import batch\n"
        "from tailtrain.core.scenario import Scenario, World\n"
        "torch.set_num_threads(1)\n"
        "w = World.build(Scenario(task='digits-cnn', workers=6, iterations=10, "
        "delay='shifted-exp:shift=0.01,scale=0.0025'), 0)\n"
        "m = w.task.module_at(w.task.init_params(0)); ts = []\n"
        f"for i in range({reps}):\n"
        "    x, y = batch(w, 0, i, 0)\n"
        "    t = time.perf_counter(); F.cross_entropy(m(x), y).backward()\n"
        "    ts.append(time.perf_counter() - t)\n"
        "print(statistics.median(ts))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(ROOT / "bench")],
        capture_output=True,
        text=True,
        timeout=300,
        env=ns.child_env(),
    )
    if done.returncode != 0:
        raise RuntimeError(f"the compute calibration failed: {done.stderr.strip()[-300:]}")
    return float(done.stdout.strip().splitlines()[-1])
