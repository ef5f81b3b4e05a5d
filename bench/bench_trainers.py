"""Issue 39's benchmark: what tailtrain costs inside Lightning, against a loop of one's own.

Every run is one ``python -m torch.distributed.run --nproc-per-node 2`` (gloo, CPU,
``OMP_NUM_THREADS=1``) of a job under ``bench/trainers_job/``: a ``LightningModule`` on the
digits (``lightning_job.py``), a plain DDP loop and a ``StragglerStep`` loop (``own_loop.py``),
all with the same MLP, data, M = 4 micro-batches of 8 samples per rank and step, and the same
injected law (``trainers_job/common.py``, the DDP bench's ``bench/loop_job/inject.py``
``Injector``): sample k of rank r's stream sleeps ``d X_r (1 + e_{k // 8})``, one noise draw per
micro-batch, proportional to the work, so a micro-batch DropCompute cuts costs nothing.

1. **Overhead** of ``StragglerProbeCallback`` (no noise, both ranks alike): in each of
   ``--pairs`` interleaved triples, Lightning's DDP job without the callback (A), with it (B)
   and without it again (A', the A/A control), their order rotated from triple to triple. Per
   run the median seconds per optimizer step (rank 0's clock, after :data:`OVERHEAD_WARMUP`
   steps); the goal reads B/A, the median over triples, at most 1.01; A'/A beside it is the
   noise floor. Each band is the 5-95 % percentile band of a bootstrap that resamples every
   run's steps (:data:`DRAWS` draws): it holds the steps' spread within runs, and the A/A
   ratios show the spread between runs.
2. **Remedy**: DropCompute App. B.1 noise on the last rank only (``bench_loop``'s scenario (c)
   draw, ``dropcompute-noise:scale=1`` per micro-batch, on (a)'s one rank): in each of
   ``--pairs`` interleaved rounds (order rotated) Lightning's plain DDP (L0), Lightning with
   ``StragglerStrategy(SPEC)`` (L1), the plain DDP loop (D0) and the ``StragglerStep(SPEC)``
   loop (D1), same seed and draws. The unit is **samples applied per second**: the samples the
   ranks forwarded in the steps after :data:`REMEDY_WARMUP` (DropCompute's calibration and two
   more), summed over ranks, over rank 0's wall seconds of those steps. Every forwarded
   micro-batch enters the update (a cut one is never forwarded: the threshold is checked
   before a micro-batch starts, and a started one is counted in ``completed``), which the
   bench checks step by step against the record's ``completed`` x 8 (``count_checked``).
   The goal: (L1 / L0) / (D1 / D0) >= 0.9, the median over rounds, with its bootstrap band.

**Bounds** of the remedy under the bench's own law, without any overhead (Monte Carlo,
:data:`BOUND_DRAWS` steps, in units of one micro-batch's base time): samples per second over
sync's for every rank always busy (the fluid bound, 1 + E[e] / 2 for one noisy rank of two)
and for the best fixed DropCompute threshold (stopping between micro-batches, as the rule
does); the goal's ratio is reachable where Lightning's speed-up can reach StragglerStep's.

    python bench/bench_trainers.py --json              # 3 triples + 3 rounds: 21 runs, 11-20 min
    python bench/bench_trainers.py --pairs 2 --json    # 14 runs: 7.5 min at load 2 on 2 cores
    python bench/bench_trainers.py --quick --json      # 1 triple + 1 round of 40-step runs
    python bench/bench_trainers.py --parts remedy --pairs 2 --json

The exit status is 0 whether or not goals are met; non-zero only on an error.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.bench_loop import EXIT_ABORT, env, free_port  # noqa: E402
from bench.trainers_job.common import LAW_ENV, MICRO, M  # noqa: E402

JOBS_DIR = ROOT / "bench" / "trainers_job"
#: job name -> (script, its arguments)
JOBS: dict[str, tuple[str, list[str]]] = {
    "lightning_ddp": ("lightning_job.py", ["--mode", "ddp"]),
    "lightning_probe": ("lightning_job.py", ["--mode", "probe"]),
    "lightning_straggler": ("lightning_job.py", ["--mode", "straggler"]),
    "ddp_loop": ("own_loop.py", ["--mode", "ddp"]),
    "step_loop": ("own_loop.py", ["--mode", "step"]),
}
D = 2.5e-3  #: seconds per sample of the law (a micro-batch 20 ms): sleeps dominate the step
NOISE = "dropcompute-noise:scale=1"  #: DropCompute App. B.1, bench_loop's scenario (c)
CALIBRATE = 10  #: DropCompute's calibration steps (sync) before tau is set
#: the rule, both loops alike: tau for a 25 % drop rate, learnt from each loop's own
#: calibration steps (so its overheads count). Those first steps run slower than the steady
#: state (start-up, a loaded machine), so the drop rate reached is lower (about 8 % at load
#: 3): tau lands at 4.3-4.5 micro-batches' time, where the law allows about 1.06 over sync
#: (``remedy_bound``); on a quiet machine at 4.2-4.3 (1.08, which both loops reached).
#: ``drop-rate=0.15`` landed at 5-6 (about 1.03) and Algorithm 2's ``threshold=auto`` at
#: about 5 (1.03), within the runs' noise at load 3
SPEC = f"dropcompute:drop-rate=0.25,calibrate={CALIBRATE}"
OVERHEAD_WARMUP = 5  #: steps left out of the overhead's step times (DDP's buckets, start-up)
REMEDY_WARMUP = CALIBRATE + 2  #: steps left out of samples per second
STEPS = {"overhead": 150, "remedy": 120}  #: optimizer steps per run (~12-15 s)
QUICK_STEPS = {"overhead": 40, "remedy": 40}
OVERHEAD_GOAL = 1.01
REMEDY_GOAL = 0.9
DRAWS = 2000  #: bootstrap draws
BAND = (5.0, 95.0)  #: the bootstrap's percentile band
BOUND_DRAWS = 20000  #: Monte Carlo steps of the bound
TIMEOUT = 300.0  #: seconds per torchrun
ATTEMPTS = 3  #: runs of one job before torch's exit abort (``bench_loop.EXIT_ABORT``) fails


def law(noisy: bool, seed: int) -> dict[str, Any]:
    """The injected law (``trainers_job/common.py``): 2 ranks at one speed; with ``noisy`` the
    last rank draws DropCompute's noise per micro-batch."""
    return {
        "d": D,
        "factors": [1.0, 1.0],
        "chunk": MICRO,
        "noise": NOISE if noisy else None,
        "noisy": [1] if noisy else None,
        "seed": seed,
    }


# ---- one run ------------------------------------------------------------------------------
def run_job(
    job: str, folder: Path, steps: int, job_law: dict[str, Any], spec: str = SPEC
) -> list[list[dict[str, Any]]]:
    """One torchrun of ``job`` (``JOBS``) writing into ``folder``: every rank's step rows.
    A run that dies at exit with torch's teardown abort (``bench_loop.EXIT_ABORT``) after its
    log is written is run again, up to :data:`ATTEMPTS` times."""
    script, extra = JOBS[job]
    folder.mkdir(parents=True, exist_ok=True)
    log = folder / "steps"
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
        "--master-addr", "127.0.0.1", "--master-port", "0",
        str(JOBS_DIR / script), *extra, "--steps", str(steps), "--step-log", str(log),
    ]  # fmt: skip
    if job == "lightning_probe":
        command += ["--probe-dir", str(folder / "probe")]
    if job in ("lightning_straggler", "step_loop"):
        command += ["--spec", spec]
    for attempt in range(ATTEMPTS):
        command[command.index("--master-port") + 1] = str(free_port())
        shutil.rmtree(folder / "probe", ignore_errors=True)
        try:
            done = subprocess.run(
                command, env=env({LAW_ENV: json.dumps(job_law)}), capture_output=True,
                text=True, timeout=TIMEOUT, cwd=folder,
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"{job}: no end after {TIMEOUT:.0f} s") from None
        if done.returncode == 0:
            break
        if EXIT_ABORT not in done.stderr or attempt + 1 == ATTEMPTS:
            tail = (done.stdout + done.stderr)[-3000:]
            raise RuntimeError(f"{job} failed (exit {done.returncode}):\n{tail}")
    return [read_log(Path(f"{log}.{r}.jsonl")) for r in range(2)]


def read_log(path: Path) -> list[dict[str, Any]]:
    lines = path.read_text().splitlines()
    return [json.loads(line) for line in lines[1:]]  # the first is the header


# ---- measures -----------------------------------------------------------------------------
def step_table(rows: list[list[dict[str, Any]]], warmup: int) -> dict[str, np.ndarray]:
    """Per optimizer step after ``warmup``: its seconds on rank 0's clock (from the previous
    step's end) and the samples every rank forwarded in it, summed."""
    steps = min(len(r) for r in rows)
    if steps <= warmup + 1:
        raise RuntimeError(f"only {steps} optimizer steps logged (warm-up {warmup})")
    t = np.array([row["t"] for row in rows[0][:steps]])
    samples = np.array([[row["samples"] for row in r[:steps]] for r in rows]).sum(axis=0)
    return {"seconds": np.diff(t[warmup - 1 :]), "samples": samples[warmup:].astype(float)}


def count_checked(rows: list[list[dict[str, Any]]]) -> bool | None:
    """Whether every step's samples forwarded, summed over ranks, equal its record's
    ``completed`` micro-batches x MICRO (None: no record, a rule-free job)."""
    steps = min(len(r) for r in rows)
    if steps == 0 or rows[0][0].get("completed") is None:
        return None
    for k in range(steps):
        forwarded = sum(r[k]["samples"] for r in rows)
        if any(r[k]["completed"] != rows[0][k]["completed"] for r in rows):
            return False
        if forwarded != MICRO * sum(rows[0][k]["completed"]):
            return False
    return True


def per_second(table: dict[str, np.ndarray]) -> float:
    """Samples applied per second: the steps' samples over their seconds."""
    return float(table["samples"].sum() / table["seconds"].sum())


def median_step(table: dict[str, np.ndarray]) -> float:
    return float(np.median(table["seconds"]))


def resampled(
    tables: Sequence[dict[str, np.ndarray]],
    measure: Callable[[np.ndarray, np.ndarray], np.ndarray],
    draws: int,
    rng: np.random.Generator,
) -> list[np.ndarray]:
    """``measure(seconds, samples)`` of ``draws`` bootstrap resamples of each table's steps
    (rows drawn with replacement, seconds and samples together): one array per table."""
    out = []
    for table in tables:
        n = len(table["seconds"])
        pick = rng.integers(0, n, size=(draws, n))
        out.append(measure(table["seconds"][pick], table["samples"][pick]))
    return out


def boot_median(seconds: np.ndarray, samples: np.ndarray) -> np.ndarray:
    return np.median(seconds, axis=1)


def boot_per_second(seconds: np.ndarray, samples: np.ndarray) -> np.ndarray:
    return samples.sum(axis=1) / seconds.sum(axis=1)


def band(values: np.ndarray) -> list[float]:
    return [float(v) for v in np.percentile(values, BAND)]


def ratio_figures(
    over: list[dict[str, np.ndarray]],
    under: list[dict[str, np.ndarray]],
    measure: Callable[[dict[str, np.ndarray]], float],
    boot: Callable[[np.ndarray, np.ndarray], np.ndarray],
    rng: np.random.Generator,
) -> dict[str, Any]:
    """``measure(over_i) / measure(under_i)`` for each pair i, their median, and the
    bootstrap band of that median (each run's steps resampled)."""
    ratios = [measure(a) / measure(b) for a, b in zip(over, under, strict=True)]
    a, b = resampled(over, boot, DRAWS, rng), resampled(under, boot, DRAWS, rng)
    boot_ratios = np.median(np.array(a) / np.array(b), axis=0)
    return {"ratios": ratios, "median": float(np.median(ratios)), "band": band(boot_ratios)}


def divided(a: Sequence[float], b: Sequence[float]) -> list[float]:
    return [x / y for x, y in zip(a, b, strict=True)]


def remedy_figures(
    rounds: list[dict[str, dict[str, np.ndarray]]], rng: np.random.Generator
) -> dict[str, Any]:
    """The speed-ups of samples applied per second, Lightning's and the own loop's, their
    ratio per round (the goal's value), medians and bootstrap bands."""
    sps = {job: [per_second(r[job]) for r in rounds] for job in rounds[0]}
    boot = {
        job: np.array(resampled([r[job] for r in rounds], boot_per_second, DRAWS, rng))
        for job in rounds[0]
    }  # rounds x draws per job
    lightning = divided(sps["lightning_straggler"], sps["lightning_ddp"])
    own = divided(sps["step_loop"], sps["ddp_loop"])
    ratio = divided(lightning, own)
    boot_l = boot["lightning_straggler"] / boot["lightning_ddp"]
    boot_o = boot["step_loop"] / boot["ddp_loop"]
    return {
        "samples_per_second": sps,
        "lightning_speedup": lightning,
        "lightning_speedup_median": float(np.median(lightning)),
        "lightning_speedup_band": band(np.median(boot_l, axis=0)),
        "step_speedup": own,
        "step_speedup_median": float(np.median(own)),
        "step_speedup_band": band(np.median(boot_o, axis=0)),
        "ratio": ratio,
        "ratio_median": float(np.median(ratio)),
        "ratio_band": band(np.median(boot_l / boot_o, axis=0)),
        "share_of_gain": [
            (a - 1) / (b - 1) if b != 1 else None for a, b in zip(lightning, own, strict=True)
        ],
        # what Lightning's own loop costs against the plain DDP loop, with no rule in either
        "lightning_ddp_over_ddp_loop": divided(sps["lightning_ddp"], sps["ddp_loop"]),
        # the same job round after round: each later round's plain DDP loop over the first's
        "a_a_ddp_loop": [s / sps["ddp_loop"][0] for s in sps["ddp_loop"][1:]],
    }


# ---- the bound ----------------------------------------------------------------------------
def law_units(draws: int, seed: int) -> np.ndarray:
    """``draws`` steps of the law in units of one micro-batch's base time (ranks x draws x M):
    rank 0's micro-batches take 1, rank 1's 1 + e (DropCompute's noise)."""
    from tailtrain.delays import parse_delay

    rng = np.random.default_rng(seed)
    noisy = 1.0 + parse_delay(NOISE).sample(rng, (draws, M))
    return np.stack([np.ones((draws, M)), noisy])


def threshold_rate(units: np.ndarray, tau: float) -> float:
    """Micro-batches per unit time under a fixed threshold ``tau``: a micro-batch starts while
    the step is younger than tau (DropCompute Algorithm 1, between micro-batches), the step
    ends when every rank's last started one ends (tau = inf: sync)."""
    ends = np.cumsum(units, axis=2)
    admitted = ends - units < tau
    done = admitted.sum(axis=(0, 2)).mean()
    return float(done / np.where(admitted, ends, 0.0).max(axis=(0, 2)).mean())


def remedy_bound(
    draws: int = BOUND_DRAWS, seed: int = 0, taus: Sequence[float] = ()
) -> dict[str, Any]:
    """The remedy's ceiling under the law with no overhead (``law_units``), as samples per
    second over sync's (the slower rank's M micro-batches per step): the fluid bound keeps
    both ranks busy all the time ((1 + 1 / (1 + E e)) micro-batches per unit time), the best
    fixed threshold (``threshold_rate`` over a grid), and the rate at each threshold of
    ``taus`` (seconds: the ones the runs' rule chose)."""
    from tailtrain.delays import parse_delay

    units = law_units(draws, seed)
    sync_rate = threshold_rate(units, np.inf)
    fluid = 1.0 + 1.0 / (1.0 + parse_delay(NOISE).mean)
    grid = np.linspace(0.5, 3.0 * M, 250)
    rates = [threshold_rate(units, tau) for tau in grid]
    best = int(np.argmax(rates))
    unit = D * MICRO
    return {
        "law": f"rank 0: {unit} s per micro-batch; rank 1: that x (1 + {NOISE} draw)",
        "noise_mean": float(parse_delay(NOISE).mean),
        "every_rank_busy_over_sync": fluid / sync_rate,
        "best_fixed_threshold_over_sync": rates[best] / sync_rate,
        "best_threshold_seconds": float(grid[best]) * unit,
        "at_runs_thresholds": [
            {"threshold_s": tau, "over_sync": threshold_rate(units, tau / unit) / sync_rate}
            for tau in taus
        ],
    }


# ---- the parts ----------------------------------------------------------------------------
def rotated(jobs: list[str], k: int) -> list[str]:
    k %= len(jobs)
    return jobs[k:] + jobs[:k]


def overhead_part(args: argparse.Namespace, out: Path, rng: np.random.Generator) -> dict:
    """``--pairs`` triples of A, B, A' (module docstring), order rotated per triple."""
    steps = args.steps or STEPS["overhead"]
    job_law = law(False, args.seed)
    roles = {"A": "lightning_ddp", "B": "lightning_probe", "A'": "lightning_ddp"}
    triples: list[dict[str, dict[str, np.ndarray]]] = []
    runs: list[dict[str, Any]] = []
    for k in range(args.pairs):
        triple: dict[str, dict[str, np.ndarray]] = {}
        for role in rotated(list(roles), k):
            folder = out / "overhead" / f"triple{k}" / role.replace("'", "2")
            began = time.perf_counter()
            table = step_table(run_job(roles[role], folder, steps, job_law), OVERHEAD_WARMUP)
            triple[role] = table
            runs.append(
                {
                    "triple": k, "role": role, "job": roles[role],
                    "median_step_s": median_step(table), "steps": len(table["seconds"]),
                    "seconds_with_start_up": time.perf_counter() - began,
                    "probe_wrote_trace": (folder / "probe" / "trace.csv").exists()
                    if role == "B" else None,
                }
            )  # fmt: skip
            print(f"  overhead triple {k} {role}: {runs[-1]['median_step_s'] * 1e3:.1f} ms/step",
                  file=sys.stderr)  # fmt: skip
        triples.append(triple)
    with_probe = ratio_figures(
        [t["B"] for t in triples], [t["A"] for t in triples], median_step, boot_median, rng
    )
    a_a = ratio_figures(
        [t["A'"] for t in triples], [t["A"] for t in triples], median_step, boot_median, rng
    )
    plain = [median_step(t[r]) for t in triples for r in ("A", "A'")]
    probed = [median_step(t["B"]) for t in triples]
    return {
        "law": job_law,
        "steps_per_run": steps,
        "warmup_steps": OVERHEAD_WARMUP,
        "runs": runs,
        "probe_over_plain": with_probe,
        "a_a": a_a,
        "probe_minus_plain_ms_per_step": 1e3 * (float(np.median(probed)) - float(np.median(plain))),
        # Lightning's own cost per step beyond the injected sleeps (M x MICRO x D)
        "lightning_ms_per_step_beyond_sleep": 1e3 * (float(np.median(plain)) - M * MICRO * D),
    }


def remedy_part(args: argparse.Namespace, out: Path, rng: np.random.Generator) -> dict:
    """``--pairs`` rounds of the four jobs (module docstring), order rotated per round."""
    steps = args.steps or STEPS["remedy"]
    job_law = law(True, args.seed)
    jobs = ["lightning_ddp", "lightning_straggler", "ddp_loop", "step_loop"]
    rounds: list[dict[str, dict[str, np.ndarray]]] = []
    runs: list[dict[str, Any]] = []
    for k in range(args.pairs):
        tables: dict[str, dict[str, np.ndarray]] = {}
        for job in rotated(jobs, k):
            began = time.perf_counter()
            rows = run_job(job, out / "remedy" / f"round{k}" / job, steps, job_law, args.spec)
            tables[job] = step_table(rows, REMEDY_WARMUP)
            ruled = rows[0][REMEDY_WARMUP:] if rows[0][0].get("completed") is not None else []
            mean_completed = (
                np.mean([r["completed"] for r in ruled], axis=0).tolist() if ruled else None
            )
            tau = float(np.median([r["threshold"] for r in ruled])) if ruled else None
            runs.append(
                {
                    "round": k, "job": job, "samples_per_second": per_second(tables[job]),
                    "median_step_s": median_step(tables[job]),
                    "samples_per_step": float(tables[job]["samples"].mean()),
                    "completed_per_rank_per_step": mean_completed,
                    "threshold_median_s": tau,
                    "count_checked": count_checked(rows),
                    "seconds_with_start_up": time.perf_counter() - began,
                }
            )  # fmt: skip
            print(f"  remedy round {k} {job}: {runs[-1]['samples_per_second']:.0f} samples/s",
                  file=sys.stderr)  # fmt: skip
        rounds.append({job: tables[job] for job in jobs})
    return {
        "law": job_law,
        "spec": args.spec,
        "steps_per_run": steps,
        "warmup_steps": REMEDY_WARMUP,
        "runs": runs,
        "figures": remedy_figures(rounds, rng),
    }


def chosen(parts: dict[str, Any]) -> list[float]:
    """The rule's thresholds in the remedy's runs (median per run, seconds), sorted."""
    runs = parts.get("remedy", {}).get("runs", [])
    return sorted(r["threshold_median_s"] for r in runs if r.get("threshold_median_s"))


def goals(parts: dict[str, Any]) -> dict[str, Any]:
    """Issue 39's two benchmark goals, each ``{value, goal, met}`` with what it read (None
    where the part was not run)."""
    out: dict[str, Any] = {}
    overhead = parts.get("overhead")
    if overhead is not None:
        value = overhead["probe_over_plain"]["median"]
        out["probe_overhead"] = {
            "value": value,
            "goal": f"<= {OVERHEAD_GOAL}",
            "met": value <= OVERHEAD_GOAL,
            "band": overhead["probe_over_plain"]["band"],
            "a_a": overhead["a_a"]["median"],
            "a_a_band": overhead["a_a"]["band"],
            "a_a_ratios": overhead["a_a"]["ratios"],
            "ratios": overhead["probe_over_plain"]["ratios"],
        }
    remedy = parts.get("remedy")
    if remedy is not None:
        f = remedy["figures"]
        counted = [r["count_checked"] for r in remedy["runs"] if r["count_checked"] is not None]
        out["dropcompute_speedup_share"] = {
            "value": f["ratio_median"],
            "goal": f">= {REMEDY_GOAL}",
            "met": f["ratio_median"] >= REMEDY_GOAL,
            "band": f["ratio_band"],
            "lightning_speedup": f["lightning_speedup_median"],
            "step_speedup": f["step_speedup_median"],
            "ratios": f["ratio"],
            "count_checked": all(counted) if counted else None,
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument("--quick", action="store_true", help="1 triple, 1 round, 40-step runs")
    parser.add_argument("--parts", nargs="+", choices=["overhead", "remedy"])
    parser.add_argument("--pairs", type=int, default=3, help="triples / rounds per part")
    parser.add_argument("--steps", type=int, default=None, help="optimizer steps per run")
    parser.add_argument("--spec", default=SPEC, help="the remedy's rule, both loops alike")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="keep the runs' folders here")
    args = parser.parse_args()
    if args.pairs < 1:
        parser.error("--pairs must be >= 1")
    if args.steps is not None and args.steps <= REMEDY_WARMUP + 2:
        parser.error(f"--steps must exceed {REMEDY_WARMUP + 2} (the warm-up)")
    if args.quick:
        args.pairs, args.steps = 1, args.steps or QUICK_STEPS["remedy"]
    args.parts = args.parts or ["overhead", "remedy"]
    import torch

    import lightning

    load_start = os.getloadavg()
    started = time.perf_counter()
    rng = np.random.default_rng(args.seed)
    parts: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench_trainers_") as tmp:
        out = args.out or Path(tmp)
        for part in args.parts:
            run = overhead_part if part == "overhead" else remedy_part
            parts[part] = run(args, out, rng)
    report = {
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "load_start": list(load_start),
            "load_end": list(os.getloadavg()),
            "torch": torch.__version__,
            "lightning": lightning.__version__,
        },
        "seconds": time.perf_counter() - started,
        "settings": {
            "quick": args.quick,
            "pairs": args.pairs,
            "seed": args.seed,
            "micro_batch": MICRO,
            "micro_batches": M,
            "seconds_per_sample": D,
            "bootstrap_draws": DRAWS,
            "band_percentiles": list(BAND),
        },
        "bounds": {"remedy": remedy_bound(taus=chosen(parts))} if "remedy" in parts else {},
        "parts": parts,
        "goals": goals(parts),
    }
    if args.json:
        print(json.dumps(report, indent=1, default=float))
    else:
        for key, goal in report["goals"].items():
            print(f"{key}: {json.dumps(goal, default=float)}")


if __name__ == "__main__":
    main()
