"""The job of ``bench/bench_sharded.py``: a (2, 2) mesh of gloo CPU ranks, FSDP2 inside each
replica group, plain HSDP against ``ShardedStep`` in one process group.

    torchrun --nproc-per-node 4 bench/sharded_job/job.py --factors 1,1.5 \
        --order hsdp,step0,hsdp --specs '["rebalance"]' --steps 40 --out runs.jsonl

Every variant builds the same MLP from the same seed and trains ``--steps`` steps of M
micro-batches of B samples per rank (each rank its own samples, as in any FSDP job):

* ``hsdp``: plain HSDP, ``fully_shard`` over the 2-D mesh (FSDP's own all-reduce across the
  groups), each loss / M, the first M - 1 micro-batches without the all-reduce across groups
  (``set_requires_all_reduce(False)``): gradients accumulate sharded, reduce-scattered within
  the group per micro-batch and all-reduced across groups once per step, the collectives
  ``ShardedStep`` makes, so the two differ in the rule alone;
* ``stepK``: ``fully_shard`` over the shard dimension and ``ShardedStep(model, optimizer,
  spec K of --specs, mesh=mesh, micro_batches=M)``, each rank computing its group's share
  (``wants``), or, dealt on demand, what its group asks for from its stream (``Stream``);
* ``probe``: ``hsdp`` watched by ``StragglerProbe`` at its defaults (``watch(model)``, and
  ``probe.step`` around each step): the probe's overhead;
* ``drill-group<g>``, ``drill-rank<r>``, ``drill-none``: ``probe`` with group g's ranks, or
  rank r alone, sleeping ``DRILL`` times longer than the law (the others at X = 1): the
  reports' named ranks.

**The law** (group n, its j-th micro-batch): both ranks of the group sleep
``d B X_n (1 + e_{n,j})`` before its forward, X = ``--factors`` (one group 1.5x slower: a
slower node), e the DDP benches' noise (``bench_loop``'s scenario (c),
``dropcompute-noise:scale=1``, one draw per micro-batch) from one stream per group seeded by
``(seed, n)``: both ranks draw alike, as a group is as slow as its slowest rank, and a group
dealt more micro-batches meets the next draws of the same stream.

Rank 0 appends one JSON line per variant: the wall seconds of each step (its own clock,
which every rank meets at the step's collectives), the samples the step applied (HSDP:
R S M B; ``ShardedStep``: S B times the groups' counted micro-batches), the shares dealt,
and, for ``stepK``, the largest difference between its full parameters and a single-process
reference that applies each record's weights to the recorded micro-batches (SGD).
"""

from __future__ import annotations

import argparse
import json
import time
from contextlib import nullcontext

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from tailtrain import ShardedStep, StragglerProbe
from tailtrain.delays import parse_delay

GROUPS, SHARDS = 2, 2
M, B = 10, 8  #: micro-batches per rank and step (sync), samples per micro-batch
DIM, HIDDEN, CLASSES, LR = 64, 256, 10, 0.05
NOISE = "dropcompute-noise:scale=1"
DRILL = 1.5  #: a drill's slow rank or group: its sleeps this many times longer
X = torch.randn(8192, DIM, generator=torch.Generator().manual_seed(0))
Y = torch.randint(0, CLASSES, (8192,), generator=torch.Generator().manual_seed(1))
STRIDE = GROUPS * M  #: the most micro-batches one rank computes in a step (all R M dealt to it)


def make_model() -> nn.Module:
    torch.manual_seed(3)
    return nn.Sequential(
        nn.Linear(DIM, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, HIDDEN), nn.ReLU(),
        nn.Linear(HIDDEN, CLASSES),
    )  # fmt: skip


def batch(step: int, group: int, shard: int, unit: int) -> tuple[torch.Tensor, torch.Tensor]:
    start = (((step * GROUPS + group) * SHARDS + shard) * STRIDE + unit) * B
    idx = torch.arange(start, start + B) % len(X)
    return X[idx], Y[idx]


class Stream:
    """Shard ``shard``'s micro-batches by stream position, the same on every group's rank s
    (``ShardedStep`` dealt on demand takes this, and deals the positions)."""

    def __init__(self, shard: int) -> None:
        self.shard = shard

    def __getitem__(self, position: int) -> tuple[torch.Tensor, torch.Tensor]:
        start = (position * SHARDS + self.shard) * B
        idx = torch.arange(start, start + B) % len(X)
        return X[idx], Y[idx]


def counted(record: dict, group: int, shard: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The micro-batches ``group``'s rank ``shard`` counted in ``record``'s step."""
    if record["dealt"] is not None:  # dealt on demand: its positions of the stream
        return [Stream(shard)[p] for p in record["dealt"][group][: record["completed"][group]]]
    return [batch(record["step"], group, shard, u) for u in range(record["completed"][group])]


class Law:
    """The group's sleeps (module docstring)."""

    def __init__(self, d: float, factor: float, group: int, seed: int, noisy: bool) -> None:
        self.scale = d * B * factor
        rng = np.random.default_rng([seed, group])
        self.noise = parse_delay(NOISE).sample(rng, (1 << 14,)) if noisy else np.zeros(1 << 14)
        self.position = 0

    def sleep(self) -> None:
        if self.scale > 0:
            time.sleep(self.scale * (1.0 + self.noise[self.position % len(self.noise)]))
        self.position += 1


def shard(net: nn.Module, mesh) -> nn.Module:
    for layer in net:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    return fully_shard(net, mesh=mesh)


def run_hsdp(mesh, law: Law, steps: int, where: tuple[int, int], probed: bool = False) -> dict:
    """Plain HSDP; ``probed``: watched by ``StragglerProbe`` at its defaults (``watch`` and
    ``probe.step`` per step, no folder), its reports' named ranks returned."""
    net = shard(make_model(), mesh)  # the 2-D mesh: FSDP's HSDP
    opt = torch.optim.SGD(net.parameters(), lr=LR)
    reports: list = []
    probe = StragglerProbe(on_report=reports.append).watch(net) if probed else None
    ends, samples = [], []
    for r in range(steps):
        with probe.step(samples=M * B) if probe is not None else nullcontext():
            opt.zero_grad(set_to_none=True)
            for u in range(M):
                net.set_requires_all_reduce(u == M - 1)
                x, y = batch(r, *where, u)
                law.sleep()
                (F.cross_entropy(net(x), y) / M).backward()
            opt.step()
        ends.append(time.perf_counter())
        samples.append(GROUPS * SHARDS * M * B)
    out: dict = {"ends": ends, "samples": samples}
    if probe is not None:
        probe.close()
        out["named"] = [sorted(report.named()) for report in reports]
        out["groups"] = reports[-1].groups if reports else None
    return out


def run_step(mesh, law: Law, steps: int, where: tuple[int, int], spec: str) -> dict:
    net = shard(make_model(), mesh["shard"])
    opt = torch.optim.SGD(net.parameters(), lr=LR)
    step = ShardedStep(net, opt, spec, mesh=mesh, micro_batches=M)
    ends, samples, shares, records, thresholds = [], [], [], [], []

    def loss_fn(xy):
        law.sleep()
        return F.cross_entropy(net(xy[0]), xy[1])

    stream = Stream(where[1])
    for r in range(steps):
        units = M if step.wants is None else step.wants
        shares.append(None if step.shares is None else [int(s) for s in step.shares])
        if "deal=demand" in spec:
            record = step(stream, loss_fn)
        else:
            record = step([batch(r, *where, u) for u in range(units)], loss_fn)
        ends.append(time.perf_counter())
        samples.append(SHARDS * B * int(sum(record.completed)))
        records.append(record.as_dict())
        thresholds.append(record.threshold)
    step.close()
    full = {n: p.full_tensor().detach() for n, p in net.named_parameters()}
    out = {"ends": ends, "samples": samples, "shares": shares, "spec": spec}
    out["completed"] = [r["completed"] for r in records]
    out["thresholds"] = thresholds
    if dist.get_rank() == 0:
        out["max_abs_diff"], out["bitwise"] = agreement(full, records)
    return out


def agreement(full: dict[str, torch.Tensor], records: list[dict]) -> tuple[float, bool]:
    """The largest |difference| between the run's parameters and the reference, and whether
    they are equal to the bit. The reference is SGD on sum_g w_g G_g / D in the arithmetic the
    run does, in float32: per unit u of group g, FSDP's average of its ranks' gradients
    ((g_0 + g_1) / 2: gloo sums two in either order alike), summed over the counted units in
    order (FSDP accumulates), times 1 / C_g, times w_g = C_g / M, summed over the groups, over
    D = R (``rebalance``'s fixed total, N). The parameters' shards and the full tensors step
    element by element alike."""
    torch.set_num_threads(1)  # the ranks' own kernels: one thread each
    net = make_model()
    opt = torch.optim.SGD(net.parameters(), lr=LR)

    def grads(x: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
        net.zero_grad()
        F.cross_entropy(net(x), y).backward()
        return [p.grad.detach().clone() for p in net.parameters()]

    for record in records:
        if record["empty"]:
            continue
        divisor = float(len(record["completed"]))
        summed: list[torch.Tensor] | None = None
        for g in record["ranks"]:
            done = record["completed"][g]
            weight = done / record["micro_batches"]
            assert abs(weight / divisor - record["weights"][g]) < 1e-12  # the rule's w_g / D
            per_shard = [counted(record, g, s) for s in range(SHARDS)]
            acc: list[torch.Tensor] | None = None
            for units in zip(*per_shard, strict=True):
                parts = [grads(*xy) for xy in units]
                mean = [(a + b) / SHARDS for a, b in zip(*parts, strict=True)]
                acc = mean if acc is None else [t + m for t, m in zip(acc, mean, strict=True)]
            assert acc is not None
            scale = 1.0 / max(done, 1)
            part = [torch.mul(t if scale == 1.0 else t * scale, weight) for t in acc]
            summed = part if summed is None else [a + b for a, b in zip(summed, part, strict=True)]
        assert summed is not None
        for p, t in zip(net.parameters(), summed, strict=True):
            p.grad = t / divisor
        opt.step()
    diffs = [(full[n] - p.detach()).abs().max().item() for n, p in net.named_parameters()]
    same = all(torch.equal(full[n], p.detach()) for n, p in net.named_parameters())
    return max(diffs), same


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--order", required=True, help="variants in order: hsdp,step0,...")
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--factors", default="1,1.5", help="X per group")
    parser.add_argument("--seconds-per-sample", type=float, default=5e-3)
    parser.add_argument("--noise", choices=["on", "off"], default="on")
    parser.add_argument("--specs", default='["rebalance"]', help="JSON: stepK runs spec K")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (GROUPS, SHARDS), mesh_dim_names=("replicate", "shard"))
    where = (mesh.get_local_rank("replicate"), mesh.get_local_rank("shard"))
    for index, variant in enumerate(args.order.split(",")):
        factor = float(args.factors.split(",")[where[0]])
        if variant.startswith("drill-"):  # drill-group<g>, drill-rank<r> or drill-none
            kind = variant.removeprefix("drill-")
            slow = kind == f"group{where[0]}" or kind == f"rank{dist.get_rank()}"
            factor = DRILL if slow else 1.0
        law = Law(args.seconds_per_sample, factor, where[0], args.seed, args.noise == "on")
        dist.barrier()
        began = time.perf_counter()
        if variant in ("hsdp", "probe") or variant.startswith("drill-"):
            out = run_hsdp(mesh, law, args.steps, where, probed=variant != "hsdp")
        else:
            spec = json.loads(args.specs)[int(variant.removeprefix("step"))]
            out = run_step(mesh, law, args.steps, where, spec)
        if dist.get_rank() == 0:
            row = {"index": index, "variant": variant, "began": began, **out}
            with open(args.out, "a") as f:
                f.write(json.dumps(row) + "\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
