"""The goals of ``bench_rebalance.py`` (issue 25's "Done when", as booleans), scored from its
simulate part: per scenario and rebalance spec, its time against its own optimal time
(``rebalance_bounds.optimal_time``), its rate against sync's and DropCompute's, its drops, its
time to target and, in (c), its accuracy on the slow ranks' classes; in (d) its cost against
DropCompute."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench import rebalance_bounds as rb  # noqa: E402
from bench import rebalance_setting as rs  # noqa: E402


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
        "time_over_optimal": time / rb.optimal_time(part, spec),
        "time_over_optimal_share": time / optimal,
        "samples_per_s_over_sync": rate / mean(part, rs.SYNC, "samples_per_s"),
        "samples_per_s_over_dropcompute": rate / mean(part, rs.DROPCOMPUTE, "samples_per_s"),
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
        bar = max(mean(part, rs.DROPCOMPUTE, key), mean(part, rs.SYNC, key)) if learned else None
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
            for spec in rs.REBALANCE:
                ratio = mean(part, spec, "samples_per_s") / mean(
                    part, rs.DROPCOMPUTE, "samples_per_s"
                )
                out[name][spec] = {
                    "samples_per_s_over_dropcompute": ratio,
                    "costs_at_most_2pct_vs_dropcompute": ratio >= 0.98,
                }
            out[name]["met"] = any(
                v["costs_at_most_2pct_vs_dropcompute"] for v in out[name].values()
            )
            continue
        out[name] = {spec: persistent_goals(part, spec, name == "c") for spec in rs.REBALANCE}
        verdicts = [out[name][spec]["all"] for spec in rs.REBALANCE]
        out[name]["met"] = True if True in verdicts else None if None in verdicts else False
    return out
