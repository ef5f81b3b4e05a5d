"""What the DDP comm hook's round costs a step, against DDP's own allreduce, at P gloo ranks.

Every run is P forked gloo ranks (one torch thread each) of one loop: a 64-64-10 MLP, M
micro-batches of 8 samples a step, each sleeping ``--compute`` ms before its forward (the
same on every rank, so no rank straggles and no rule cuts anything: what is left is the
round's own cost), ``--steps`` steps; rank 0's median seconds per step after the first 10.
Rows, in the same run, their order rotated repeat by repeat:

* ``ddp``: DDP's own gradient accumulation (``no_sync`` for the first M - 1 micro-batches,
  its built-in allreduce in the last backward), and ``ddp-again``, the same: the A/A control;
* ``hook``: ``StragglerHookState("sync")`` with ``weighted_allreduce_hook`` as ``advise
  --for ddp`` prints it: the agreement's rows ride in the first bucket's allreduce, then the
  closing gather (``integrate.ddp``);
* ``hook-gathered``: the same with the agreement gathered before the buckets, the protocol
  of a half-precision model (``integrate.average.ROW_DTYPES`` emptied in the ranks): one
  small collective more a step.

The figures are each row's median over repeats of its runs' median step, and, per repeat,
the ratios hook / ddp, hook-gathered / ddp, hook / hook-gathered and ddp-again / ddp (the
noise floor), with their medians. No goal: the JSON says what a round costs on this machine.

    python bench/bench_hook_round.py --json                       # P = 2, 4, 6; 3 repeats
    python bench/bench_hook_round.py --ranks 6 --repeats 5 --json
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import platform
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROWS = ("ddp", "hook", "hook-gathered", "ddp-again")
#: steps left out of each run's median: the first buckets' rebuild, the caches
WARMUP = 10


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def rank_main(rank: int, procs: int, port: int, row: str, args: Any, out: str) -> None:
    """One rank of one run: the loop of ``row``; rank 0 writes its seconds per step."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", f"tcp://127.0.0.1:{port}", rank=rank, world_size=procs,
        timeout=datetime.timedelta(seconds=120),
    )  # fmt: skip
    from tailtrain.integrate import StragglerHookState, average, weighted_allreduce_hook

    if row == "hook-gathered":  # the half-precision protocol, on float32
        average.ROW_DTYPES = ()
    torch.manual_seed(0)
    ddp = DistributedDataParallel(nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10)))
    state = None
    if row.startswith("hook"):
        state = StragglerHookState("sync")
        ddp.register_comm_hook(state, weighted_allreduce_hook)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01)
    generator = torch.Generator().manual_seed(rank)
    batches = [(torch.randn(8, 64, generator=generator), torch.randint(0, 10, (8,)))] * args.m
    seconds = []
    for _ in range(args.steps):
        began = time.perf_counter()
        if state is None:
            for u, (x, y) in enumerate(batches):
                time.sleep(args.compute / 1e3)
                if u + 1 < len(batches):
                    with ddp.no_sync():
                        F.cross_entropy(ddp(x), y).backward()
                else:
                    F.cross_entropy(ddp(x), y).backward()
            optimizer.step()
        else:
            for x, y in state.micro_batches(ddp, batches):
                time.sleep(args.compute / 1e3)
                F.cross_entropy(ddp(x), y).backward()
            if not state.last.empty:
                optimizer.step()
        optimizer.zero_grad()
        seconds.append(time.perf_counter() - began)
    if rank == 0:
        Path(out).write_text(json.dumps(seconds))
    del ddp, state, optimizer  # DDP's reducer holds the group: freed first, while it is live
    dist.destroy_process_group()


def run(row: str, procs: int, args: argparse.Namespace) -> float:
    """One run of ``row`` on ``procs`` ranks: rank 0's median seconds per step."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as folder:
        out = os.path.join(folder, "seconds.json")
        gc.collect()  # a fork inherits no garbage for its collector to free (tests/integrate)
        gc.freeze()
        try:
            mp.start_processes(
                rank_main, (procs, free_port(), row, args, out), nprocs=procs, start_method="fork"
            )
        finally:
            gc.unfreeze()
        seconds = json.loads(Path(out).read_text())
    return float(np.median(seconds[WARMUP:]))


def measure(procs: int, args: argparse.Namespace) -> dict[str, Any]:
    """Every row ``--repeats`` times on ``procs`` ranks, the order rotated each repeat."""
    runs: dict[str, list[float]] = {row: [] for row in ROWS}
    for r in range(args.repeats):
        order = ROWS[r % len(ROWS) :] + ROWS[: r % len(ROWS)]
        for row in order:
            runs[row].append(run(row, procs, args))
            ms = 1e3 * runs[row][-1]
            print(f"  P={procs} repeat {r} {row}: {ms:.2f} ms/step", file=sys.stderr)
    each = {k: np.array(v) for k, v in runs.items()}
    ratios = {
        "hook_over_ddp": each["hook"] / each["ddp"],
        "gathered_over_ddp": each["hook-gathered"] / each["ddp"],
        "hook_over_gathered": each["hook"] / each["hook-gathered"],
        "a_a_ddp_again_over_ddp": each["ddp-again"] / each["ddp"],
    }
    return {
        "ms_per_step": {k: 1e3 * float(np.median(v)) for k, v in each.items()},
        "runs_ms": {k: (1e3 * v).round(3).tolist() for k, v in each.items()},
        "ratios": {k: float(np.median(v)) for k, v in ratios.items()},
        "ratios_by_repeat": {k: v.round(4).tolist() for k, v in ratios.items()},
        "hook_saving_ms": 1e3 * float(np.median(each["hook-gathered"] - each["hook"])),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4, 6], choices=range(2, 9))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--m", type=int, default=2, help="micro-batches a step")
    parser.add_argument("--compute", type=float, default=5.0, help="ms slept per micro-batch")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.steps <= WARMUP + 1 or args.m < 1 or not args.compute >= 0:
        parser.error(f"--repeats >= 1, --steps > {WARMUP + 1}, --m >= 1, --compute >= 0")
    os.environ["OMP_NUM_THREADS"] = "1"
    began, load = time.time(), os.getloadavg()
    cases = {str(p): measure(p, args) for p in args.ranks}
    report = {
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
        "settings": {k: v for k, v in vars(args).items() if k != "json"},
        "load": {"before": load, "after": os.getloadavg()},
        "seconds": time.time() - began,
        "cases": cases,
    }
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        for p, case in cases.items():
            ms = ", ".join(f"{k} {v:.2f}" for k, v in case["ms_per_step"].items())
            print(f"P={p}: ms/step {ms}; hook/gathered {case['ratios']['hook_over_gathered']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
