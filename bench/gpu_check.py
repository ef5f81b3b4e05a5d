"""The GPU check: `train` and `StragglerStep` on CUDA, as one JSON line.

    python bench/gpu_check.py              # one JSON line; exit 0 when every part ran
    python bench/gpu_check.py --iterations 20

On a machine without CUDA it prints ``{"cuda": false, ...}`` saying so and exits 0. With CUDA:

* ``train_nccl``: ``sync`` and ``dropcompute:threshold=auto`` through ``train`` (the allreduce
  topology) on nccl, one rank per GPU present (at most 8). ``train`` computes a task's
  gradients on the CPU (a task's model is a flat numpy-backed vector); nccl carries the
  weighted reduce, whose buffers live on the GPU.
* ``train_gloo_cuda``: the same two runs with 4 gloo ranks whose collectives reduce CUDA
  tensors (``TrainConfig(device="cuda")``), all on the first GPU: the case of one GPU.
* ``straggler_step``: :class:`tailtrain.integrate.StragglerStep` on a CUDA model in 2 ranks
  (nccl where there are 2 GPUs, else gloo on CUDA tensors sharing the first GPU), rank 1 a
  straggler (20 ms on a fifth of its micro-batches), ``sync`` then ``dropcompute``. On rank
  0 (never delayed) each micro-batch is timed twice: by the runtime's wall clock
  (``Rounds.clock``: ``torch.cuda.synchronize`` then ``perf_counter``) and by CUDA events
  from the start of its forward to the last parameter's gradient accumulation. The two agree
  when the runtime's clock measures the GPU's work rather than the kernel launches;
  ``wall_over_events`` is their ratio of medians.

Runs use ``train``'s injected delays (``const:value=0.02+dropcompute-noise:scale=0.02``, M = 12,
as ``bench_runtime.py``'s DropCompute goal), so the threshold has stragglers to cut. Reported
per run: mean iteration seconds after the calibration rounds, tau*, the drop rate and T^c.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import socket
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tailtrain.core.scenario import Scenario
from tailtrain.runtime.config import TrainConfig
from tailtrain.runtime.launching.endpoint import Endpoint, reserve
from tailtrain.runtime.launching.launch import launch

DELAY = "const:value=0.02+dropcompute-noise:scale=0.02"
CALIBRATE = 10
STRATEGIES = ("sync", f"dropcompute:threshold=auto,calibrate={CALIBRATE}")
MICRO_BATCHES = 12
GLOO_RANKS = 4
#: StragglerStep's model and data: wide enough that a micro-batch is GPU work, not launches
WIDTH, BATCH, STEP_MICRO_BATCHES = 2048, 1024, 8
STEP_ROUNDS, STEP_CALIBRATE = 30, 5


def summarise_run(record: Any, skip: int) -> dict[str, Any]:
    """Mean seconds per round after ``skip`` rounds, tau*, drop rate and T^c of one run."""
    times = np.diff(np.concatenate([[0.0], record.column("time")]))[skip:]
    summary = record.summary
    threshold = summary.get("threshold")
    return {
        "iteration_s": float(times.mean()),
        "threshold_s": None if threshold is None or math.isinf(threshold) else threshold,
        "drop_rate": summary.get("drop_rate"),
        "comm_time_s": float(record.column("comm_time")[skip:].mean()),
        "rounds": len(record.steps),
    }


def train_runs(backend: str, ranks: int, device: str | None, iterations: int) -> dict[str, Any]:
    """``sync`` and DropCompute through ``train``'s local launcher, in one job."""
    scenario = Scenario(
        task="logreg",
        workers=ranks,
        micro_batches=MICRO_BATCHES,
        delay=DELAY,
        iterations=iterations,
        eval_every=iterations,
    )
    configs = [
        TrainConfig(
            scenario=scenario,
            strategy=text,
            inject=True,
            backend=backend,
            device=device,
            timeout=120,
        )
        for text in STRATEGIES
    ]
    records = [r.record for r in launch(configs, reserve(Endpoint("127.0.0.1", 0)))[0]]
    runs = {t: summarise_run(r, CALIBRATE) for t, r in zip(STRATEGIES, records, strict=True)}
    sync, drop = (runs[t]["iteration_s"] for t in STRATEGIES)
    return {"backend": backend, "ranks": ranks, "runs": runs, "speedup": sync / drop}


# ---- StragglerStep on a CUDA model -------------------------------------------------------------
def step_rank(rank: int, world: int, backend: str, port: int, out: str) -> None:
    """One rank of the StragglerStep check; rank 0 writes its figures to ``out``."""
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch import nn

    from tailtrain.integrate import StragglerStep

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    device = torch.device("cuda", rank % torch.cuda.device_count())
    torch.cuda.set_device(device)
    dist.init_process_group(backend, rank=rank, world_size=world)
    rng = np.random.default_rng(rank)
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, 10)
    ).to(device)
    x = torch.randn(STEP_MICRO_BATCHES, BATCH, WIDTH, device=device)
    y = torch.randint(0, 10, (STEP_MICRO_BATCHES, BATCH), device=device)
    batches = [(x[u], y[u]) for u in range(STEP_MICRO_BATCHES)]
    first = next(model.parameters())  # the last gradient a backward pass accumulates
    figures: dict[str, Any] = {}
    for text in ("sync", f"dropcompute:threshold=auto,calibrate={STEP_CALIBRATE}"):
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        step = StragglerStep(model, optimizer, text)
        wall: list[np.ndarray] = []
        own_rows = step.rounds.own_rows  # observe the runtime's own per-unit seconds

        def observed(work, *args, own_rows=own_rows, wall=wall, **kwargs):
            wall.append(work.times.copy())
            return own_rows(work, *args, **kwargs)

        step.rounds.own_rows = observed
        events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
        pending: list[torch.cuda.Event] = []

        def ended(_param, pending=pending, events=events):
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            events.append((pending.pop(), end))

        hook = first.register_post_accumulate_grad_hook(ended)

        def loss_fn(batch, pending=pending):
            if rank == 1 and rng.random() < 0.2:  # the straggler
                time.sleep(0.02)
            start = torch.cuda.Event(enable_timing=True)
            start.record()
            pending.append(start)
            return F.cross_entropy(model(batch[0]), batch[1])

        records, began = [], time.perf_counter()
        for _ in range(STEP_ROUNDS):
            records.append(step(batches, loss_fn))
        torch.cuda.synchronize()
        elapsed = time.perf_counter() - began
        hook.remove()
        counted = np.concatenate([w[~np.isnan(w)] for w in wall])
        event_s = np.array([s.elapsed_time(e) / 1e3 for s, e in events])
        skip = STEP_CALIBRATE if text != "sync" else 0
        figures[text] = {
            "iteration_s": float(np.mean([r.time for r in records[skip:]])),
            "threshold_s": None if math.isinf(records[-1].threshold) else records[-1].threshold,
            "drop_rate": float(np.mean([r.drop_rate for r in records[skip:]])),
            "comm_time_s": float(np.mean([r.comm_time for r in records[skip:]])),
            "seconds": elapsed,
            "rank0_micro_batch_wall_ms": float(np.median(counted) * 1e3),
            "rank0_micro_batch_cuda_events_ms": float(np.median(event_s) * 1e3),
            "wall_over_events": float(np.median(counted) / np.median(event_s)),
        }
    if rank == 0:
        Path(out).write_text(json.dumps(figures))
    dist.barrier()
    dist.destroy_process_group()


def straggler_step() -> dict[str, Any]:
    backend = "nccl" if torch.cuda.device_count() >= 2 else "gloo"
    with tempfile.TemporaryDirectory() as folder, socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        sock.close()
        out = str(Path(folder) / "step.json")
        torch.multiprocessing.start_processes(
            step_rank, args=(2, backend, port, out), nprocs=2, start_method="spawn"
        )
        runs = json.loads(Path(out).read_text())
    sync, drop = (runs[t]["iteration_s"] for t in runs)
    return {"backend": backend, "ranks": 2, "runs": runs, "speedup": sync / drop}


def guarded(part, *args) -> dict[str, Any]:
    """A part's figures, or the one line that says why it failed (the other parts still run)."""
    began = time.perf_counter()
    try:
        figures = part(*args)
    except Exception as exc:
        traceback.print_exc(file=sys.stderr)
        lines = str(exc).strip().splitlines() or [""]
        figures = {"error": f"{type(exc).__name__}: {lines[0]}"}
    figures["part_seconds"] = time.perf_counter() - began
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=40, help="rounds per train run")
    args = parser.parse_args(argv)
    facts: dict[str, Any] = {"torch": torch.__version__, "cuda": torch.cuda.is_available()}
    if not facts["cuda"]:
        facts["note"] = "no CUDA device here: nothing to check (run it where a GPU is)"
        print(json.dumps(facts))
        return 0
    gpus = torch.cuda.device_count()
    facts.update(device=torch.cuda.get_device_name(0), gpus=gpus)
    facts["train_nccl"] = guarded(train_runs, "nccl", min(gpus, 8), None, args.iterations)
    facts["train_gloo_cuda"] = guarded(train_runs, "gloo", GLOO_RANKS, "cuda", args.iterations)
    facts["straggler_step"] = guarded(straggler_step)
    print(json.dumps(facts))
    parts = ("train_nccl", "train_gloo_cuda", "straggler_step")
    return 1 if any("error" in facts[p] for p in parts) else 0


if __name__ == "__main__":
    sys.exit(main())
