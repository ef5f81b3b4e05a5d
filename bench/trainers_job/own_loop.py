"""The own-loop jobs of ``bench/bench_trainers.py``: the Lightning job's model, data, micro-batches
and injected law (``common``) in a loop of one's own, gloo, CPU.

    torchrun --nproc-per-node 2 bench/trainers_job/own_loop.py --mode ddp --steps 100

``--mode ddp``: plain ``DistributedDataParallel``, M micro-batches per step, the first M - 1
under ``no_sync``, each loss divided by M (what Lightning's ``accumulate_grad_batches`` does);
``step``: ``StragglerStep(model, optimizer, --spec)`` on the same M micro-batches, its
weighted update the step's end.
"""

from __future__ import annotations

import argparse
from contextlib import nullcontext

import torch
import torch.distributed as dist
import torch.nn.functional as F
from bench.trainers_job.common import LR, M, Work, model, own_loader, steps_of
from torch.nn.parallel import DistributedDataParallel

from tailtrain import StragglerStep


def ddp_loop(steps: int, work: Work) -> None:
    net = DistributedDataParallel(model())
    optimizer = torch.optim.SGD(net.parameters(), lr=LR)
    loader, sampler = own_loader(dist.get_world_size(), dist.get_rank())
    for group in steps_of(loader, sampler, steps):
        optimizer.zero_grad(set_to_none=True)
        for j, (x, y) in enumerate(group):
            with net.no_sync() if j < M - 1 else nullcontext():
                (F.cross_entropy(work(net, x), y) / M).backward()
        optimizer.step()
        work.step_end()


def step_loop(steps: int, work: Work, spec: str) -> None:
    net = model()
    optimizer = torch.optim.SGD(net.parameters(), lr=LR)
    step = StragglerStep(net, optimizer, spec)
    loader, sampler = own_loader(dist.get_world_size(), dist.get_rank())
    for group in steps_of(loader, sampler, steps):
        record = step(group, lambda b: F.cross_entropy(work(net, b[0]), b[1]))
        work.step_end(record)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=["ddp", "step"], required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--spec", default="dropcompute:drop-rate=0.25,calibrate=10")
    parser.add_argument("--step-log", default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    work = Work.from_env()
    if args.mode == "ddp":
        ddp_loop(args.steps, work)
    else:
        step_loop(args.steps, work, args.spec)
    work.write(args.step_log)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
