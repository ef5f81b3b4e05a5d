"""Straggler detection drills with a known truth: the probe against the rules users have.

    python bench/bench_detect.py --json            # the full run (>= 100 drills)
    python bench/bench_detect.py --quick --json    # one drill per kind

One forked job of ``--ranks`` gloo processes (default 6) runs drill after drill. A drill is a
DDP loop on a tiny model whose step is dominated by injected sleeps (data 4 ms, forward 25 ms,
backward 25 ms; the model itself computes in well under a millisecond), so slowdowns dominate
the noise of a shared 2-core machine. Kinds, with the truth they carry:

* ``persistent-<x>x-<r>``: r ranks (1 or 2) have data, forward and backward x times longer
  (x in 1.1, 1.2, 1.5, 2) for the whole drill: truth ``persistent``;
* ``stall``: one rank runs 3x for 5-10 steps from a random step in 12..20, then recovers:
  ``intermittent``;
* ``backward``: one rank's backward only is 2x (hidden from a forward timer): ``persistent``;
* ``data``: one rank's loader takes 25 ms more a batch: ``persistent``;
* ``healthy``: no drill: nobody may be named.

Detectors, each one JSON row:

* ``tailtrain-probe``: :class:`tailtrain.StragglerProbe` as a user adds it (``watch`` +
  ``batches``), reporting every 5 steps; its verdicts are read live, as rank 0 logs them.
* ``nvidia-resiliency-ext rule (implemented here)``: the documented rule of
  ``nvidia_resiliency_ext.straggler`` (relative score = the fastest rank's median section time
  over the rank's; individual score = the rank's best median over its current one; straggler
  below the default threshold 0.75) on the sections its usage guide marks, ``data_loading``
  and ``fwd``, timed on the host per step and scored per report window of 5 steps. The package
  itself needs CUDA (the note carries the exact error); ``bench/gpu_detect.py`` runs the real
  Detector on a GPU.
* ``TraceML rule (implemented here)``: per report window, the culprit is the rank that waited
  least at the sync point (the median of the probe's wait), named when the ranks' own times
  (data + compute) are skewed by 10% or more ((max - min) / max of their medians).

Per detector, in total and per kind, at each drill's end: precision and recall of the named
ranks, and (where the detector gives a kind) of the persistent/intermittent verdicts; the
seconds from a drill's start to the first report whose named ranks and verdicts are all
correct. ``goals`` checks precision >= 0.99 and recall >= 0.95 over the drills of 1.2x and
more (every kind but the 1.1x ones), verdict within 30 s. ``overhead``: the same healthy loop
with and without the probe, in alternating blocks, median ratio of their step times.

The drills assume the injected slowdowns dominate the machine's noise. On a shared machine
they may not: a healthy rank that the scheduler starves runs 1.7x for a whole drill, and is
slow in fact. Each drill's ``noise_s`` is the largest median seconds a rank's step took beyond
its injected sleeps; ``detectors_on_clean_drills`` repeats the rows over the drills whose
noise stayed under ``NOISE_LIMIT`` (10% of a step), beside the rows over every drill.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import sys
import tempfile
import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from tailtrain import StragglerProbe

DATA, FWD, BWD = 0.004, 0.025, 0.025  # seconds a step, before any drill
STEPS, EVERY, STALL = 40, 5, 3.0
NVIDIA_THRESHOLD, TRACEML_SKEW = 0.75, 0.10
SLOWDOWNS = (1.1, 1.2, 1.5, 2.0)
#: a drill is clean when no rank's median step ran this much past its injected sleeps: there
#: the injected slowdowns dominate the machine's noise, as the drills assume
NOISE_LIMIT = 0.1 * (DATA + FWD + BWD)


@dataclass(frozen=True)
class Drill:
    kind: str
    seed: int
    truth: dict[int, str]  # rank -> verdict
    factor: dict[int, tuple[float, float, float]]  # rank -> (data, fwd, bwd) multipliers
    stall: tuple[int, int, int] | None = None  # (rank, first step, steps)


def drills(ranks: int, seeds: int) -> list[Drill]:
    out = []
    for seed in range(seeds):
        rng = np.random.default_rng(seed)
        pick = [int(r) for r in rng.permutation(ranks)[:2]]
        for x in SLOWDOWNS:
            for count in (1, 2):
                slow = pick[:count]
                out.append(
                    Drill(
                        f"persistent-{x}x-{count}",
                        seed,
                        dict.fromkeys(slow, "persistent"),
                        dict.fromkeys(slow, (x, x, x)),
                    )
                )
        r = pick[0]
        first, length = int(rng.integers(12, 21)), int(rng.integers(5, 11))
        out.append(Drill("stall", seed, {r: "intermittent"}, {}, (r, first, length)))
        out.append(Drill("backward", seed, {r: "persistent"}, {r: (1.0, 1.0, 2.0)}))
        data = 1 + 0.025 / DATA
        out.append(Drill("data", seed, {r: "persistent"}, {r: (data, 1.0, 1.0)}))
        out.append(Drill("healthy", seed, {}, {}))
    return out


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
        self.fwd = self.bwd = 0.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(self.fwd)
        out = self.net(x)
        if self.bwd and out.requires_grad:
            out.register_hook(lambda g: time.sleep(self.bwd) or g)  # backward only
        return out


def run_drill(rank: int, drill: Drill | None, probe_on: bool = True) -> dict:
    """One drill on this rank; rank 0 returns the reports and every rank's sections."""
    model = Model()
    ddp = DistributedDataParallel(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01)
    reports: list[dict] = []
    started = time.perf_counter()

    def keep(report) -> None:
        reports.append({"elapsed": time.perf_counter() - started, "named": report.named()})

    probe = StragglerProbe(None, every=EVERY, horizon=STEPS, on_report=keep) if probe_on else None
    if probe is not None:
        probe.watch(ddp)
    mult = drill.factor.get(rank, (1.0, 1.0, 1.0)) if drill else (1.0, 1.0, 1.0)
    x, y = torch.randn(8, 16), torch.randn(8, 4)
    data_times, fwd_times, injected = [], [], []

    def loader():
        for step in range(STEPS):
            stalled = (
                drill
                and drill.stall
                and drill.stall[0] == rank
                and (drill.stall[1] <= step < drill.stall[1] + drill.stall[2])
            )
            k = STALL if stalled else 1.0
            model.fwd, model.bwd = FWD * mult[1] * k, BWD * mult[2] * k
            injected.append(DATA * mult[0] * k + model.fwd + model.bwd)
            began = time.perf_counter()
            time.sleep(DATA * mult[0] * k)
            data_times.append(time.perf_counter() - began)
            yield x, y

    batches = probe.batches(loader()) if probe is not None else loader()
    for bx, by in batches:
        optimizer.zero_grad()
        began = time.perf_counter()
        out = ddp(bx)
        fwd_times.append(time.perf_counter() - began)  # the "fwd" section a user would mark
        F.mse_loss(out, by).backward()
        optimizer.step()
    wall = time.perf_counter() - started
    sections = [None] * dist.get_world_size()
    dist.all_gather_object(sections, (data_times, fwd_times, injected))
    history = probe.history.tolist() if probe is not None and rank == 0 else None
    del ddp
    return {"reports": reports, "sections": sections, "history": history, "wall": wall}


def rank_main(rank: int, world: int, port: int, plan: list[Drill], overhead: int, out: str):
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=120),
    )
    results = [run_drill(rank, d) for d in plan]
    walls = []  # (with probe, without) per pair, alternating which goes first
    for pair in range(overhead):
        order = (True, False) if pair % 2 == 0 else (False, True)
        got = {on: run_drill(rank, None, probe_on=on)["wall"] for on in order}
        walls.append((got[True], got[False]))
    if rank == 0:
        with open(out, "w") as fh:
            json.dump({"results": results, "walls": walls}, fh)
    dist.barrier()
    dist.destroy_process_group()


# ---- the peers' rules, on the sections every drill recorded ----------------------------
def nvidia_rule(sections: list, history: np.ndarray) -> list[dict]:
    """Per window of EVERY steps: a rank is a straggler when a section's relative score
    (fastest rank's median / its median) or individual score (its best median so far / its
    current median) is below 0.75 (nvidia_resiliency_ext.straggler Report.identify_stragglers
    defaults), sections data_loading and fwd."""
    out, best = [], {}
    data = np.array([s[0] for s in sections]).T  # steps x ranks
    fwd = np.array([s[1] for s in sections]).T
    for end in range(EVERY, STEPS + 1, EVERY):
        named = {}
        for name, table in (("data_loading", data), ("fwd", fwd)):
            median = np.median(table[end - EVERY : end], axis=0)
            relative = median.min() / median
            best[name] = np.minimum(best.get(name, median), median)
            individual = best[name] / median
            for r in np.flatnonzero(
                (relative < NVIDIA_THRESHOLD) | (individual < NVIDIA_THRESHOLD)
            ):
                named[int(r)] = "straggler"
        out.append({"step": end, "named": named})
    return out


def traceml_rule(history: np.ndarray) -> list[dict]:
    """Per window: the rank that waited least is the culprit, named at a skew of 10%."""
    out = []
    for end in range(EVERY, STEPS + 1, EVERY):
        window = history[end - EVERY : end]
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


def evaluate(plan: list[Drill], results: list[dict], only: list[int] | None = None) -> dict:
    """Every detector's row over the drills ``only`` (default: all)."""
    if only is not None:
        plan, results = [plan[i] for i in only], [results[i] for i in only]
    detectors = {
        "tailtrain-probe": ([], [], True),
        "nvidia-resiliency-ext rule (implemented here)": ([], [], False),
        "TraceML rule (implemented here)": ([], [], False),
    }
    for res in results:
        history = np.array(res["history"])
        step_time = res["wall"] / STEPS
        ours = detectors["tailtrain-probe"]
        ours[0].append(res["reports"])
        ours[1].append([r["elapsed"] for r in res["reports"]])
        for name, found in (
            (
                "nvidia-resiliency-ext rule (implemented here)",
                nvidia_rule(res["sections"], history),
            ),
            ("TraceML rule (implemented here)", traceml_rule(history)),
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


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=6)
    parser.add_argument("--seeds", type=int, default=9, help="drills per kind (12 kinds)")
    parser.add_argument("--overhead-pairs", type=int, default=8)
    parser.add_argument("--quick", action="store_true", help="one seed, two overhead pairs")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if not 4 <= args.ranks <= 8:
        parser.error("--ranks must be 4..8")
    seeds, pairs = (1, 2) if args.quick else (args.seeds, args.overhead_pairs)
    plan = drills(args.ranks, seeds)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    began = time.time()
    with tempfile.TemporaryDirectory() as folder:
        out = f"{folder}/results.json"
        mp.start_processes(
            rank_main,
            (args.ranks, free_port(), plan, pairs, out),
            nprocs=args.ranks,
            start_method="fork",
        )
        with open(out) as fh:
            got = json.load(fh)
    clean = [i for i, r in enumerate(got["results"]) if noise(r) <= NOISE_LIMIT]
    walls = np.array(got["walls"])
    ratios = walls[:, 0] / walls[:, 1]
    report = {
        "drills": len(plan),
        "ranks": args.ranks,
        "steps_per_drill": STEPS,
        "seconds": round(time.time() - began, 1),
        "detectors": evaluate(plan, got["results"]),
        "noise_limit_s": NOISE_LIMIT,
        "clean_drills": len(clean),
        "detectors_on_clean_drills": evaluate(plan, got["results"], clean) if clean else [],
        "drill_finals": [
            {
                "kind": d.kind,
                "seed": d.seed,
                "truth": d.truth,
                "noise_s": round(noise(r), 4),
                "probe": r["reports"][-1]["named"] if r["reports"] else {},
            }
            for d, r in zip(plan, got["results"], strict=True)
        ],
        "overhead": float(np.median(ratios)),
        "overhead_pairs": ratios.round(4).tolist(),
        "nvidia_resiliency_ext": nvidia_error(),
        "machine": f"{os.cpu_count()} cores, torch {torch.__version__}, gloo",
    }
    if args.json:
        json.dump(report, sys.stdout, indent=1)
        sys.stdout.write("\n")
        return
    for row in report["detectors"]:
        sub = row["at_1.2x_and_more"]
        print(
            f"{row['detector']}: >=1.2x precision {sub['rank_precision']}, recall "
            f"{sub['rank_recall']}, verdict {sub['verdict_precision']}/{sub['verdict_recall']}, "
            f"to correct max {sub['seconds_to_correct_max']} s, goals met {row['goals_met']}"
        )
    print(f"overhead {report['overhead']:.4f}; nvidia: {report['nvidia_resiliency_ext']}")


if __name__ == "__main__":
    main()
