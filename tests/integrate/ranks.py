"""What the integrate tests' multi-process cases share: a free loopback port, joining a gloo
group with a bounded timeout, and N ranks forked from the test process, each saving what it
found to ``rank{r}.pt`` in a folder the test then reads."""

from __future__ import annotations

import contextlib
import datetime
import gc
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def join(rank: int, port: int, world: int) -> None:
    """Rank ``rank`` of a ``world``-rank gloo group on ``port``: one torch thread, a 60 s
    bound on every collective."""
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
        timeout=datetime.timedelta(seconds=60),
    )  # fmt: skip


@contextlib.contextmanager
def no_garbage_inherited() -> Iterator[None]:
    """Fork inside this: the test worker's garbage is freed first, where its threads live, and
    what is left is frozen, so no child's collector frees its copy of an earlier test's DDP
    reducer or process group, whose destructor joins threads a fork did not copy (a child
    hung there, in CI, for good)."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def run_ranks(rank_main: Callable[[int, int, str], None], folder: Path, world: int) -> list[Any]:
    """Fork ``world`` ranks of ``rank_main(rank, port, folder)`` and load what each saved."""
    with no_garbage_inherited():
        mp.start_processes(rank_main, (free_port(), str(folder)), nprocs=world, start_method="fork")
    return [torch.load(folder / f"rank{r}.pt", weights_only=False) for r in range(world)]
