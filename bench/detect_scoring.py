"""How ``bench_detect.py``'s drills are scored: the peers' rules on the sections every drill
recorded (NVIDIA's resiliency extension's documented straggler rule and TraceML's, each
implemented here, named as such, since ``nvidia_resiliency_ext.straggler`` needs CUDA:
``nvidia_error`` quotes what the real package says on this machine), and each detector's
precision, recall and seconds to a correct report against the drills' truth
(``bench_detect.py``'s docstring tells the rules and the goals)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from scipy import stats

from tailtrain.persistence import MIN_EFFECT

if TYPE_CHECKING:
    from bench.bench_detect import Drill

PEER_WINDOW = 5  #: steps per report window of the peers' rules
NVIDIA_THRESHOLD, TRACEML_SKEW = 0.75, 0.10


# ---- the peers' rules, on the sections every drill recorded ----------------------------
def nvidia_rule(sections: list, steps: int) -> list[dict]:
    """Per window of PEER_WINDOW steps of a drill's ``steps``: a rank is a straggler when a
    section's relative score (fastest rank's median / its median) or individual score (its
    best median so far / its current median) is below 0.75
    (nvidia_resiliency_ext.straggler Report.identify_stragglers defaults), sections
    data_loading and fwd."""
    out, best = [], {}
    data = np.array([s[0] for s in sections]).T  # steps x ranks
    fwd = np.array([s[1] for s in sections]).T
    for end in range(PEER_WINDOW, steps + 1, PEER_WINDOW):
        named = {}
        for name, table in (("data_loading", data), ("fwd", fwd)):
            median = np.median(table[end - PEER_WINDOW : end], axis=0)
            relative = median.min() / median
            best[name] = np.minimum(best.get(name, median), median)
            individual = best[name] / median
            for r in np.flatnonzero(
                (relative < NVIDIA_THRESHOLD) | (individual < NVIDIA_THRESHOLD)
            ):
                named[int(r)] = "straggler"
        out.append({"step": end, "named": named})
    return out


def traceml_rule(history: np.ndarray, steps: int) -> list[dict]:
    """Per window of a drill's ``steps``: the rank that waited least is the culprit, named at
    a skew of 10%."""
    out = []
    for end in range(PEER_WINDOW, steps + 1, PEER_WINDOW):
        window = history[end - PEER_WINDOW : end]
        own = np.median(window[:, :, 0] + window[:, :, 1], axis=0)
        wait = np.median(window[:, :, 2], axis=0)
        skew = (own.max() - own.min()) / own.max()
        named = {int(np.argmin(wait)): "straggler"} if skew >= TRACEML_SKEW else {}
        out.append({"step": end, "named": named})
    return out


# ---- scoring ------------------------------------------------------------------------------------
def score(plan: list[Drill], verdicts: list[list[dict]], times: list[list[float]], kinds: bool):
    """Precision/recall of named ranks (and verdicts when ``kinds``) at each drill's end, and
    the seconds to the first fully correct report."""
    tp = fp = fn = vtp = vfp = vfn = 0
    latency, missed = [], 0
    for drill, reports, when in zip(plan, verdicts, times, strict=True):
        final = reports[-1]["named"] if reports else {}
        final = {int(k): v for k, v in final.items()}
        truth = drill.truth
        tp += len(final.keys() & truth.keys())
        fp += len(final.keys() - truth.keys())
        fn += len(truth.keys() - final.keys())
        if kinds:
            right = {r for r in final if truth.get(r) == final[r]}
            vtp += len(right)
            vfp += len(final) - len(right)
            vfn += len(truth.keys() - right)
        if truth:
            hit = [
                t
                for rep, t in zip(reports, when, strict=True)
                if _correct(rep["named"], truth, kinds)
            ]
            latency.append(hit[0]) if hit else None
            missed += not hit
    row = {
        "ranks_tp": tp,
        "ranks_fp": fp,
        "ranks_fn": fn,
        "rank_precision": _ratio(tp, tp + fp),
        "rank_recall": _ratio(tp, tp + fn),
    }
    if kinds:
        row |= {
            "verdict_precision": _ratio(vtp, vtp + vfp),
            "verdict_recall": _ratio(vtp, vtp + vfn),
        }
    else:
        row |= {"verdict_precision": None, "verdict_recall": None}
    row |= {
        "seconds_to_correct_median": float(np.median(latency)) if latency else None,
        "seconds_to_correct_max": float(np.max(latency)) if latency else None,
        "drills_never_correct": missed,
    }
    return row


def _correct(named: dict, truth: dict, kinds: bool) -> bool:
    named = {int(k): v for k, v in named.items()}
    return named == truth if kinds else named.keys() == truth.keys()


def _ratio(a: int, b: int) -> float | None:
    return a / b if b else None


def noise(result: dict) -> float:
    """The largest over ranks of the median seconds a step took beyond its injected sleeps
    (measured own time - injected): the machine's noise in this drill."""
    history = np.array(result["history"])
    own = history[:, :, 0] + history[:, :, 1]
    injected = np.array([s[2] for s in result["sections"]]).T
    return float(np.median(own - injected, axis=0).max())


def median_ci(values: np.ndarray) -> list[float]:
    """A distribution-free 95% confidence interval of the median: the order statistics at
    the binomial(n, 1/2) quantiles."""
    ordered = np.sort(values)
    n = len(ordered)
    low = max(int(stats.binom.ppf(0.025, n, 0.5)) - 1, 0)
    high = min(int(stats.binom.ppf(0.975, n, 0.5)), n - 1)
    return [round(float(ordered[low]), 4), round(float(ordered[high]), 4)]


def healthy_slowdown(plan: list[Drill], results: list[dict]) -> dict:
    """The slowdowns the probe's last report gives the ranks that are healthy in truth (no
    stall drill counted): the noise the rule's least effect (``persistence.MIN_EFFECT``) must
    sit above."""
    found = [
        value
        for d, r in zip(plan, results, strict=True)
        if r["reports"] and d.kind != "stall"
        for rank, value in r["reports"][-1]["slowdown"].items()
        if int(rank) not in d.truth
    ]
    if not found:
        return {}
    return {
        "ranks": len(found),
        "median": round(float(np.median(found)), 4),
        "p99": round(float(np.quantile(found, 0.99)), 4),
        "max": round(float(np.max(found)), 4),
        "min_effect": MIN_EFFECT,
    }


def evaluate(
    plan: list[Drill], results: list[dict], steps: int, only: list[int] | None = None
) -> list[dict]:
    """Every detector's row over the drills ``only`` (default: all), each drill ``steps``
    steps long."""
    if only is not None:
        plan, results = [plan[i] for i in only], [results[i] for i in only]
    detectors = {
        "tailtrain-probe": ([], [], True),
        "nvidia-resiliency-ext rule (implemented here)": ([], [], False),
        "TraceML rule (implemented here)": ([], [], False),
    }
    for res in results:
        history = np.array(res["history"])
        step_time = res["wall"] / steps
        ours = detectors["tailtrain-probe"]
        ours[0].append(res["reports"])
        ours[1].append([r["elapsed"] for r in res["reports"]])
        for name, found in (
            (
                "nvidia-resiliency-ext rule (implemented here)",
                nvidia_rule(res["sections"], steps),
            ),
            ("TraceML rule (implemented here)", traceml_rule(history, steps)),
        ):
            detectors[name][0].append(found)
            detectors[name][1].append([r["step"] * step_time for r in found])
    rows = []
    goal_set = [i for i, d in enumerate(plan) if "1.1x" not in d.kind]
    for name, (verdicts, times, kinds) in detectors.items():
        row = {"detector": name, **score(plan, verdicts, times, kinds)}
        sub = score(
            [plan[i] for i in goal_set],
            [verdicts[i] for i in goal_set],
            [times[i] for i in goal_set],
            kinds,
        )
        row["at_1.2x_and_more"] = sub
        row["per_kind"] = {
            kind: score(
                [plan[i] for i in idx], [verdicts[i] for i in idx], [times[i] for i in idx], kinds
            )
            for kind in dict.fromkeys(d.kind for d in plan)
            for idx in [[i for i, d in enumerate(plan) if d.kind == kind]]
        }
        precision, recall = sub["rank_precision"], sub["rank_recall"]
        late = sub["seconds_to_correct_max"]
        row["goals_met"] = bool(
            precision is not None
            and precision >= 0.99
            and recall is not None
            and recall >= 0.95
            and (
                not kinds
                or (
                    (sub["verdict_precision"] or 0) >= 0.99 and (sub["verdict_recall"] or 0) >= 0.95
                )
            )
            and sub["drills_never_correct"] == 0
            and late is not None
            and late <= 30
        )
        rows.append(row)
    return rows


def nvidia_error() -> str:
    """What the real package says on this machine."""
    try:
        import nvidia_resiliency_ext.straggler as straggler

        straggler.Detector.initialize(scores_to_compute="all", gather_on_rank0=True)
        straggler.Detector.shutdown()
        return "nvidia_resiliency_ext.straggler.Detector.initialize() succeeded"
    except Exception as exc:  # the exact error is the finding
        return f"{type(exc).__name__}: {exc}"
