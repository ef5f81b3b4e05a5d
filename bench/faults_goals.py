"""The goals of ``bench_faults.py`` (issue 26's "Done when"), scored from a report's rows: each
goal's verdict with its rule and its figures by shrink row, or null with why when a row or a
figure is missing (the "Goals" paragraph of ``bench_faults.py``'s docstring). Its helpers
(``blocked``, ``figure``, ``best``, ``compared``, ``verdict``) score ``bench_faults_nodes.py``'s
goals too."""

from __future__ import annotations

import argparse
from typing import Any

#: the shrink rows and their rules: "tailtrain" in the goals (``bench_faults.py`` runs them)
SHRINK = {
    "tailtrain-shrink-sync": "sync",
    "tailtrain-shrink-dropcompute": "dropcompute:threshold=auto",
    "tailtrain-shrink-eager": "eager:mode=majority",
    "tailtrain-shrink-rebalance": "rebalance",
    "tailtrain-shrink-rebalance-dropcompute": "rebalance:then=dropcompute",
}
TORCHFT = ("torchft-default", "torchft-tuned")
GOAL_DRILLS = ("none", "kill", "stop", "freeze", "heal")


def blocked(row: dict[str, Any] | None) -> str | None:
    """Why a row has no runs (not selected, not available, refused at start), or None."""
    if row is None:
        return "not selected (--rows)"
    return row.get("unavailable") or row.get("refused")


def figure(rows: dict[str, dict[str, Any]], row: str, drill: str, key: str) -> float | None:
    value = rows.get(row, {}).get(drill, {}).get(key)
    return None if value is None else float(value)


def best(rows: dict[str, dict[str, Any]], names: tuple[str, ...], drill: str, key: str) -> Any:
    """The smallest of ``key`` over rows ``names`` at ``drill``, or None if none has it."""
    values = [v for v in (figure(rows, r, drill, key) for r in names) if v is not None]
    return min(values) if values else None


def compared(
    has: bool, mine: float | None, other: float | None, whose: str, ok: Any
) -> dict[str, Any]:
    """One row's verdict against a peer's figure: None (with why) when the drill did not run
    or the peer has no figure; False when the row has none (the fault had no next step)."""
    if not has:
        return {"holds": None, "why": "this drill did not run"}
    if other is None:
        return {"holds": None, "why": f"no figure of {whose}"}
    return {"holds": mine is not None and bool(ok(mine, other))}


def verdict(per_row: dict[str, dict[str, Any]], rule: str, every: bool = True) -> Any:
    """A goal over the shrink rows: each row's ``holds`` (None: a figure it needs is missing);
    the goal holds when every row that has a verdict holds (``every``) or when one row does."""
    known = {r: v["holds"] for r, v in per_row.items() if v["holds"] is not None}
    if not known:
        whys = sorted({v.get("why", "") for v in per_row.values()} - {""})
        return {
            "holds": None,
            "rule": rule,
            "why": "; ".join(whys) or "no figures",
            "by_row": per_row,
        }
    holds = all(known.values()) if every else any(known.values())
    return {"holds": holds, "rule": rule, "by_row": per_row}


Rows = dict[str, dict[str, Any]]


def goals(rows: Rows, cfg: argparse.Namespace) -> dict[str, Any]:
    """Issue 26's Done-when goals, each a boolean computed from this run's rows with its
    figures, or null with why (a row not selected, refused at start, or a figure missing).
    "tailtrain" is every shrink row that ran (sync, DropCompute, eager): a latency or
    accounting goal holds when it holds for each of them; a time-to-target goal when it holds
    for one of them on every drill (the straggler-tolerant rule is the one meant)."""
    ran = [r for r in SHRINK if blocked(rows.get(r)) is None]
    if not ran:
        why = "no shrink row ran: " + "; ".join(f"{r}: {blocked(rows.get(r))}" for r in SHRINK)
        return {name: {"holds": None, "why": why} for name in GOAL_NAMES}
    out: dict[str, Any] = {}
    for drill in ("kill", "stop"):
        out |= next_step_goals(rows, ran, drill)
    return (
        out
        | freeze_goals(rows, ran)
        | heal_goal(rows, ran)
        | books_goal(rows, ran)
        | (target_goals(rows, ran))
    )


def next_step_goals(rows: Rows, ran: list[str], drill: str) -> dict[str, Any]:
    """After a SIGKILL or a SIGSTOP: no later than torchft's best, 5x sooner than the restart."""
    theirs = best(rows, TORCHFT, drill, "fault_to_next_step")
    before = figure(rows, "tailtrain-before", drill, "fault_to_next_step")
    near, fast = {}, {}
    for r in ran:
        mine = figure(rows, r, drill, "fault_to_next_step")
        has = drill in rows[r]
        near[r] = compared(has, mine, theirs, "torchft", lambda m, o: m <= o)
        near[r] |= {"tailtrain": mine, "torchft_best": theirs}
        fast[r] = compared(has, mine, before, "tailtrain-before", lambda m, o: 5 * m <= o)
        ratio = None if not mine or before is None else round(before / mine, 2)
        fast[r] |= {"tailtrain": mine, "before": before, "before_over_tailtrain": ratio}
    return {
        f"{drill}_next_step_no_later_than_torchft": verdict(
            near, "fault_to_next_step <= the smaller of torchft default's and tuned's"
        ),
        f"{drill}_next_step_5x_sooner_than_restart": verdict(
            fast, "5 * fault_to_next_step <= tailtrain-before's"
        ),
    }


def freeze_goals(rows: Rows, ran: list[str]) -> dict[str, Any]:
    """After a frozen thread: within the learned deadline + 1 s, sooner than both torchfts."""
    theirs = {r: figure(rows, r, "freeze", "fault_to_next_step") for r in TORCHFT}
    missing = [t for t, v in theirs.items() if v is None]
    within, sooner = {}, {}
    for r in ran:
        mine = figure(rows, r, "freeze", "fault_to_next_step")
        has = "freeze" in rows[r]
        deadline = rows[r].get("freeze", {}).get("hang_deadline_s")
        within[r] = compared(
            has,
            mine,
            deadline,
            "summary.json's hang_deadline (the learned deadline; this run does not record it)",
            lambda m, o: m <= float(o) + 1.0,
        )
        within[r] |= {"tailtrain": mine, "hang_deadline_s": deadline}
        within[r]["deadlines_logged_s"] = rows[r].get("freeze", {}).get("deadlines_logged_s")
        worst = None if missing else min(v for v in theirs.values() if v is not None)
        sooner[r] = compared(has, mine, worst, " and ".join(missing), lambda m, o: m < o)
        sooner[r] |= {"tailtrain": mine, "torchft": theirs}
    return {
        "freeze_within_deadline_plus_1s": verdict(
            within, "fault_to_next_step <= summary.json's hang_deadline + 1"
        ),
        "freeze_sooner_than_torchft_default_and_tuned": verdict(
            sooner, "fault_to_next_step < torchft default's and < tuned's"
        ),
    }


def heal_goal(rows: Rows, ran: list[str]) -> dict[str, Any]:
    """A returning rank heals from a live peer, no slower than torchft's best heal."""
    theirs = best(rows, TORCHFT, "heal", "heal_seconds")
    heal = {}
    for r in ran:
        source = rows[r].get("heal", {}).get("heal_from")
        mine = figure(rows, r, "heal", "heal_seconds")
        heal[r] = compared(
            "heal" in rows[r],
            mine,
            theirs,
            "torchft",
            lambda m, o, peer=source == "peer": m <= o and peer,
        )
        heal[r] |= {"tailtrain": mine, "torchft_best": theirs, "heal_from": source}
    return {
        "heal_no_slower_than_torchft": verdict(
            heal, "heal_seconds <= the smaller of torchft's, healed from a peer"
        )
    }


def books_goal(rows: Rows, ran: list[str]) -> dict[str, Any]:
    """No sample lost (absent and uncounted) or done twice, beyond the step in flight. The
    samples a rule's threshold dropped are shown beside, not scored: the record counts them
    (``completed``), and dropping them is the rule (DropCompute), not a fault's loss."""
    books = {}
    keys = ("samples_replayed", "samples_lost", "steps_lost")
    for r in ran:
        figures = {d: {k: rows[r][d].get(k) for k in keys} for d in GOAL_DRILLS if d in rows[r]}
        bad = [d for d, f in figures.items() if any(v != 0 for v in f.values())]
        for d, f in figures.items():
            f["samples_dropped_by_rule"] = rows[r][d].get("samples_dropped_by_rule")
        books[r] = {"holds": not bad, "by_drill": figures} if figures else {"holds": None}
        books[r] |= {} if figures else {"why": "no run"}
    return {
        "no_sample_lost_or_done_twice": verdict(
            books, "samples_replayed == samples_lost == steps_lost == 0 on every drill"
        )
    }


def target_goals(rows: Rows, ran: list[str]) -> dict[str, Any]:
    """Time to the target loss with the straggler and the drills: at most 0.67x torchft's
    best, and within 10% of the row's own calm run plus what the absent ranks cost."""
    ratio = {r: target_vs_torchft(rows, r) for r in ran}
    calm = {r: target_vs_calm(rows, r) for r in ran}
    both = [r for r in ran if ratio[r]["holds"] and calm[r]["holds"]]
    return {
        "time_to_target_at_most_0.67x_torchft": verdict(
            ratio,
            "time_to_target / the smaller of torchft's <= 0.67 on every drill "
            "(none included: the straggler alone), for at least one shrink row",
            every=False,
        ),
        "time_to_target_within_10pct_of_calm_plus_absence": verdict(
            calm,
            "time_to_target <= 1.10 * the same row's none-drill time_to_target + "
            "absence_steps_to_target * that run's seconds per step to target (the absent "
            "ranks' work in whole-world steps), on every drill, for at least one shrink row",
            every=False,
        ),
        "time_to_target_goals_same_row": {"holds": bool(both), "rows": both},
    }


def target_vs_torchft(rows: Rows, r: str) -> dict[str, Any]:
    mine = {d: figure(rows, r, d, "time_to_target") for d in GOAL_DRILLS if d in rows[r]}
    theirs = {d: best(rows, TORCHFT, d, "time_to_target") for d in mine}
    ratios = {d: None if mine[d] is None or not theirs[d] else mine[d] / theirs[d] for d in mine}
    known = [v for d, v in ratios.items() if theirs[d] is not None]
    cell = {"ratios": {d: v if v is None else round(v, 3) for d, v in ratios.items()}}
    cell |= {"tailtrain": mine, "torchft_best": theirs}
    if not known:
        return {"holds": None, "why": "no torchft time to target", **cell}
    return {"holds": all(v is not None and v <= 0.67 for v in known), **cell}


def target_vs_calm(rows: Rows, r: str) -> dict[str, Any]:
    mine = {d: figure(rows, r, d, "time_to_target") for d in GOAL_DRILLS if d in rows[r]}
    base, step = mine.get("none"), figure(rows, r, "none", "target_step")
    if not base or not step or len(mine) < 2:
        return {
            "holds": None,
            "why": "no none-drill time to target, or no drill",
            "tailtrain": mine,
        }
    per_step = base / step
    gone = {d: figure(rows, r, d, "absence_steps_to_target") or 0.0 for d in mine if d != "none"}
    # a drill whose run never reached the target has no absence figure (0): it fails anyway
    limits = {d: round(1.10 * base + g * per_step, 3) for d, g in gone.items()}
    holds = all(mine[d] is not None and mine[d] <= lim for d, lim in limits.items())
    return {
        "holds": holds,
        "tailtrain": mine,
        "limit": limits,
        "calm_seconds_per_step": round(per_step, 4),
        "absence_steps_to_target": gone,
    }


GOAL_NAMES = (
    "kill_next_step_no_later_than_torchft",
    "kill_next_step_5x_sooner_than_restart",
    "stop_next_step_no_later_than_torchft",
    "stop_next_step_5x_sooner_than_restart",
    "freeze_within_deadline_plus_1s",
    "freeze_sooner_than_torchft_default_and_tuned",
    "heal_no_slower_than_torchft",
    "no_sample_lost_or_done_twice",
    "time_to_target_at_most_0.67x_torchft",
    "time_to_target_within_10pct_of_calm_plus_absence",
)
