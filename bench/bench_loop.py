"""Issue 34's loop on a job we did not write: probe -> advise -> adopt as printed -> faster?

The job is ``bench/loop_job/multigpu_torchrun.py``, shaped on PyTorch's DDP tutorial (a
``Trainer`` with ``_run_batch``, ``DistributedSampler``, one batch per step, gloo on CPU): an MLP
on scikit-learn's digits; with ``--accumulate M``, ``bench/loop_job/accumulate_torchrun.py``,
the other shape advise names (a step every M batches, the first M - 1 under ``no_sync``). For
each scenario and for 2 and 4 ranks the bench, with no human in the loop:

1. pastes the README's two probe lines into the script (``StragglerProbe(DIR).watch(ddp)``
   after the DDP line, ``probe.batches(loader)`` in the loop) with the package's one applier,
   ``tailtrain.advice.patch.apply_edits``, and runs it under ``torchrun`` (the *before* job);
2. runs ``tailtrain advise DIR --for ddp --json`` on the probe's folder, and applies the JSON's
   ``adopt.edits`` to the probed script with the same applier (the *after* job);
3. runs before and after in interleaved pairs, same seed, same injected noise, each pair in
   one probe folder (runs 0 and 1), and ``advise`` on that folder says what the remedy
   achieved.

The slowness is the bench's, not the script's: ``bench/loop_job/inject.py`` wraps the script
(``runpy``) and makes each sample k that rank r forwards cost ``d X_r (1 + e_{k // 8})``
seconds of sleep, one noise draw per 8 consecutive samples of the rank's stream (see there):
proportional to the work, as on a slower GPU, so the law and its draws are the same before
and after a change of shares or micro-batches.
Scenarios: (a) the last rank 3x slower; (b) 25x; (c) DropCompute App. B.1 noise on every rank,
``e`` an i.i.d. ``dropcompute-noise:scale=1`` draw per chunk (a chunk is then
``const:value=u+dropcompute-noise:scale=u``, u = 8 d: the law of
``bench/bench_dropcompute_timing.py``); (d) no straggler. ``d`` is large enough that the
sleeps, which need no CPU, dominate the few milliseconds of real compute of a step.

Measures, in the user's units, from the wrapper's per-step log (rank 0's clock, every rank's
samples): **samples applied per second** (samples forwarded in updates after the first
``WARMUP`` steps over the wall seconds of those steps: start-up excluded; a micro-batch
DropCompute cuts is never forwarded) and **time to target** (from the end of the first step
until rank 0's loss, a moving mean over ``WINDOW`` steps, first reaches the scenario's target,
one every before-run reaches). Goals (issue 34's Done-when), each a boolean with its figures,
beside the bounds of the bench's own law: (a)/(b) with shares proportional to speed
(X (N - 1) + 1) / N, and the integer shares of ``optimal_shares``; (c) ``predict``'s best rule
for the injected law at M = B / 8 micro-batches. An A/A control (the pairs' before runs
against each other) shows the noise. The exit status is 0 whether or not goals hold; non-zero
only on an error.

    python bench/bench_loop.py --json                  # 4 scenarios x (2, 4) ranks, 2 pairs
    python bench/bench_loop.py --quick --json          # smoke test: (a), 2 ranks, 1 pair
    python bench/bench_loop.py --scenarios a b --ranks 2 --pairs 3 --json
    python bench/bench_loop.py --scenarios a b d --accumulate 4 --json   # the accumulating loop
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from tailtrain.advice.adopt import probe_adoption
from tailtrain.advice.patch import apply_edits

ROOT = Path(__file__).resolve().parents[1]
JOB = ROOT / "bench" / "loop_job" / "multigpu_torchrun.py"
#: the job of ``--accumulate M`` > 1: a step every M batches, M - 1 under no_sync
ACCUMULATE_JOB = ROOT / "bench" / "loop_job" / "accumulate_torchrun.py"
INJECT = ROOT / "bench" / "loop_job" / "inject.py"
CHUNK = 8  #: samples per noise draw (and per micro-batch of the bound's M)
BATCH = 32  #: the job's per-rank batch (its ``--batch_size``)
WARMUP = 2  #: first steps left out of samples per second (DDP's first step builds buckets)
WINDOW = 10  #: steps in the moving mean of rank 0's loss
SLOW = {"a": 3.0, "b": 25.0}  #: the slow rank's factor (the last rank)
#: seconds per sample of the injected law (X = 1) per scenario: sleeps dominate the step
D = {"a": 0.5e-3, "b": 0.1e-3, "c": 1.0e-3, "d": 0.5e-3}
NOISE = "dropcompute-noise:scale=1"  #: (c): e per chunk, DropCompute App. B.1
EPOCHS = {2: 6, 4: 10}  #: epochs per run by ranks (a few hundred / about 150 steps)
TARGET = {2: 0.2, 4: 0.25}  #: rank 0's smoothed loss every sync run reaches by mid-run
TIMEOUT = 300.0  #: seconds per torchrun
#: torch's abort at exit, which the unmodified job meets too under the wrapper (1 of 4 runs in
#: one sitting): its optimizer, built after ``init_process_group``, imports torch._dynamo, which
#: keeps the group alive past ``destroy_process_group``, and gloo's threads run into the exit
#: (``examples/ddp_loop.py``); a DDP model holding a comm hook at exit meets it more often. A
#: run whose every rank wrote its log (at its exit, after the loop) counts as it is
#: (``aborted_at_exit``); one where a rank did not is run again
EXIT_ABORT = "terminate called without an active exception"
ATTEMPTS = 3  #: runs of one job before an exit abort counts as a failure
PLACEHOLDER = "@PROBE_DIR@"  #: the probe's folder in the pasted line, filled per run
#: the README's two lines as edits (``advice.adopt.probe_adoption``), pasted by the applier
#: advise's own edits go through (``advice.patch.apply_edits``)
PROBE_EDITS = probe_adoption(PLACEHOLDER).edits()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def law(scenario: str, ranks: int, seed: int) -> dict[str, Any]:
    """The wrapper's law (``inject.py``): seconds per sample, per-rank factors, the noise."""
    factors = [1.0] * ranks
    if scenario in SLOW:
        factors[-1] = SLOW[scenario]
    noise = NOISE if scenario == "c" else None
    return {"d": D[scenario], "factors": factors, "chunk": CHUNK, "noise": noise, "seed": seed}


def env(extra: dict[str, str] | None = None) -> dict[str, str]:
    out = dict(os.environ)
    out["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(ROOT / "src"), str(ROOT), out.get("PYTHONPATH")) if p
    )
    out["OMP_NUM_THREADS"] = "1"
    return out | (extra or {})


def run_job(
    source: str,
    folder: Path,
    name: str,
    ranks: int,
    epochs: int,
    job_law: dict,
    seed: int,
    accumulate: int = 1,
) -> dict[str, Any]:
    """One torchrun of ``source`` (its probe writes to ``folder/probe``) under the wrapper:
    the per-rank step logs, the measured figures and the tail of its output. A run that dies
    at exit with torch's teardown abort (:data:`EXIT_ABORT`, which the unmodified script
    meets too) is run again, up to :data:`ATTEMPTS` times, the probe's folder restored first
    so the pair keeps its two runs; ``retried`` counts those."""
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / f"{name}.py"
    script.write_text(source.replace(PLACEHOLDER, str(folder / "probe")))
    log = folder / f"{name}.steps"
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks),
        "--master-addr", "127.0.0.1", "--master-port", "0",
        str(INJECT), str(script), str(epochs), "--batch_size", str(BATCH), "--seed", str(seed),
    ]  # fmt: skip
    if accumulate > 1:
        command += ["--accumulate", str(accumulate)]
    extra = {"BENCH_LOOP_LAW": json.dumps(job_law), "BENCH_LOOP_LOG": str(log)}
    kept = folder / "probe.kept"
    logs = [Path(f"{log}.{r}.jsonl") for r in range(ranks)]
    aborted = False
    for attempt in range(ATTEMPTS):
        snapshot(folder / "probe", kept)
        for path in logs:  # an earlier attempt's: this one writes its own at its exit
            path.unlink(missing_ok=True)
        command[command.index("--master-port") + 1] = str(free_port())
        started = time.perf_counter()
        try:
            done = subprocess.run(
                command, env=env(extra), capture_output=True, text=True, timeout=TIMEOUT,
                cwd=folder,
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"{script}: no end after {TIMEOUT:.0f} s") from None
        if done.returncode == 0:
            break
        tail = (done.stdout + done.stderr)[-3000:]
        if EXIT_ABORT in done.stderr and all(path.exists() for path in logs):
            aborted = True  # every rank finished and wrote its log before torch's abort
            break
        if EXIT_ABORT not in done.stderr or attempt + 1 == ATTEMPTS:
            raise RuntimeError(f"{script} failed (exit {done.returncode}):\n{tail}")
        snapshot(kept, folder / "probe")  # the aborted run's rows leave the pair's folder
    rows = [read_log(path) for path in logs]
    out = measure(rows, TARGET[ranks])
    out["seconds_with_start_up"] = time.perf_counter() - started
    out["retried"] = attempt
    out["aborted_at_exit"] = aborted
    return out


def snapshot(source: Path, target: Path) -> None:
    """``target`` becomes a copy of ``source`` (absent if ``source`` is)."""
    shutil.rmtree(target, ignore_errors=True)
    if source.exists():
        shutil.copytree(source, target)


def read_log(path: Path) -> list[dict[str, Any]]:
    lines = path.read_text().splitlines()
    return [json.loads(line) for line in lines[1:]]  # the first is the header


def measure(rows: list[list[dict[str, Any]]], target: float) -> dict[str, Any]:
    """Samples applied per second and time to ``target`` from the per-rank step logs."""
    steps = min(len(r) for r in rows)
    if steps <= WARMUP + 1:
        raise RuntimeError(f"only {steps} optimizer steps logged")
    t = np.array([row["t"] for row in rows[0][:steps]])
    samples = np.array([[row["samples"] for row in r[:steps]] for r in rows]).sum(axis=0)
    per_rank = np.array([[row["samples"] for row in r[:steps]] for r in rows]).mean(axis=1)
    loss = np.array([np.nan if row["loss"] is None else row["loss"] for row in rows[0][:steps]])
    seconds = float(t[-1] - t[WARMUP - 1])
    smooth = np.convolve(loss, np.ones(WINDOW) / WINDOW, mode="valid")  # ends at WINDOW-1..
    hit = np.flatnonzero(smooth <= target)
    reached = None if hit.size == 0 else int(hit[0]) + WINDOW - 1
    return {
        "steps": steps,
        "samples_per_second": float(samples[WARMUP:].sum() / seconds),
        "seconds_per_step": float(np.median(np.diff(t[WARMUP - 1 :]))),
        "samples_per_step": float(samples[WARMUP:].mean()),
        "samples_per_rank_per_step": [round(float(s), 2) for s in per_rank],
        "loop_seconds": seconds,
        "target_loss": target,
        "time_to_target": None if reached is None else float(t[reached] - t[0]),
        "step_at_target": reached,
        "final_loss": float(smooth[-1]),
    }


def advise(folder: Path) -> dict[str, Any]:
    """``tailtrain advise FOLDER --for ddp --json``, as the user types it."""
    command = [sys.executable, "-m", "tailtrain", "advise", str(folder), "--for", "ddp", "--json"]
    done = subprocess.run(command, env=env(), capture_output=True, text=True, timeout=TIMEOUT)
    if done.returncode != 0:
        tail = done.stderr[-2000:]
        raise RuntimeError(f"advise {folder} failed (exit {done.returncode}): {tail}")
    return json.loads(done.stdout)


#: what the case keeps of advise's ranked rows (the first six)
RESULT_KEYS = (
    "spec",
    "samples_applied_ratio",
    "samples_applied_per_second",
    "samples_dropped",
    "time_to_target_ratio",
)


def forecast(advice: dict[str, Any]) -> dict[str, float | None]:
    """advise's forecast for the recommendation: samples applied per second (absolute) and
    as a ratio to the job as measured (its ``results`` row for the recommended spec)."""
    for row in advice.get("results") or []:
        if row.get("spec") == advice.get("recommendation"):
            return {
                "per_second": row.get("samples_applied_per_second"),
                "ratio": row.get("samples_applied_ratio"),
                "time_to_target_ratio": row.get("time_to_target_ratio"),
            }
    return {"per_second": None, "ratio": None, "time_to_target_ratio": None}


def achieved(advice: dict[str, Any]) -> float | None:
    """What advise on a folder holding runs before and after says the remedy achieved: the
    last run's samples per second over the first's (``before_after.last_over``)."""
    last_over = (advice.get("before_after") or {}).get("last_over") or {}
    value = last_over.get("0")
    return None if value is None else float(value)


def verdicts(folder: Path, since: int) -> dict[int, str]:
    """The probe's last verdict per rank in ``verdicts.jsonl`` from line ``since`` on."""
    path = folder / "verdicts.jsonl"
    if not path.exists():
        return {}
    last: dict[int, str] = {}
    for line in path.read_text().splitlines()[since:]:
        report = json.loads(line)
        for rank in report.get("ranks", []):
            last[int(rank["worker"])] = rank["verdict"]
    return last


def lines_in(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def one_case(scenario: str, ranks: int, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """Before, advise, after, in ``args.pairs`` interleaved pairs, for one scenario."""
    job_law = law(scenario, ranks, args.seed)
    epochs = args.epochs or EPOCHS[ranks]
    source = (JOB if args.accumulate == 1 else ACCUMULATE_JOB).read_text()
    before_src = apply_edits(source, PROBE_EDITS)
    case: dict[str, Any] = {"law": job_law, "epochs": epochs, "pairs": []}
    after_src: str | None = None
    for pair in range(args.pairs):
        folder = out / f"{scenario}-{ranks}" / f"pair{pair}"
        row: dict[str, Any] = {}
        row["before"] = run_job(
            before_src, folder, "before", ranks, epochs, job_law, args.seed, args.accumulate
        )
        probe = folder / "probe"
        row["before"]["verdicts"] = verdicts(probe, 0)
        if pair == 0:
            advice = advise(probe)
            case["advice"] = {
                "recommendation": advice.get("recommendation"),
                "adopt": advice.get("adopt"),
                "measured_samples_per_second": advice.get("measured_samples_per_second"),
                "forecast": forecast(advice),
                "stragglers": [
                    {k: s.get(k) for k in ("worker", "verdict", "score")}
                    for s in advice.get("stragglers") or []
                ],
                "results": [
                    {k: r.get(k) for k in RESULT_KEYS} for r in (advice.get("results") or [])[:6]
                ],
            }
            edits = (advice.get("adopt") or {}).get("edits")
            if edits is None:
                case["after_unavailable"] = "advise --json has no adopt.edits"
            else:
                try:
                    after_src = apply_edits(before_src, edits)
                except Exception as err:  # the applier's one-line refusal is the finding
                    case["after_unavailable"] = f"apply_edits: {type(err).__name__}: {err}"
                else:
                    (out / f"{scenario}-{ranks}" / "after.py").write_text(after_src)
        if after_src is not None:
            seen = lines_in(probe / "verdicts.jsonl")
            row["after"] = run_job(
                after_src, folder, "after", ranks, epochs, job_law, args.seed, args.accumulate
            )
            row["after"]["verdicts"] = verdicts(probe, seen)
            row["advise_on_both"] = achieved(advise(probe))
        case["pairs"].append(row)
        print(f"  {scenario}-{ranks} pair {pair}: {summary_line(row)}", file=sys.stderr)
    return case | {"figures": figures(case)}


def summary_line(row: dict[str, Any]) -> str:
    parts = [f"before {row['before']['samples_per_second']:.0f} samples/s"]
    if "after" in row:
        parts.append(f"after {row['after']['samples_per_second']:.0f}")
    return ", ".join(parts)


def ratio(after: float | None, before: float | None) -> float | None:
    return None if after is None or before is None or before == 0 else after / before


def median(values: list[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return float(np.median(kept)) if kept else None


def figures(case: dict[str, Any]) -> dict[str, Any]:
    """Per case: the pairs' after/before ratios (median over pairs), the A/A control, the
    forecast's error and what advise on the pair's folder reported."""
    pairs = case["pairs"]
    before = [p["before"]["samples_per_second"] for p in pairs]
    out: dict[str, Any] = {
        "before_samples_per_second": before,
        # A/A: each later pair's before against the first's (the same job, the same law)
        "a_a_samples_per_second": [b / before[0] for b in before[1:]],
    }
    ttt_before = [p["before"]["time_to_target"] for p in pairs]
    out["a_a_time_to_target"] = [ratio(t, ttt_before[0]) for t in ttt_before[1:]]
    if not all("after" in p for p in pairs):
        return out
    after = [p["after"]["samples_per_second"] for p in pairs]
    sps = [a / b for a, b in zip(after, before, strict=True)]
    ttt = [ratio(p["after"]["time_to_target"], p["before"]["time_to_target"]) for p in pairs]
    predicted = case["advice"]["forecast"]["per_second"]
    realised = float(np.median(after))
    reported = [p.get("advise_on_both") for p in pairs]
    out |= {
        "after_samples_per_second": after,
        "samples_per_second_ratio": sps,
        "samples_per_second_ratio_median": float(np.median(sps)),
        "time_to_target_ratio": ttt,
        "time_to_target_ratio_median": median(ttt),
        "forecast_samples_per_second": predicted,
        "forecast_over_realised": None if predicted is None else predicted / realised,
        "forecast_ratio": case["advice"]["forecast"]["ratio"],
        "forecast_ratio_over_realised": ratio(
            case["advice"]["forecast"]["ratio"], float(np.median(sps))
        ),
        "advise_reported_ratio": reported,
        "advise_reported_over_measured": [ratio(r, m) for r, m in zip(reported, sps, strict=True)],
    }
    return out


def shares_bound(factor: float, ranks: int) -> dict[str, Any]:
    """(a)/(b): sync's step is B X d; shares by speed make every rank finish together."""
    from tailtrain.strategies.rebalance import optimal_shares

    t = np.array([1.0] * (ranks - 1) + [factor])
    fluid = factor * float((1.0 / t).sum()) / ranks  # = (X (N - 1) + 1) / N
    shares = optimal_shares(t, ranks * BATCH)
    integer = factor * BATCH / float((shares * t).max())
    return {"fluid": fluid, "integer_shares": [int(s) for s in shares], "integer": integer}


def predict_bound(ranks: int) -> dict[str, Any]:
    """(c): ``predict``'s rows for the injected law (a micro-batch is a chunk, M = B / 8, no
    communication), as samples per second over sync's: the best rule that applies fresh
    gradients (advise's ``FRESH_PROGRESS``: its time to target scales as 1 / samples
    applied), the best a DDP job can run (sync, DropCompute, rebalance by static shares) and
    the best of all, stale rules included (whose progress per sample the bench cannot price)."""
    from tailtrain.advice.units import FRESH_PROGRESS
    from tailtrain.delays import parse_delay
    from tailtrain.prediction.estimates import predict
    from tailtrain.prediction.families import row_spec
    from tailtrain.prediction.scenario import DelayScenario

    u = CHUNK * D["c"]
    spec = f"const:value={u}+dropcompute-noise:scale={u}"
    rows = predict(
        DelayScenario(workers=ranks, delay=parse_delay(spec), micro_batches=BATCH // CHUNK)
    ).rows
    named = [(r.strategy, row_spec(r), float(r.effective_speedup)) for r in rows]

    def best(kept: list[tuple[str, str, float]]) -> dict[str, Any]:
        found = max(kept, key=lambda r: r[2])
        return {"rule": found[1], "samples_per_second_over_sync": found[2]}

    ddp = [r for r in named if r[0] in ("sync", "dropcompute", "rebalance") and "deal=" not in r[1]]
    return {
        "law_per_micro_batch": spec,
        "micro_batches": BATCH // CHUNK,
        "best": best([r for r in named if r[0] in FRESH_PROGRESS]),
        "best_ddp": best(ddp),
        "best_any_stale_included": best(named),
    }


def bounds(scenarios: list[str], ranks: list[int]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for s in scenarios:
        for n in ranks:
            key = f"{s}-{n}"
            if s in SLOW:
                out[key] = shares_bound(SLOW[s], n)
            elif s == "c":
                out[key] = predict_bound(n)
            else:
                out[key] = {"fluid": 1.0}
    return out


def within(value: float | None, tolerance: float) -> bool | None:
    return None if value is None else abs(value - 1.0) <= tolerance


def all_of(values: list[bool | None]) -> bool | None:
    if not values or any(v is None for v in values):
        return None
    return all(values)


def goals(cases: dict[str, Any], bound: dict[str, Any]) -> dict[str, Any]:
    """Issue 34's goals, each ``holds`` (None: not measured) with the figures it read."""
    out: dict[str, Any] = {}
    for key, case in cases.items():
        scenario, ranks = key.split("-")[0], int(key.split("-")[1])
        f = case["figures"]
        sps, ttt = f.get("samples_per_second_ratio_median"), f.get("time_to_target_ratio_median")
        goal: dict[str, Any] = {"samples_per_second_ratio": sps, "time_to_target_ratio": ttt}
        if scenario in SLOW:
            need = 1.5 if scenario == "a" else 4.0
            goal["need"] = {"samples_per_second_ratio": need, "time_to_target_ratio": 0.75}
            goal["holds"] = all_of(
                [None if sps is None else sps >= need, None if ttt is None else ttt <= 0.75]
            )
            goal["verdict_unchanged"] = all_of(
                [
                    p["before"]["verdicts"].get(ranks - 1) == "persistent"
                    and p["after"]["verdicts"].get(ranks - 1) == "persistent"
                    if "after" in p
                    else None
                    for p in case["pairs"]
                ]
            )
        elif scenario == "c":
            best = bound[key]["best"]["samples_per_second_over_sync"]
            if ranks >= 4:
                need = max(1.05, 1 + 0.8 * (best - 1))
                goal["need"] = {"samples_per_second_ratio": need, "time_to_target_ratio": 0.97}
                goal["holds"] = all_of(
                    [None if sps is None else sps >= need, None if ttt is None else ttt <= 0.97]
                )
            else:
                goal["need"] = {"samples_per_second_ratio": 0.98}
                goal["holds"] = None if sps is None else sps >= 0.98
            goal["share_of_bound_gain"] = None if sps is None else (sps - 1) / (best - 1)
        else:
            recommendation = case.get("advice", {}).get("recommendation")
            goal["recommendation"] = recommendation
            goal["need"] = {"recommendation": "sync", "samples_per_second_ratio": 0.98}
            goal["holds"] = all_of([recommendation == "sync", None if sps is None else sps >= 0.98])
        goal["forecast_over_realised"] = f.get("forecast_over_realised")
        goal["forecast_within_10pct"] = within(f.get("forecast_over_realised"), 0.10)
        reported = f.get("advise_reported_over_measured") or [None]
        goal["advise_reported_within_10pct"] = all_of([within(r, 0.10) for r in reported])
        out[key] = goal
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument("--quick", action="store_true", help="(a), 2 ranks, 1 pair, 4 epochs")
    parser.add_argument("--scenarios", nargs="+", choices=["a", "b", "c", "d"])
    parser.add_argument("--ranks", nargs="+", type=int, choices=[2, 4])
    parser.add_argument("--pairs", type=int, default=2, help="before/after pairs per case")
    parser.add_argument("--epochs", type=int, default=None, help="epochs per run (by ranks)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--accumulate", type=int, default=1,
        help="the job's loop shape: an optimizer step every M batches, M - 1 under no_sync",
    )  # fmt: skip
    parser.add_argument("--out", type=Path, default=None, help="keep the runs' folders here")
    args = parser.parse_args()
    if args.quick:
        args.scenarios, args.ranks = args.scenarios or ["a"], args.ranks or [2]
        args.pairs, args.epochs = 1, args.epochs or 4
    args.scenarios = args.scenarios or ["a", "b", "c", "d"]
    args.ranks = args.ranks or [2, 4]
    if args.pairs < 1 or args.accumulate < 1:
        parser.error("--pairs and --accumulate must be >= 1")
    load_start = os.getloadavg()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench_loop_") as tmp:
        out = args.out or Path(tmp)
        bound = bounds(args.scenarios, args.ranks)
        cases: dict[str, Any] = {}
        for scenario in args.scenarios:  # interleaved within a case: before, after, before...
            for ranks in args.ranks:
                cases[f"{scenario}-{ranks}"] = one_case(scenario, ranks, args, out)
    report = {
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "load_start": list(load_start),
            "load_end": list(os.getloadavg()),
        },
        "seconds": time.perf_counter() - started,
        "settings": {
            "quick": args.quick,
            "pairs": args.pairs,
            "seed": args.seed,
            "batch": BATCH,
            "accumulate": args.accumulate,
            "chunk": CHUNK,
            "warmup_steps": WARMUP,
            "loss_window": WINDOW,
            "targets": {str(k): v for k, v in TARGET.items()},
        },
        "bounds": bound,
        "cases": cases,
        "goals": goals(cases, bound),
    }
    if args.json:
        print(json.dumps(report, indent=1, default=float))
    else:
        for key, goal in report["goals"].items():
            print(f"{key}: {json.dumps(goal, default=float)}")


if __name__ == "__main__":
    main()
