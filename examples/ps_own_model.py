"""DBW on your own model, on real processes: a parameter server and 4 workers on this machine.

    python examples/ps_own_model.py                      # 60 updates, about 10 s
    python examples/ps_own_model.py --iterations 5       # a smoke test
    torchrun --nproc-per-node 5 examples/ps_own_model.py # the same under torchrun (1 server)

The model, the loss and the data are plain callables; tailtrain runs the server, the workers,
the rule (here DBW, which picks how many gradients to wait for at every step) and the
protocol. Each job of each worker is delayed by a shifted exponential, so some workers
straggle and DBW leaves them behind.
"""

from __future__ import annotations

import argparse
import os

import torch
from torch import nn

from tailtrain import train_own_model


def model() -> nn.Module:
    return nn.Sequential(nn.Linear(10, 32), nn.Tanh(), nn.Linear(32, 3))


def data() -> tuple[torch.Tensor, ...]:
    """Three Gaussian blobs in 10 dimensions: 1200 training and 300 test points."""
    g = torch.Generator().manual_seed(0)
    centres = 2.0 * torch.randn(3, 10, generator=g)
    labels = torch.randint(0, 3, (1500,), generator=g)
    points = centres[labels] + torch.randn(1500, 10, generator=g)
    return points[:1200], labels[:1200], points[1200:], labels[1200:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=60)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--strategy", default="dbw")
    args = parser.parse_args()
    record = train_own_model(
        model,
        nn.functional.cross_entropy,
        data,
        strategy=args.strategy,
        workers=args.workers,
        iterations=args.iterations,
        delay="shifted-exp:shift=0.02,scale=0.03",
        lr=0.2,
        timeout=60,
    )
    if os.environ.get("RANK", "0") != "0":  # every rank holds the same record: rank 0 prints
        return
    summary = record.summary
    ks = [row["k"] for row in record.steps]
    print(
        f"{summary['strategy']}: {summary['iterations']} updates in {summary['wall_time']:.2f} s, "
        f"mean k {summary['mean_k']:.2f} (last {ks[-5:]}), "
        f"train loss {record.evals[0]['train_loss']:.3f} -> {summary['final_loss']:.3f}, "
        f"test loss {summary['final_eval']:.3f}"
    )


if __name__ == "__main__":
    main()
