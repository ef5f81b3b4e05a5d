"""Benchmark (c): batched per-worker gradients vs a per-worker autograd loop.

All compute the same thing: for each of W simulated workers, the mean loss gradient over
its own mini-batch at one shared model version θ. The batched path is ``Task.grads`` (one
forward/backward pass over all W·B samples, :mod:`tailtrain.tasks.shared_grads`); ``vmap``
is the previous batched path, ``vmap(grad_and_value(loss))``, kept for reference; the loop
runs an ordinary ``nn.Module`` forward and ``backward`` once per worker, as a plain
simulator would. Timings are interleaved (batched, vmap, loop, floor, batched, …) after
warm-up so background load hits all alike; we report the best and the median of the repeats.

    python bench/bench_batched_grads.py [--workers 16] [--batch 32] [--threads 1,2] [--json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F

from tailtrain.tasks import Task, parse_partition, parse_task


def make_loop(task: Task, theta: torch.Tensor, idx: np.ndarray) -> Callable[[], torch.Tensor]:
    """Per-worker autograd loop on one real module (built once, as a runtime would)."""
    module = task.module_at(theta)
    params = list(module.parameters())
    rows = torch.from_numpy(idx)
    x_all, y_all = task.data.x_train, task.data.y_train
    mse = task.metric_name == "mse"

    def loop() -> torch.Tensor:
        out = torch.empty(len(rows), task.dim)
        for w, row in enumerate(rows):
            for p in params:
                p.grad = None
            pred = module(x_all[row])
            y = y_all[row]
            loss = F.mse_loss(pred.squeeze(-1), y) if mse else F.cross_entropy(pred, y)
            loss.backward()
            torch.cat([p.grad.reshape(-1) for p in params], out=out[w])
        return out

    return loop


def make_floor(task: Task, theta: torch.Tensor, idx: np.ndarray) -> Callable[[], None]:
    """One autograd pass over all W·B samples: only their summed gradient, so a lower bound
    for any per-worker method built on the same kernels (it shows the cost of vmap)."""
    module = task.module_at(theta)
    flat = torch.from_numpy(idx.reshape(-1))
    x, y = task.data.x_train[flat], task.data.y_train[flat]
    mse = task.metric_name == "mse"

    def floor() -> None:
        module.zero_grad(set_to_none=True)
        pred = module(x)
        (F.mse_loss(pred.squeeze(-1), y) if mse else F.cross_entropy(pred, y)).backward()

    return floor


def interleaved(fns: dict[str, Callable[[], object]], warmup: int, repeats: int) -> dict:
    """Seconds per call of each function, alternating between them on every repeat."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {n: {"best_s": min(t), "median_s": statistics.median(t)} for n, t in times.items()}


def measure(task: Task, workers: int, batch: int, warmup: int, repeats: int) -> dict:
    theta = task.init_params(0)
    state = parse_partition("shared").assign(task, workers, np.random.default_rng(0))
    task = dataclasses.replace(task, batch_size=batch)
    idx = task.sample_indices(np.random.default_rng(1), np.arange(workers), state)
    loop = make_loop(task, theta, idx)
    batched = lambda: task.grads(theta, idx)[1]  # noqa: E731
    vmapped = lambda: task._batched(task._vmap_shared_fn, theta, idx)[1]  # noqa: E731
    err = float((batched() - loop()).abs().max())
    fns = {"batched": batched, "vmap": vmapped, "loop": loop, "floor": make_floor(task, theta, idx)}
    t = interleaved(fns, warmup, repeats)
    return {
        "threads": torch.get_num_threads(),
        "workers": workers,
        "batch": batch,
        "max_abs_diff": err,
        "batched": t["batched"],
        "vmap": t["vmap"],
        "loop": t["loop"],
        "one_batch_floor": t["floor"],
        "speedup_best": t["loop"]["best_s"] / t["batched"]["best_s"],
        "speedup_median": t["loop"]["median_s"] / t["batched"]["median_s"],
        "vmap_speedup_best": t["loop"]["best_s"] / t["vmap"]["best_s"],
        "vmap_speedup_median": t["loop"]["median_s"] / t["vmap"]["median_s"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="digits-cnn")
    parser.add_argument("--workers", default="16", help="simulated workers; a comma list sweeps")
    parser.add_argument("--batch", default="32", help="per-worker batch; a comma list sweeps")
    parser.add_argument("--threads", default="1,2", help="torch threads; a comma list sweeps")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    args = parser.parse_args()
    task = parse_task(args.task)
    rows = []
    for threads in args.threads.split(","):
        torch.set_num_threads(int(threads))
        rows += [measure(task, int(w), int(b), args.warmup, args.repeats)
                 for w in args.workers.split(",") for b in args.batch.split(",")]  # fmt: skip
    meta = {"task": args.task, "dim": task.dim, "torch": torch.__version__,
            "repeats": args.repeats, "rows": rows}  # fmt: skip
    if args.json:
        print(json.dumps(meta, indent=2))
        return
    print(f"{args.task} (D={task.dim}), torch {torch.__version__}, "
          f"best/median of {args.repeats} interleaved repeats, in ms; "
          "speed-ups over the loop")  # fmt: skip
    for r in rows:
        b, v, lp, fl = r["batched"], r["vmap"], r["loop"], r["one_batch_floor"]
        print(f"threads={r['threads']} W={r['workers']:5d} B={r['batch']:4d}  "
              f"batched {b['best_s'] * 1e3:7.2f}/{b['median_s'] * 1e3:7.2f}  "
              f"vmap {v['best_s'] * 1e3:7.2f}/{v['median_s'] * 1e3:7.2f}  "
              f"loop {lp['best_s'] * 1e3:7.2f}/{lp['median_s'] * 1e3:7.2f}  "
              f"floor {fl['best_s'] * 1e3:7.2f}  "
              f"batched {r['speedup_best']:5.2f}x/{r['speedup_median']:5.2f}x  "
              f"vmap {r['vmap_speedup_best']:5.2f}x/{r['vmap_speedup_median']:5.2f}x  "
              f"max|diff| {r['max_abs_diff']:.1e}")  # fmt: skip


if __name__ == "__main__":
    main()
