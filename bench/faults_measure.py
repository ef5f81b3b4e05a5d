"""The measures of ``bench_faults.py``'s runs: the commits of tailtrain's ranks from their
stamps (``commits_from_starts``), and one run's commits and final loss history made into the
figures ``bench_faults.py``'s docstring lists under "Measured" (``measure``), with the steps and
samples done twice, lost, counted or dropped by the rule (``accounting``).
``bench_faults_nodes.py`` measures its runs with them too."""

from __future__ import annotations

import argparse
import itertools
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

SMOOTH = 10  # steps in the loss's moving mean


def commits_from_starts(stamps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A tailtrain rank starting update s commits its previous one (same process)."""
    commits = []
    per_pid: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for r in stamps:
        per_pid[r["pid"]].append(r)
    for rows in per_pid.values():
        rows.sort(key=lambda r: r["t"])
        for prev, nxt in itertools.pairwise(rows):
            if nxt["step"] > prev["step"]:
                commits.append({**prev, "t": nxt["t"]})
    return commits


def measure(
    commits: list[dict[str, Any]],
    history: dict[int, dict[str, Any]],
    fault: dict[str, Any] | None,
    began: float,
    status: Any,
    cfg: argparse.Namespace,
    folder: Path,
    log_name: str,
    extra: dict[str, Any],
) -> dict[str, Any]:
    """The metrics of the module docstring from one run's commits and loss history."""
    result: dict[str, Any] = {"status": status, "wall": round(time.time() - began, 2)}
    if not commits:
        log = folder / log_name
        tail = log.read_text().strip().splitlines()[-3:] if log.exists() else []
        return {**result, "error": "no step committed", "log_tail": tail, **extra}
    initial: dict[int, int] = {}  # each worker's first process
    for c in sorted(commits, key=lambda c: c["t"]):
        initial.setdefault(c["worker"], c["pid"])
    t_first = min(c["t"] for c in commits)
    result["steps"] = len(history)
    result["last_step"] = max(history) if history else None
    result |= accounting(commits, history, cfg)
    # loss: moving mean over the final history; each step's time: its latest commit
    latest: dict[int, float] = {}
    for c in commits:
        latest[c["step"]] = max(latest.get(c["step"], 0.0), c["t"])
    series = sorted((s, h["loss"]) for s, h in history.items() if h["loss"] is not None)
    losses = np.array([v for _, v in series], dtype=float)
    if len(losses) >= SMOOTH:
        mean = np.convolve(losses, np.ones(SMOOTH) / SMOOTH, mode="valid")
        result["final_loss"] = round(float(mean[-1]), 4)
        hit = np.flatnonzero(mean <= cfg.target_loss)
        result["time_to_target"] = None
        for i in hit:
            step = series[i + SMOOTH - 1][0]
            if step in latest:
                result["time_to_target"] = round(latest[step] - t_first, 3)
                result["target_step"] = step
                # the fault's absent ranks up to the target, in steps of the whole world:
                # the allowance "what the dead rank's absence costs" of the goals
                gone = sum(absent_ranks(h, cfg) for s, h in history.items() if s <= step)
                result["absence_steps_to_target"] = round(gone / cfg.workers, 3)
                break
    if fault is None or fault.get("t") is None:
        result["fault"] = None if fault is None else fault
        return {**result, **extra}
    tf, w = float(fault["t"]), int(fault["worker"])
    result["fault"] = {k: fault[k] for k in ("kind", "worker", "step") if k in fault}
    before = [c["step"] for c in commits if c["worker"] == w and c["t"] <= tf]
    last_w = max(before) if before else -1
    nxt = [c["t"] for c in commits if c["t"] > tf and c["step"] > last_w]
    result["fault_to_next_step"] = round(min(nxt) - tf, 3) if nxt else None
    restarted = [c for c in commits if c["t"] > tf and c["pid"] != initial.get(c["worker"])]
    if restarted:
        result["restart_seconds"] = round(min(c["t"] for c in restarted) - tf, 3)
    back = [c for c in restarted if c["worker"] == w]
    if fault.get("kind") in ("kill", "heal") and back:
        first = min(back, key=lambda c: c["t"])
        others = [c["step"] for c in commits if c["worker"] != w and c["t"] <= first["t"]]
        result["heal_seconds"] = round(first["t"] - tf, 3)
        result["healed_at_step"] = first["step"]
        result["healed_behind"] = max(0, (max(others) if others else 0) - first["step"])
        moved = {c["worker"] for c in restarted if c["worker"] != w}
        result["heal_from"] = "checkpoint" if moved else "peer"
    return {**result, **extra}


def unit_samples(cfg: argparse.Namespace) -> int:
    """Samples one rank computes in a step of every row: M micro-batches of the batch."""
    return int(getattr(cfg, "micro_batches", 1)) * cfg.batch


def absent_ranks(step: dict[str, Any], cfg: argparse.Namespace) -> int:
    """Ranks of the N missing from one step of the final history because of the fault."""
    return max(0, int(step.get("absent", cfg.workers - step["contributors"])))


def accounting(
    commits: list[dict[str, Any]], history: dict[int, dict[str, Any]], cfg: argparse.Namespace
) -> dict[str, Any]:
    """Steps and samples done twice or lost. Done twice: a (worker, step) committed by two
    processes (a restart replaying from its checkpoint; a rank's step in flight when the fault
    came is computed again, never committed twice, so it is not counted). Lost: samples of the
    N ranks' shards that the final history neither used nor counted as skipped (the record's
    ``skipped``; a peer counts none), plus whole steps missing from it. Dropped by the rule:
    the micro-batches a threshold cut (DropCompute's Eq. 1 weighs a rank by what it
    completed), counted apart and not lost."""
    unit = unit_samples(cfg)
    per_rank = {s: int(h.get("per_rank", unit)) for s, h in history.items()}
    seen: dict[tuple[int, int], int] = defaultdict(int)
    for c in commits:
        seen[(c["worker"], c["step"])] += 1
    twice = {k: n - 1 for k, n in seen.items() if n > 1}
    absent = sum(absent_ranks(h, cfg) * per_rank[s] for s, h in history.items())
    counted = sum(int(h.get("counted", 0)) for h in history.values())
    missing = [s for s in range(max(history) + 1) if s not in history] if history else []
    return {
        "steps_replayed": len({step for _, step in twice}),
        "samples_replayed": sum(n * per_rank.get(s, unit) for (_, s), n in twice.items()),
        "samples_absent": absent,
        "samples_counted_skipped": counted,
        "samples_dropped_by_rule": sum(int(h.get("dropped", 0)) for h in history.values()),
        "steps_lost": len(missing),
        "samples_lost": max(0, absent - counted) + len(missing) * cfg.workers * unit,
    }
