"""The bench's slow hardware and its stopwatch, installed into a user's script unmodified.

``python -m torch.distributed.run ... bench/loop_job/inject.py SCRIPT ARGS...`` runs SCRIPT as
``__main__`` (``runpy``) after installing, in this process only:

* **the injected law** (env ``BENCH_LOOP_LAW``, JSON ``{"d": s, "factors": [X_0, ...],
  "chunk": C, "noise": spec or null, "seed": k}``): every forward of a
  ``DistributedDataParallel`` module sleeps ``d * X_rank * (1 + e_{k // C})`` for each sample
  k of this rank's stream of samples it computes, ``e_j`` the j-th draw of this rank's noise
  (``noise``, a ``tailtrain`` delay spec; 0 without noise): one draw per chunk of C
  consecutive samples. The delay is proportional to the work, as on a slower GPU, and the law
  does not depend on how the stream is cut: a batch dealt in other shares or split in
  micro-batches pays the same per sample and meets the same draws, which come from one
  stream seeded by ``(seed, rank)``: a run before and after a change sees the same noise.
* **the stopwatch** (env ``BENCH_LOOP_LOG``, a path; the rank is appended): per optimizer step,
  the wall clock at its end, the samples this rank forwarded since the last step (under
  DropCompute the cut micro-batches are never forwarded, so these are the samples that
  entered the update) and the mean loss of the backward calls since then (weighted by their
  samples), written as JSON lines when the script ends.

The hooks are global (``register_module_forward_pre_hook``, the optimizer's global step
post-hook, a wrapper of ``Tensor.backward``): the script is not edited for them.
"""

from __future__ import annotations

import atexit
import json
import os
import runpy
import sys
import time

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel
from torch.optim.optimizer import register_optimizer_step_post_hook

DRAWS = 1 << 16  #: noise draws made up front (a run uses far fewer)


class Injector:
    """The law's sleeps and the per-step log of one rank (see the module docstring)."""

    def __init__(self, law: dict, rank: int) -> None:
        factors = law.get("factors") or []
        factor = float(factors[rank]) if rank < len(factors) else 1.0
        self.scale = float(law.get("d", 0.0)) * factor
        self.chunk = int(law.get("chunk", 8))
        self.noise = np.zeros(DRAWS)
        if law.get("noise"):
            from tailtrain.delays import parse_delay

            rng = np.random.default_rng([int(law.get("seed", 0)), rank])
            self.noise = parse_delay(law["noise"]).sample(rng, (DRAWS,))
        self.position = 0  # samples of this rank's stream forwarded so far
        self.samples = 0  # forwarded since the last optimizer step
        self.losses: list[tuple[float, int]] = []  # (loss, samples) of each backward
        self.forwarded_at_backward = 0
        self.rows: list[dict] = []

    def delay(self, samples: int) -> float:
        """Seconds for the next ``samples`` of this rank's stream: sample k of the stream
        pays ``d X (1 + e_{k // C})``, so a chunk of C samples carries one draw however the
        batches cut it (whole, in shares, in micro-batches)."""
        k = self.position + np.arange(samples)
        self.position += samples
        return self.scale * float(samples + self.noise[(k // self.chunk) % DRAWS].sum())

    def forward_pre_hook(self, module, args) -> None:
        if not isinstance(module, DistributedDataParallel) or not args:
            return
        first = args[0]
        samples = int(first.shape[0]) if hasattr(first, "shape") and first.dim() else 1
        self.samples += samples
        if self.scale > 0:
            time.sleep(self.delay(samples))

    def backward(self, tensor: torch.Tensor) -> None:
        if tensor.numel() == 1:
            self.losses.append((float(tensor.detach()), self.samples - self.forwarded_at_backward))
            self.forwarded_at_backward = self.samples

    def step_post_hook(self, optimizer, args, kwargs) -> None:
        weight = sum(s for _, s in self.losses)
        loss = sum(v * s for v, s in self.losses) / weight if weight else None
        self.rows.append({"t": time.perf_counter(), "samples": self.samples, "loss": loss})
        self.samples = self.forwarded_at_backward = 0
        self.losses = []


def install(law: dict, rank: int, log: str | None) -> Injector:
    injector = Injector(law, rank)
    torch.nn.modules.module.register_module_forward_pre_hook(injector.forward_pre_hook)
    register_optimizer_step_post_hook(injector.step_post_hook)
    original = torch.Tensor.backward

    def backward(self, *args, **kwargs):
        injector.backward(self)
        return original(self, *args, **kwargs)

    torch.Tensor.backward = backward
    if log:
        started = time.perf_counter()

        def write() -> None:
            with open(f"{log}.{rank}.jsonl", "w") as f:
                f.write(json.dumps({"started": started, "rank": rank}) + "\n")
                f.writelines(json.dumps(row) + "\n" for row in injector.rows)

        atexit.register(write)
    return injector


def main() -> None:
    if len(sys.argv) < 2:
        raise SystemExit("usage: inject.py SCRIPT [ARGS...]")
    law = json.loads(os.environ.get("BENCH_LOOP_LAW", "{}"))
    install(law, int(os.environ.get("RANK", "0")), os.environ.get("BENCH_LOOP_LOG"))
    script = sys.argv[1]
    sys.argv = sys.argv[1:]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
