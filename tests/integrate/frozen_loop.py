"""examples/shrink_loop.py's loop with one rank's training thread frozen inside a step (its
process alive, as ``--inject-fault freeze:`` does in ``train``) until the others went on
without it; run by ``tailtrain launch`` in test_shrink_step.py.

    frozen_loop.py RANK STEP OUT

The frozen rank wakes once generation 0's census has written its members (bounded: 120 s),
finds its generation broken, and is told to leave: its call raises ``Refused``, which this
loop leaves uncaught, as a plain loop would.
"""

from __future__ import annotations

import datetime
import importlib.util
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

from tailtrain import StragglerStep
from tailtrain.runtime.elastic.store import open_store

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "shrink_loop.py"
STEPS = 16


def main() -> None:
    frozen, at, out = int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
    spec = importlib.util.spec_from_file_location("shrink_loop", EXAMPLE)
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    x, y, _, _ = m.digits()
    model = m.make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=m.LR, momentum=m.MOMENTUM)
    step_fn = StragglerStep(model, optimizer, "sync", on_rank_loss="shrink")
    step = 0

    def loss_fn(batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        time.sleep(m.SECONDS)
        if rank == frozen and step == at:  # frozen until the others went on without it
            store = open_store(datetime.timedelta(seconds=120))
            store.wait(["gen0/members"], datetime.timedelta(seconds=120))
        return F.cross_entropy(model(batch[0]), batch[1])

    records = []
    for step in range(STEPS):
        records.append(step_fn(m.micro_batches(x, y, rank, world, step), loss_fn))
    out.mkdir(parents=True, exist_ok=True)
    state = {"records": [r.as_dict() for r in records], "model": model.state_dict()}
    torch.save(state, out / f"rank{rank}.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
