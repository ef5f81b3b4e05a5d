"""Does `advise`'s forecast come true? Advise on a `train` trace, then train what it says.

    nice -n 10 python bench/bench_advise.py            # human-readable lines
    nice -n 10 python bench/bench_advise.py --json     # one JSON object
    nice -n 10 python bench/bench_advise.py --quick    # shorter runs, fewer pairs

Two cases, 4 ranks and ``--micro-batches 4`` each: ``seq-lstm`` with no injected delay (its
heavy-tailed sequence lengths and its communication are the whole story) and ``digits-cnn``
with injected delays (:data:`CASES`). For each:

1. ``train --strategy sync`` for ``--budget`` wall seconds, ``--traces`` times (identical
   runs), and ``advise --trace trace.csv --json`` on each: the recommendations
   (``recommendations``, goal: all the same), and for the first run its sync E[T] against the
   run's own measured mean iteration time (``sync_forecast_ratio``, goal within 5% of 1).
2. ``train`` with the first run's recommendation and with ``sync``, in ``--pairs``
   alternating pairs (each side first in every other pair), each for the same budget. A run's
   rate is the worker gradients it applied per wall second (micro-batches done / M over the
   rounds' wall seconds, as ``advise``'s effective speedup counts them); a pair's realised
   speed-up is the recommendation's rate over sync's. ``realised_speedup`` is the median over
   the pairs, ``predicted_speedup`` advise's effective speedup of its recommendation (its
   ``+-`` uncertainty alongside), and ``predicted_over_realised`` their ratio (goal within
   10% of 1). ``unit_seconds_ratio`` (median over the pairs) is a micro-batch's mean measured
   compute seconds under the recommendation over sync's: the forecast replays sync's, so a
   ratio above 1 is compute that the recommendation itself slowed (ranks that no longer wait
   share the cores with the others), which the forecast cannot see.

3. **Across strategies** (issue 36): the same pairs also run the best DropCompute row and the
   best Local-SGD row of the first sync trace's advice, as advise wrote them. For each
   (``cross``): the forecast mean iteration time over the measured (``time_ratio``, goal
   within 5% of 1 on a quiet machine) and predicted over realised speed-up (goal within 10%).
   The other way round, ``advise`` on the traces of :data:`CUTTING` runs (DropCompute set to
   cut a fifth of the micro-batches, so that their traces are censored: the best row's
   threshold cuts next to nothing) forecasts sync's mean iteration time, against the
   measured sync runs' (``sync_from_dropcompute``, goal within 5%; ``censored_share``, the
   share of the trace's rows it cut; the cutting runs' own mean iteration time beside it).
4. **The machine** (``load``): the load averages before and after each case, and whether
   advise printed its one-line contention warning (``contention_warned``): under a load of
   twice the cores or more, a forecast off by more than 15% needs it.

``--workers 2`` on two cores gives each rank a core (the quiet case); the default, 4, shares
them two to a core.

Every figure is a ratio of two runs made close together on the same machine; the machine is
shared and loaded, so single runs move by 10-30%: the pairs and the median are there for that.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

MICRO_BATCHES, SEED = 4, 0
#: name -> the flags of its runs besides the strategy and budget
CASES = {
    "seq-lstm": ["--task", "seq-lstm"],
    "digits-cnn-injected": [
        "--task", "digits-cnn", "--delay", "const:value=0.01+dropcompute-noise:scale=0.01",
    ],
}  # fmt: skip


#: the DropCompute run whose censored trace forecasts sync (a fifth of the micro-batches cut)
CUTTING = "dropcompute:drop-rate=0.2"


def cli(*args: str) -> str:
    """One ``tailtrain`` command in a subprocess (this tree's PYTHONPATH); its stdout."""
    command = [sys.executable, "-m", "tailtrain", *args]
    return subprocess.run(
        command, check=True, env=os.environ, capture_output=True, text=True
    ).stdout


def train(case: list[str], strategy: str, budget: float, folder: Path, workers: int) -> dict:
    """A run's summary and its rate of applied worker gradients per wall second."""
    cli("train", *case, "--strategy", strategy, "--workers", str(workers),
        "--micro-batches", str(MICRO_BATCHES), "--time-budget", str(budget),
        "--eval-every", "1000000", "--seed", str(SEED), "--out", str(folder),
        "--no-progress", "--overwrite")  # fmt: skip
    summary = json.loads((folder / "summary.json").read_text())
    steps = [json.loads(line) for line in (folder / "steps.jsonl").read_text().splitlines()]
    applied = sum(sum(r["completed"]) / r["micro_batches"] for r in steps)
    wall = sum(r["step_time"] for r in steps)
    trace = np.genfromtxt(folder / "trace.csv", delimiter=",", names=True)
    unit = float(np.mean(trace["seconds"]))  # a micro-batch's measured compute seconds
    return {"summary": summary, "rate": applied / wall, "rounds": len(steps), "unit": unit}


def advise(trace: Path) -> dict:
    return json.loads(cli("advise", "--trace", str(trace), "--json"))


def best(advice: dict, family: str) -> dict:
    """The first row (the best forecast) of ``family`` in ``advice``'s results."""
    rows = [r for r in advice["results"] if r["spec"].split(":")[0] == family]
    if not rows:
        raise SystemExit(f"advise offered no {family} row: {advice['trace']}")
    return rows[0]


def median(values: list[float]) -> float:
    return float(np.median(values)) if values else float("nan")  # --pairs 0: none


def forecast_speedup(row: dict) -> float:
    return row.get("simulated_effective_speedup") or row["effective_speedup"]


def one_case(name: str, budget: float, traces: int, pairs: int, workers: int, say) -> dict:
    case = CASES[name]
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        advice, measured = [], []
        for i in range(traces):
            run = train(case, "sync", budget, folder / f"sync{i}", workers)
            measured.append(run["summary"]["mean_iteration_time"])
            advice.append(advise(folder / f"sync{i}" / "trace.csv"))
            say(f"{name}: trace {i}: {advice[-1]['recommendation']}")
        first = advice[0]
        choice = next(r for r in first["results"] if r["spec"] == first["recommendation"])
        predicted = forecast_speedup(choice)
        # the sides of each pair: sync, the recommendation, the best DropCompute and
        # Local-SGD rows (once each where they coincide)
        rows = {"rec": choice, "dropcompute": best(first, "dropcompute"),
                "local-sgd": best(first, "local-sgd")}  # fmt: skip
        specs = dict.fromkeys(["sync", *(r["spec"] for r in rows.values()), CUTTING])
        runs: dict[str, list[dict]] = {spec: [] for spec in specs}
        from_dropcompute, censored = [], []
        for p in range(pairs):
            order = list(specs) if p % 2 == 0 else list(reversed(specs))
            for j, spec in enumerate(order):
                where = folder / f"pair{p}-{j}"
                runs[spec].append(train(case, spec, budget, where, workers))
                if spec == CUTTING:
                    from_dropcompute.append(advise(where / "trace.csv")["cost"]["iteration_time"])
                    cut = np.genfromtxt(where / "trace.csv", delimiter=",", names=True)
                    names = cut.dtype.names or ()
                    censored.append(float(np.mean(cut["censored"])) if "censored" in names else 0.0)
            rec, sync = runs[choice["spec"]][-1], runs["sync"][-1]
            say(f"{name}: pair {p}: realised {rec['rate'] / sync['rate']:.3f}, units "
                f"{rec['unit'] / sync['unit']:.3f}x")  # fmt: skip
    ratios = [
        r["rate"] / s["rate"] for r, s in zip(runs[choice["spec"]], runs["sync"], strict=True)
    ]
    inflation = [
        r["unit"] / s["unit"] for r, s in zip(runs[choice["spec"]], runs["sync"], strict=True)
    ]
    realised = median(ratios)  # --pairs 0: stability only
    sync_time = median([r["summary"]["mean_iteration_time"] for r in runs["sync"]])
    cross = {}
    for side in ("dropcompute", "local-sgd"):
        row, mine = rows[side], runs[rows[side]["spec"]]
        if not mine:
            continue
        time = median([r["summary"]["mean_iteration_time"] for r in mine])
        speedups = [m["rate"] / s["rate"] for m, s in zip(mine, runs["sync"], strict=True)]
        cross[side] = {
            "spec": row["spec"],
            "forecast_iteration_time": row["iteration_time"],
            "measured_iteration_time": time,
            "time_ratio": row["iteration_time"] / time,
            "predicted_speedup": forecast_speedup(row),
            "realised_speedup": median(speedups),
            "predicted_over_realised": forecast_speedup(row) / median(speedups),
        }
    notes = [note for a in advice for note in a["notes"]]
    return {
        "recommendations": [a["recommendation"] for a in advice],
        "same_recommendation": len({a["recommendation"] for a in advice}) == 1,
        "equivalent": [a["equivalent"] for a in advice],
        "sync_forecast": [a["cost"]["iteration_time"] for a in advice],
        "sync_measured": measured,
        "sync_forecast_ratio": [a["cost"]["iteration_time"] / m for a, m in
                                zip(advice, measured, strict=True)],
        "recommendation": first["recommendation"],
        "predicted_speedup": predicted,
        "predicted_uncertainty": first["recommendation_uncertainty"],
        "realised_speedups": ratios,
        "realised_speedup": realised,
        "predicted_over_realised": predicted / realised,
        "unit_seconds_rec_over_sync": inflation,
        "unit_seconds_ratio": median(inflation),
        "cross": cross,
        "sync_from_dropcompute": {
            "spec": CUTTING,
            "forecasts": from_dropcompute,
            "censored_share": censored,
            "measured_sync_iteration_time": sync_time,
            "ratio": median(from_dropcompute) / sync_time,
            # the cutting runs' own: a forecast of sync is not a replay of the run it read
            "measured_cutting_iteration_time": median(
                [r["summary"]["mean_iteration_time"] for r in runs[CUTTING]]
            ),
        },
        "load": {"before": list(load_before), "after": list(os.getloadavg())},
        "contention_warned": any(n.startswith("contention:") for n in notes),
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--quick", action="store_true", help="6 s runs, 2 pairs")
    parser.add_argument("--budget", type=float, default=15.0, help="wall seconds per run")
    parser.add_argument("--traces", type=int, default=3, help="identical sync runs advised")
    parser.add_argument("--pairs", type=int, default=4, help="0: the traces' advice only")
    parser.add_argument("--case", choices=sorted(CASES), action="append")
    parser.add_argument("--workers", type=int, default=4, help="ranks of every run")
    args = parser.parse_args()
    budget, pairs = (6.0, 2) if args.quick else (args.budget, args.pairs)

    def say(text: str) -> None:
        if not args.json:
            print(text, flush=True)

    out: dict = {"cpus": os.cpu_count(), "workers": args.workers, "micro_batches": MICRO_BATCHES,
                 "budget_s": budget, "pairs": pairs}  # fmt: skip
    for name in args.case or list(CASES):
        out[name] = one_case(name, budget, args.traces, pairs, args.workers, say)
        say(f"{name}: {json.dumps(out[name])}")
    if args.json:
        print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
