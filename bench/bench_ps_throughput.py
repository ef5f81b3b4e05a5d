"""Gradient pushes per second a parameter server absorbs: `train`'s server vs a bare loop.

Eight workers and one server, gloo on this machine, digits-cnn's tensors (18,480 floats and
the protocol's 8-value header). Two runs of the same number of pushes:

* ``bare``: the least a parameter server can do. Each worker receives a model, computes a
  gradient, sends it; the server's main thread receives from any worker and sends it a model
  back. No rule, no update, no bookkeeping.
* ``ps``: `tailtrain train`'s server (``runtime.ps``) under ``async`` (every push is an update
  and its worker gets the new model at once): receiving thread, arrival columns, the rule,
  the update path, the record.

``--compute real`` (default) computes digits-cnn's gradient of the job's mini-batch in both;
``--compute none`` replaces it by a stored gradient, so the figures are the server's and the
wire's alone. The ratio ps / bare is the goal (>= 0.8).

    python bench/bench_ps_throughput.py [--pushes 2000] [--compute real|none] [--json]
"""

from __future__ import annotations

import argparse
import functools
import json
import platform
import subprocess
import sys
import time

import numpy as np
import torch
import torch.distributed as dist

from tailtrain.core.records import RunRecord
from tailtrain.core.scenario import Scenario, World
from tailtrain.runtime.config import RankResult, TrainConfig
from tailtrain.runtime.launching.endpoint import Endpoint, reserve
from tailtrain.runtime.launching.launch import launch
from tailtrain.runtime.ps.server import train_parameter_server
from tailtrain.runtime.ps.wire import DOWN, HEADER, UP
from tailtrain.runtime.reduce import Collectives
from tailtrain.tasks import parse_task
from tailtrain.tasks.stream import job_batches

WORKERS = 8


class StoredGradient:
    """digits-cnn with its gradient computed once and returned at no cost."""

    def __init__(self, task) -> None:
        self.task = task
        theta = task.init_params(0)
        self._loss, self._grad = task.grads(theta, np.arange(task.batch_size)[None])

    def __getattr__(self, name: str):
        return getattr(self.task, name)

    def grads(self, theta: torch.Tensor, indices: np.ndarray):
        return self._loss, self._grad


def make_task(compute: str, seed: int):
    task = parse_task("digits-cnn", seed=seed)
    return task if compute == "real" else StoredGradient(task)


def bare(config: TrainConfig, comm: Collectives, compute: str) -> RankResult:
    """The bare loop of the module docstring; rank 0 returns pushes/s in its summary."""
    task = make_task(compute, config.seed)
    world = World.build(config.scenario, config.seed, task=task)
    theta = task.init_params(config.seed)
    size, n, pushes = HEADER + task.dim, config.scenario.workers, config.scenario.iterations
    buffer = torch.zeros(size)
    comm.barrier()
    if comm.rank == 0:
        started = time.perf_counter()
        for w in range(1, n + 1):
            dist.send(torch.cat([torch.zeros(HEADER), theta]), dst=w, tag=DOWN)
        for _ in range(pushes):
            dist.recv(buffer, src=None, tag=UP)
            w = int(buffer[1])
            dist.send(torch.cat([torch.zeros(HEADER), theta]), dst=w + 1, tag=DOWN)
        seconds = time.perf_counter() - started
        for _ in range(n):  # each worker has one push in flight, then stops
            dist.recv(buffer, src=None, tag=UP)
        stop = torch.full((size,), -1.0)
        for w in range(1, n + 1):
            dist.send(stop, dst=w, tag=DOWN)
        summary = {"pushes": pushes, "seconds": seconds}
        return RankResult(0, RunRecord(summary=summary), np.zeros(0))
    worker, job = comm.rank - 1, 0
    while True:
        dist.recv(buffer, src=0, tag=DOWN)
        if buffer[0] < 0:
            return RankResult(comm.rank, RunRecord(), np.zeros(0))
        indices = job_batches(world.partition, config.seed, task.batch_size, [worker], [job])
        _, grad = task.grads(buffer[HEADER:], indices[0])
        head = torch.zeros(HEADER)
        head[1] = worker
        dist.send(torch.cat([head, grad[0]]), dst=0, tag=UP)
        job += 1


def measure(which: str, pushes: int, compute: str) -> float:
    """Pushes per second of one run (``bare`` or ``ps``), in this process."""
    scenario = Scenario(task="digits-cnn", workers=WORKERS, iterations=pushes, eval_every=pushes)
    config = TrainConfig(scenario=scenario, strategy="async", seed=0, timeout=60)
    endpoint = reserve(Endpoint("127.0.0.1", 0))
    if which == "bare":
        result = launch([config], endpoint, functools.partial(bare, compute=compute))[0][0]
        return result.record.summary["pushes"] / result.record.summary["seconds"]
    own = functools.partial(train_parameter_server, task=make_task(compute, 0))
    result = launch([config], endpoint, own)[0][0]
    return sum(row["arrivals"] for row in result.record.steps) / result.record.summary["wall_time"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pushes", type=int, default=2000)
    parser.add_argument("--compute", choices=("real", "none"), default="real")
    parser.add_argument("--only", choices=("bare", "ps"), help=argparse.SUPPRESS)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.only:
        print(measure(args.only, args.pushes, args.compute))
        return
    rates = {}
    for which in ("bare", "ps"):  # one process each: a forked rank inherits a launcher's state
        command = [sys.executable, __file__, "--only", which, "--pushes", str(args.pushes)]
        command += ["--compute", args.compute]
        done = subprocess.run(command, capture_output=True, text=True, check=True, timeout=600)
        rates[which] = float(done.stdout.strip().splitlines()[-1])
    report = {
        "machine": platform.processor() or platform.machine(),
        "workers": WORKERS,
        "pushes": args.pushes,
        "compute": args.compute,
        "pushes_per_second": rates,
        "ratio": rates["ps"] / rates["bare"],
    }
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(
        f"{WORKERS} workers, digits-cnn, compute={args.compute}: bare loop "
        f"{rates['bare']:.0f} pushes/s, train's server {rates['ps']:.0f} pushes/s "
        f"(ratio {report['ratio']:.2f}, goal >= 0.8)"
    )


if __name__ == "__main__":
    main()
