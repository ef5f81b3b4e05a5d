"""The goals of ``bench_faults_nodes.py`` (issue 37's first Done-when item), scored from a
report's rows with ``faults_goals.py``'s helpers: each goal's verdict with its rule and its
figures by tailtrain row, or null with why when a row or a figure is missing; a drill run
several times is read at its median run, every run's figure beside it (``runs_of``)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench import faults_goals as fg  # noqa: E402
from bench import faults_nodes_setting as ns  # noqa: E402

Rows = dict[str, dict[str, Any]]
GOAL_NAMES = (
    "kill_next_step_no_later_than_torchft",
    "stop_next_step_no_later_than_torchft",
    "global_batch_kept_after_fault_deal_demand",
    "no_sample_lost_or_done_twice",
    "slow_time_to_target_at_most_0.85x_torchft",
    "slow_time_to_target_within_10pct_of_bound",
    "heal_no_slower_than_torchft",
)


def goals(rows: Rows) -> dict[str, Any]:
    """Issue 37's first Done-when goals from this run's rows, each with its rule and figures,
    null with why when a row or figure is missing. Over the tailtrain rows that ran: the
    latency, accounting and heal goals must hold for each; the slow node's time-to-target
    goals for one of them (the straggler-tolerant rule is the one meant)."""
    ran = [r for r in ns.TAILTRAIN if fg.blocked(rows.get(r)) is None]
    out: dict[str, Any] = {}
    if not ran:
        why = "no tailtrain row ran: " + "; ".join(
            f"{r}: {fg.blocked(rows.get(r))}" for r in ns.TAILTRAIN
        )
        return {name: {"holds": None, "why": why} for name in GOAL_NAMES}
    for drill in ("kill", "stop"):
        theirs = fg.best(rows, ns.TORCHFT, drill, "fault_to_next_step")
        per = {}
        for r in ran:
            mine = fg.figure(rows, r, drill, "fault_to_next_step")
            per[r] = fg.compared(drill in rows[r], mine, theirs, "torchft", lambda m, o: m <= o)
            per[r] |= {"tailtrain": mine, "torchft_best": theirs}
        out[f"{drill}_next_step_no_later_than_torchft"] = fg.verdict(
            per, "fault_to_next_step <= the smaller of torchft default's and tuned's"
        )
    out["global_batch_kept_after_fault_deal_demand"] = batch_goal(rows)
    out["no_sample_lost_or_done_twice"] = books_goal(rows, ran)
    out |= slow_goals(rows, ran)
    theirs = fg.best(rows, ns.TORCHFT, "heal", "heal_seconds")
    heal = {}
    for r in ran:
        cell = rows[r].get("heal", {})
        mine, source = cell.get("heal_seconds"), cell.get("heal_from")
        failed = cell.get("repeats_failed", 0)  # a run of several that did not heal fails it
        heal[r] = fg.compared(
            "heal" in rows[r],
            mine,
            theirs,
            "torchft",
            lambda m, o, p=(source == "peer" and not failed): m <= o and p,
        )
        heal[r] |= {"tailtrain": mine, "torchft_best": theirs, "heal_from": source}
        heal[r] |= runs_of(cell, "heal_seconds")
    out["heal_no_slower_than_torchft"] = fg.verdict(
        heal,
        "heal_seconds <= the smaller of torchft's, healed from a live peer (of a drill run "
        "several times: the medians, and every run healed)",
    )
    return out


def runs_of(cell: dict[str, Any], key: str) -> dict[str, Any]:
    """A drill run several times: every run's ``key``, for the goal's record (else nothing)."""
    if "repeats" not in cell:
        return {}
    return {"runs": [run.get(key) for run in cell["repeats"]], "failed": cell["repeats_failed"]}


def batch_goal(rows: Rows) -> dict[str, Any]:
    """deal=demand's global batch after a fault equal to before it; every row's shown."""
    shown = {
        r: {d: cell.get("global_batch") for d, cell in rows[r].items() if isinstance(cell, dict)}
        for r in ns.ROWS
        if r in rows and fg.blocked(rows[r]) is None
    }
    row = rows.get("tailtrain-deal-demand")
    if fg.blocked(row) is not None:
        return {
            "holds": None,
            "why": f"tailtrain-deal-demand: {fg.blocked(row)}",
            "rule": "global_batch.after_min == global_batch.before on kill, stop and heal",
            "by_row": shown,
        }
    per = {
        d: (row[d]["global_batch"] or {}).get("after_min")
        == (row[d]["global_batch"] or {}).get("before")
        for d in ("kill", "stop", "heal")
        if d in row
    }
    return {
        "holds": bool(per) and all(per.values()),
        "rule": "global_batch.after_min == global_batch.before on kill, stop and heal",
        "by_drill": per,
        "by_row": shown,
    }


def books_goal(rows: Rows, ran: list[str]) -> dict[str, Any]:
    """No sample lost (absent and not counted by the record) or done twice, on every drill;
    ``samples_absent`` (the node's samples no rank computed) shown beside."""
    keys = ("samples_replayed", "samples_lost", "steps_lost")
    per = {}
    for r in ran:
        figures = {
            d: {k: rows[r][d].get(k) for k in (*keys, "samples_absent")}
            for d in ns.DRILLS
            if d in rows[r]
        }
        bad = [d for d, f in figures.items() if any(f[k] != 0 for k in keys)]
        bad += [  # a drill run several times: every run's books, not only the median's
            f"{d} (run {i + 1})"
            for d in ns.DRILLS
            for i, run in enumerate(rows[r].get(d, {}).get("repeats", []))
            if any(run.get(k) != 0 for k in keys)
        ]
        per[r] = {"holds": not bad, "by_drill": figures} if figures else {"holds": None}
        per[r] |= {"bad": bad} if bad else {}
        per[r] |= {} if figures else {"why": "no run"}
    return fg.verdict(per, "samples_replayed == samples_lost == steps_lost == 0 on every drill")


def slow_goals(rows: Rows, ran: list[str]) -> dict[str, Any]:
    """With node W 1.5x slower: time to target at most 0.85x torchft's best, and within 10%
    of the bench's bound (the row's own ``bound_time_to_target``)."""
    theirs = fg.best(rows, ns.TORCHFT, "slow", "time_to_target")
    ratio, bound = {}, {}
    for r in ran:
        has = "slow" in rows[r]
        mine = fg.figure(rows, r, "slow", "time_to_target")
        failed = rows[r].get("slow", {}).get("repeats_failed", 0)
        ratio[r] = fg.compared(
            has, mine, theirs, "torchft", lambda m, o, f=failed: m <= 0.85 * o and not f
        )
        ratio[r] |= {"tailtrain": mine, "torchft_best": theirs}
        ratio[r] |= runs_of(rows[r].get("slow", {}), "time_to_target")
        ratio[r]["ratio"] = None if not mine or not theirs else round(mine / theirs, 3)
        limit = fg.figure(rows, r, "slow", "bound_time_to_target")
        bound[r] = fg.compared(has, mine, limit, "the bound", lambda m, o: m <= 1.10 * o)
        # the rule's own law, no communication: how much of the gap the rule leaves
        law = fg.figure(rows, r, "slow", "law_time_to_target")
        bound[r] |= {"tailtrain": mine, "bound": limit, "rule_law": law}
        bound[r]["ratio"] = None if not mine or not limit else round(mine / limit, 3)
    return {
        "slow_time_to_target_at_most_0.85x_torchft": fg.verdict(
            ratio, "slow time_to_target <= 0.85 * the smaller of torchft's", every=False
        ),
        "slow_time_to_target_within_10pct_of_bound": fg.verdict(
            bound, "slow time_to_target <= 1.10 * bound_time_to_target", every=False
        ),
    }
