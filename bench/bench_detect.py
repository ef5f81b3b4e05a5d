"""Straggler detection drills with a known truth: the probe against the rules users have.

    python bench/bench_detect.py --json            # the full run (>= 100 drills)
    python bench/bench_detect.py --quick --json    # one drill per kind
    python bench/bench_detect.py --only overhead --overhead-pairs 120 --json

One forked job of ``--ranks`` gloo processes (default 6) runs drill after drill. A drill is a
DDP loop on a tiny model whose step is dominated by injected sleeps (data 10 ms, forward 45 ms,
backward 45 ms; the model, DDP and the optimizer compute in about a millisecond), so a
slowdown is a longer sleep, which needs no CPU, and the culprit stands out however loaded the
shared 2-core machine is. Kinds, with the truth they carry:

* ``persistent-<x>x-<r>``: r ranks (1 or 2) have data, forward and backward x times longer
  (x in 1.1, 1.2, 1.5, 2) for the whole drill: truth ``persistent``;
* ``stall``: one rank runs 3x for 5-10 steps from a random step in 12..20, then recovers:
  ``intermittent``;
* ``backward``: one rank's backward only is 2x (hidden from a forward timer): ``persistent``;
* ``data``: one rank's loader takes 25 ms more a batch (1.25x a step): ``persistent``;
* ``healthy``: no drill: nobody may be named.

Detectors, each one JSON row:

* ``tailtrain-probe``: :class:`tailtrain.StragglerProbe` as a user adds it (``watch`` +
  ``batches``) at its default setting, the one the overhead below is measured at: a first
  report after ``warmup`` + ``LIVE_MIN_STEPS`` steps, then a gather and report about every
  ``probe.INTERVAL`` seconds, and the last at the drill's end (the loader's end flushes); its
  verdicts are read live, as rank 0 logs them.
* ``nvidia-resiliency-ext rule (implemented here)``: the documented rule of
  ``nvidia_resiliency_ext.straggler`` (relative score = the fastest rank's median section time
  over the rank's; individual score = the rank's best median over its current one; straggler
  below the default threshold 0.75) on the sections its usage guide marks, ``data_loading``
  and ``fwd``, timed on the host per step and scored per report window of ``PEER_WINDOW``
  steps (their own cadence: these rules are scored on the sections afterwards;
  ``bench/detect_scoring.py`` holds both rules and the scoring). The package
  itself needs CUDA (the note carries the exact error); ``bench/gpu_detect.py`` runs the real
  Detector on a GPU.
* ``TraceML rule (implemented here)``: per report window, the culprit is the rank that waited
  least at the sync point (the median of the probe's wait), named when the ranks' own times
  (data + compute) are skewed by 10% or more ((max - min) / max of their medians).

Per detector, in total and per kind, at each drill's end: precision and recall of the named
ranks, and (where the detector gives a kind) of the persistent/intermittent verdicts; the
seconds from a drill's start to the first report whose named ranks and verdicts are all
correct. ``goals`` checks precision >= 0.99 and recall >= 0.95 over the drills of 1.2x and
more (every kind but the 1.1x ones), verdict within 30 s. ``healthy_slowdown``: the
slowdowns the probe gives ranks healthy in truth, the noise its least effect must sit above.

Overhead, two ways. ``overhead``: the same healthy loop on three DDP copies of the model, one
watched by the probe at its defaults, as in the drills (``watch``, and ``probe.step()`` per
step: see :func:`overhead_pairs`), and two without (``plain`` and ``twin``), in interleaved
sets of three blocks (called pairs), the order cycling through the six permutations pair by
pair, many pairs. A block is one of the probe's windows: the steps from one gather to the
next, which the probe plans at each gather (``probe.next_gather``); the loops without the
probe run as many steps. So every probe block holds exactly one gather (issued at its last
step, settled before the block ends: see :func:`overhead_pairs`) and rank 0's report, as the
probe's cadence spreads them over a run (a block of fixed steps would hold one gather or none
by chance). The median over pairs of the ratio with / without (probe / plain), and its 95%
confidence interval (order statistics of the ratios); beside it ``overhead_aa``, twin / plain
with its interval: what two identical loops give, the method's own bias and resolution
(``overhead_position_effect``: per position in a pair, a block's median wall over its pair's
mean).
On a loaded machine a block's wall time swings by tens of percent, so that median resolves a
percent only with many pairs; ``probe_cpu_share_of_step`` measures the probe's own cost
directly: the CPU seconds spent inside its calls (the marks in the gradient hooks, each step's
close with the window's all-gather and rank 0's verdicts), per step, over the median step's
wall seconds without the probe; the largest over the ranks (rank 0 judges). (The probe's
first way of timing DDP, a Python comm hook, was compared here until commit 1b9c0bd: about 3%
of a step; see the probe's module docstring.)

Every rank runs on one core (``--cpu``): the machine's other load then delays them alike.
Spread over the two cores, whose queues differ, a healthy rank ran 1.2-1.3x the others for a
whole drill (measured at load 19), slow in fact though no drill made it so. Each drill's
``noise_s`` is the largest median seconds a rank's step took beyond its injected sleeps;
``detectors_on_clean_drills`` repeats the rows over the drills whose noise stayed under
``NOISE_LIMIT`` (10% of a step), beside the rows over every drill.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import logging
import os
import socket
import sys
import tempfile
import threading
import time
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from tailtrain import StragglerProbe
from tailtrain.integrate import probe as probe_module

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.detect_scoring import (
    evaluate,
    healthy_slowdown,
    median_ci,
    noise,
    nvidia_error,
)

DATA, FWD, BWD = 0.01, 0.045, 0.045  # seconds a step, before any drill
STEPS, STALL = 40, 3.0
#: the probe's setting in the drills and in the overhead pairs alike: its defaults
PROBE_SETTING = {
    "interval_s": probe_module.INTERVAL,
    "every": None,
    "first_window_steps": StragglerProbe.__init__.__kwdefaults__["warmup"]
    + probe_module.LIVE_MIN_STEPS,
    "max_window_steps": probe_module.MAX_WINDOW,
}
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


class TimedProbe(StragglerProbe):
    """The probe, with the CPU seconds spent inside its calls summed, on whichever thread (the
    marks in the gradient hooks, the step's close with its window's gather, rank 0's verdicts
    on its reporting thread): the probe's own cost, measured directly."""

    spent = 0.0
    inside = threading.local()  # a call timed already on this thread: not twice
    lock = threading.Lock()

    def _timed(self, method, *args):
        if getattr(self.inside, "busy", False):
            return method(self, *args)
        self.inside.busy, began = True, time.thread_time()
        try:
            return method(self, *args)
        finally:
            with self.lock:
                self.spent += time.thread_time() - began
            self.inside.busy = False

    def _mark_ready(self) -> None:
        self._timed(StragglerProbe._mark_ready)

    def _mark_synced(self) -> None:
        self._timed(StragglerProbe._mark_synced)

    def _close_step(self, force: bool = False) -> None:
        self._timed(StragglerProbe._close_step, force)

    def _report(self, window) -> None:
        self._timed(StragglerProbe._report, window)


def run_drill(rank: int, drill: Drill) -> dict:
    """One drill on this rank; rank 0 returns the reports and every rank's sections."""
    model = Model()
    ddp = DistributedDataParallel(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01)
    reports: list[dict] = []
    started = time.perf_counter()

    def keep(report) -> None:
        slowdown = {v.worker: round(v.slowdown, 4) for v in report.verdicts}
        elapsed = time.perf_counter() - started
        reports.append(
            {"step": report.step, "elapsed": elapsed, "named": report.named(), "slowdown": slowdown}
        )

    probe = StragglerProbe(None, horizon=STEPS, on_report=keep).watch(ddp)  # its defaults
    mult = drill.factor.get(rank, (1.0, 1.0, 1.0))
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

    for bx, by in probe.batches(loader()):
        optimizer.zero_grad()
        began = time.perf_counter()
        out = ddp(bx)
        fwd_times.append(time.perf_counter() - began)  # the "fwd" section a user would mark
        F.mse_loss(out, by).backward()
        optimizer.step()
    wall = time.perf_counter() - started
    sections = [None] * dist.get_world_size()
    dist.all_gather_object(sections, (data_times, fwd_times, injected))
    history = probe.history.tolist() if rank == 0 else None
    del ddp
    return {"reports": reports, "sections": sections, "history": history, "wall": wall}


#: the loops of the overhead blocks: without a probe, with it, and a second one without (the
#: A/A control: what ratio two identical loops on two DDP copies give in this method)
LOOPS = ("plain", "probe", "twin")
#: the orders of the three blocks, cycled pair by pair: each loop holds each position, and
#: follows each other loop, equally often over a multiple of six pairs
ORDERS = list(itertools.permutations(LOOPS))


def overhead_pairs(pairs: int) -> tuple[list[dict], float]:
    """The same healthy loop on three DDP copies of the model (no probe, the probe at its
    defaults, and no probe again as the A/A control), in interleaved blocks of one probe window
    each (the order cycling through the six permutations pair by pair): per pair the steps, the
    order and the wall seconds of each loop; and the probe's own CPU seconds per step. The
    probe times each step with ``probe.step()``, the loader's sleep inside: ``batches`` would
    end each block as a loader's end, whose flush waits for the window's gather, where a run's
    blocks of steps are no epochs and its gathers are waited for at the next step's close.

    A probe block ends with its window settled: the all-gather issued at its last step's close
    runs on gloo's own thread, and, left in flight, its work (on the one core every rank
    shares) would land in whichever block comes next, a loop without the probe half the time
    (measured in ``settle``: the seconds that wait took); rank 0's report thread too. Waiting
    for them inside the probe block charges the probe with all its cost, a little more than a
    run pays, where the gather overlaps the next steps. Every block, of every loop, then ends
    with a barrier, timed: the wall seconds are rank 0's, and a rank still finishing a block
    when rank 0 starts the next would hold that block's first reduction, so its lag would be
    charged to the next block's loop; with the barrier each block holds its own ranks' lag and
    starts with them together."""
    x, y = torch.randn(8, 16), torch.randn(8, 4)
    models = {name: Model() for name in LOOPS}
    for m in models.values():
        m.fwd, m.bwd = FWD, BWD
    loops = {name: DistributedDataParallel(m) for name, m in models.items()}
    probe = TimedProbe(None).watch(loops["probe"])
    optimizers = {name: torch.optim.SGD(m.parameters(), lr=0.01) for name, m in loops.items()}

    def one_step(name: str) -> None:
        time.sleep(DATA)  # the loader
        optimizers[name].zero_grad()
        F.mse_loss(loops[name](x), y).backward()
        optimizers[name].step()

    def block(name: str, steps: int) -> tuple[float, float]:
        began = time.perf_counter()
        for _ in range(steps):
            if name == "probe":
                with probe.step():  # not batches(): a block is no epoch (see overhead_pairs)
                    one_step(name)
            else:
                one_step(name)
        settling = time.perf_counter()
        if name == "probe":  # the window settled inside its block (see overhead_pairs)
            if probe.flight is not None and probe.flight.work is not None:
                probe.flight.work.wait()
            futures.wait(probe.reports)
        settled = time.perf_counter()
        dist.barrier()  # every rank done with this block (see overhead_pairs)
        return time.perf_counter() - began, settled - settling

    walls = []
    for pair in range(pairs):
        steps = probe.next_gather - probe.steps  # the probe's window: it ends with a gather
        order = ORDERS[pair % len(ORDERS)]
        timed = {name: block(name, steps) for name in order}
        walls.append(
            {"steps": steps, "order": order, "settle": timed["probe"][1]}
            | {name: wall for name, (wall, _) in timed.items()}
        )
    return walls, probe.spent / max(probe.steps, 1)


def rank_main(rank: int, world: int, port: int, plan: list[Drill], overhead: int, out: str):
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=120),
    )
    logging.getLogger("tailtrain.probe").setLevel(logging.ERROR)  # the verdicts are scored
    results = [run_drill(rank, d) for d in plan]
    walls, probe_cpu = overhead_pairs(overhead)
    cpu = [None] * world
    dist.all_gather_object(cpu, probe_cpu)
    if rank == 0:
        with open(out, "w") as fh:
            json.dump({"results": results, "walls": walls, "probe_cpu": cpu}, fh)
    dist.barrier()
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=6)
    parser.add_argument("--seeds", type=int, default=9, help="drills per kind (12 kinds)")
    parser.add_argument("--overhead-pairs", type=int, default=40)
    parser.add_argument("--quick", action="store_true", help="one seed, four overhead pairs")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--cpu", type=int, default=os.cpu_count() - 1, help="every rank's core")
    parser.add_argument("--dump", help="also write every drill's raw results (JSON) here")
    parser.add_argument("--only", choices=["overhead"], help="run only this part (no drills)")
    args = parser.parse_args()
    if not 4 <= args.ranks <= 8:
        parser.error("--ranks must be 4..8")
    seeds, pairs = (1, 4) if args.quick else (args.seeds, args.overhead_pairs)
    plan = [] if args.only == "overhead" else drills(args.ranks, seeds)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    # every rank on one core: the machine's other load then delays them alike, where ranks
    # spread over two cores with unequal queues differ by 1.3x for whole drills (measured)
    os.sched_setaffinity(0, {args.cpu})
    began, load = time.time(), os.getloadavg()
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
    if args.dump:
        with open(args.dump, "w") as fh:
            json.dump(got, fh)
    walls = {
        name: np.array([w[name] for w in got["walls"]]) for name in (*LOOPS, "steps", "settle")
    }
    ratios = walls["probe"] / walls["plain"]
    aa = walls["twin"] / walls["plain"]  # two identical loops: the method's own bias
    # per position in a pair, the median of a block's wall over its pair's mean (1: no effect)
    mean = sum(walls[name] for name in LOOPS) / len(LOOPS)
    at = [[w[w["order"][k]] for w in got["walls"]] for k in range(len(LOOPS))]
    # seconds a step without the probe
    step = float(np.median(walls["plain"] / walls["steps"])) if len(ratios) else float("nan")
    overhead = {
        "probe_setting": PROBE_SETTING,
        "overhead": float(np.median(ratios)),
        "overhead_ci95": median_ci(ratios),
        "overhead_aa": float(np.median(aa)),
        "overhead_aa_ci95": median_ci(aa),
        # the probe blocks less their settling wait: the gather's latency, which a run overlaps
        "overhead_less_settle": float(
            np.median((walls["probe"] - walls["settle"]) / walls["plain"])
        ),
        "overhead_probe_vs_twin": float(np.median(walls["probe"] / walls["twin"])),
        "overhead_position_effect": [round(float(np.median(np.array(a) / mean)), 4) for a in at],
        "overhead_settle_seconds_median_max": [
            round(float(np.median(walls["settle"])), 5),
            round(float(walls["settle"].max()), 5),
        ]
        if len(ratios)
        else [],
        "overhead_pairs": len(ratios),
        "overhead_steps_per_block": np.unique(walls["steps"], return_counts=True)[0].tolist(),
        "overhead_ratios": ratios.round(4).tolist(),
        "step_seconds_without_probe": round(step, 5),
        "probe_cpu_seconds_per_step": [round(c, 7) for c in got["probe_cpu"]],
        "probe_cpu_share_of_step": round(max(got["probe_cpu"]) / step, 5),
    }
    machine = (
        f"{os.cpu_count()} cores (the ranks on core {args.cpu}), torch {torch.__version__}, gloo"
    )
    if args.only == "overhead":
        report = {
            "ranks": args.ranks,
            "seconds": round(time.time() - began, 1),
            "load_average_1_5_15_min": {"start": load, "end": os.getloadavg()},
            **overhead,
            "machine": machine,
        }
        if args.json:
            json.dump(report, sys.stdout, indent=1)
            sys.stdout.write("\n")
        else:
            print(
                f"overhead {report['overhead']:.4f} {report['overhead_ci95']}, A/A "
                f"{report['overhead_aa']:.4f} {report['overhead_aa_ci95']}"
            )
        return
    clean = [i for i, r in enumerate(got["results"]) if noise(r) <= NOISE_LIMIT]
    report = {
        "drills": len(plan),
        "ranks": args.ranks,
        "steps_per_drill": STEPS,
        "seconds": round(time.time() - began, 1),
        "load_average_1_5_15_min": {"start": load, "end": os.getloadavg()},
        "detectors": evaluate(plan, got["results"], STEPS),
        "noise_limit_s": NOISE_LIMIT,
        "clean_drills": len(clean),
        "detectors_on_clean_drills": evaluate(plan, got["results"], STEPS, clean) if clean else [],
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
        "healthy_slowdown": healthy_slowdown(plan, got["results"]),
        **overhead,
        "nvidia_resiliency_ext": nvidia_error(),
        "machine": machine,
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
    print(
        f"overhead {report['overhead']:.4f} (probe CPU {report['probe_cpu_share_of_step']:.4f} "
        f"of a step); load {report['load_average_1_5_15_min']}"
    )
    print(f"nvidia: {report['nvidia_resiliency_ext']}")


if __name__ == "__main__":
    main()
