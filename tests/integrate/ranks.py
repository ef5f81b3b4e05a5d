"""What the integrate tests' multi-process cases share: a free loopback port, joining a gloo
group with a bounded timeout, and N ranks forked from the test process, each saving what it
found to ``rank{r}.pt`` in a folder the test then reads."""

from __future__ import annotations

import contextlib
import datetime
import gc
import os
import shutil
import socket
import subprocess
import sys
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


#: torch's abort at a process's exit once its job finished (bench/bench_loop.py's EXIT_ABORT
#: says why): a run that ends on it is run once more
EXIT_ABORT = "terminate called without an active exception"
ROOT = Path(__file__).resolve().parents[2]


def torchrun(
    script: Path, args: list[str], nproc: int, fresh: Path, timeout: float = 240
) -> subprocess.CompletedProcess:
    """``script`` with ``args`` on ``nproc`` local gloo ranks under torchrun (the repo's
    source and tests importable, one torch thread each): run once more, ``fresh`` emptied,
    where only torch's abort at exit failed it; the run's output (returncode checked by the
    caller)."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT), env.get("PYTHONPATH", "")])
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
        "--master-addr", "127.0.0.1", "--master-port", str(free_port()), str(script), *args,
    ]  # fmt: skip
    for attempt in range(2):
        done = subprocess.run(
            command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
        )
        if done.returncode == 0 or EXIT_ABORT not in done.stderr or attempt:
            return done
        shutil.rmtree(fresh, ignore_errors=True)
        fresh.mkdir(parents=True)
    return done
