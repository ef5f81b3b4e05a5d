"""The real nvidia-resiliency-ext straggler Detector beside the probe, on a CUDA machine.

    python bench/gpu_detect.py            # prints one JSON object; exits 0 without CUDA

``bench/bench_detect.py`` scores NVIDIA's *documented rule* on CPU, because the package's
``Detector.initialize`` needs CUPTI (``libcupti.so.12``). Here the package itself runs: four
gloo ranks share the one GPU (NCCL refuses two ranks on one device), each a DDP loop on a CUDA
model; the forward is a ``Detector.detection_section("fwd", profile_cuda=True)`` as its usage
guide shows, and the probe watches the same loop with CUDA events. Drills: healthy, one rank
with a 2x forward (extra matrix products on the GPU), one rank slow in backward only (extra
work in a backward hook; the four ranks share one GPU, whose time-slicing spreads one rank's
extra kernels over all four, so each drill also holds the slow rank's host thread for
``HOST_MS`` in that section, as a slow host, a throttled clock or a CPU-bound step would). Per
drill, rank 0 prints what ``Report.identify_stragglers()`` (the
default thresholds, 0.75) names and what the probe names.

Needs ``nvidia-resiliency-ext`` (``pip install nvidia-resiliency-ext``; without it the JSON
says why and the probe's rows still run). Its 0.4.1 wheel's CUPTI module links
``libcupti.so.12``: with a CUDA 13 build of torch, also ``pip install nvidia-cuda-cupti-cu12``
and put its ``nvidia/cuda_cupti/lib`` on ``LD_LIBRARY_PATH`` (so it ran on an H200 with torch
2.11.0+cu130).
"""

from __future__ import annotations

import datetime
import json
import os
import socket
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from tailtrain import StragglerProbe

RANKS, STEPS, WIDTH, SLOW_RANK = 4, 60, 2048, 1
HOST_MS = 20.0  # the slow rank's extra host time per section: several times the GPU kernels
DRILLS = ("healthy", "forward-2x", "backward-2x")
MISSING = ["nvidia-resiliency-ext is not installed"]


class Net(nn.Module):
    def __init__(self, extra_fwd: int, extra_bwd: int) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layers = nn.Sequential(*[nn.Linear(WIDTH, WIDTH) for _ in range(4)])
        self.extra_fwd, self.extra_bwd = extra_fwd, extra_bwd

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        waste = x
        for _ in range(self.extra_fwd):  # a slow GPU: more work in the same forward
            waste = torch.tanh(waste @ self.layers[0].weight.detach())
        if self.extra_fwd:
            time.sleep(HOST_MS / 1e3)
        out = self.layers(x) + 0 * waste.sum()
        if self.extra_bwd and out.requires_grad:
            out.register_hook(lambda g: g + 0 * self._burn(g))
        return out

    def _burn(self, g: torch.Tensor) -> torch.Tensor:
        time.sleep(HOST_MS / 1e3)
        w = self.layers[0].weight.detach()
        for _ in range(self.extra_bwd):
            g = torch.tanh(g @ w)
        return g.sum()


def drill(rank: int, kind: str, straggler) -> dict:
    slow = rank == SLOW_RANK
    net = Net(4 if slow and kind == "forward-2x" else 0, 8 if slow and kind == "backward-2x" else 0)
    ddp = DistributedDataParallel(net.cuda())
    optimizer = torch.optim.SGD(ddp.parameters(), lr=1e-4)
    reports = []
    probe = StragglerProbe(None, every=10, horizon=STEPS, on_report=reports.append).watch(ddp)
    x = torch.randn(256, WIDTH, device="cuda")
    nvidia = {"error": MISSING[0]}
    if straggler is not None:
        straggler.Detector.initialize(scores_to_compute="all", gather_on_rank0=True)
    for _ in probe.batches(range(STEPS)):
        optimizer.zero_grad()
        if straggler is not None:
            with straggler.Detector.detection_section("fwd", profile_cuda=True):
                out = ddp(x)
        else:
            out = ddp(x)
        F.mse_loss(out, torch.zeros_like(out)).backward()
        optimizer.step()
    if straggler is not None:
        report = straggler.Detector.generate_report()
        if rank == 0:
            found = report.identify_stragglers()
            nvidia = {
                key: sorted({s.rank for s in found[key]})
                if isinstance(found[key], set)
                else {sec: sorted({s.rank for s in ids}) for sec, ids in found[key].items()}
                for key in found
            }
            nvidia["gpu_relative_perf_scores"] = report.gpu_relative_perf_scores
        straggler.Detector.shutdown()
    torch.cuda.synchronize()
    last = reports[-1] if reports else None
    return {
        "kind": kind,
        "truth": [] if kind == "healthy" else [SLOW_RANK],
        "probe_named": last.named() if last else {},
        "probe_scores": [round(v.score, 3) for v in last.verdicts] if last else [],
        "nvidia": nvidia,
    }


def rank_main(rank: int, port: int, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=RANKS,
        timeout=datetime.timedelta(seconds=120),
    )
    try:
        import nvidia_resiliency_ext.straggler as straggler
    except ImportError as exc:  # say why: "not installed" hid a missing library once
        MISSING[0] = f"nvidia-resiliency-ext did not import: {exc}"
        straggler = None
    rows = [drill(rank, kind, straggler) for kind in DRILLS]
    if rank == 0:
        with open(out, "w") as fh:
            json.dump(rows, fh, default=str)
    dist.barrier()
    dist.destroy_process_group()


def main() -> int:
    if not torch.cuda.is_available():
        json.dump({"skipped": "no CUDA device: nothing to run"}, sys.stdout)
        sys.stdout.write("\n")
        return 0
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with tempfile.TemporaryDirectory() as folder:
        out = f"{folder}/rows.json"
        mp.start_processes(rank_main, (port, out), nprocs=RANKS, start_method="spawn")
        with open(out) as fh:
            rows = json.load(fh)
    device = torch.cuda.get_device_name()
    json.dump({"device": device, "ranks": RANKS, "steps": STEPS, "drills": rows}, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
