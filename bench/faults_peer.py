"""One rank of ``bench_faults.py``'s peers: plain DDP under torchrun, or one torchft replica.

The same task as ``tailtrain train --task digits-cnn``: the model, its initial weights, the
data shards and the learning rate come from tailtrain's own ``World.build`` of the same
scenario, and every step sleeps the seconds tailtrain's ``runtime.inject.Injector`` would
inject into this worker (the same seeded ``--delay``/``--pattern`` process, column ``worker``:
its ``--micro-batches`` M draws, one delay iteration a step, as ``sync`` draws them), so the
straggler noise is the one tailtrain's rows get. A step computes M micro-batches of the
task's batch size, one forward and backward each, the allreduce on the last (``no_sync``
before it), as a tailtrain rank computes its M units, and sleeps the draws between them as a
tailtrain rank does (draw u after micro-batch u; the last draw before the last micro-batch,
whose backward starts the allreduce, as a tailtrain rank's allreduce follows its last unit's
sleep). Sleeping all M draws before the compute instead ran a straggler's compute while the
others sat in the allreduce, alone on the CPU, where a tailtrain straggler's shares it with
the others' units: on a loaded 2-core machine that gave the peers' steps the difference
(``bench_faults.py``'s docstring has the figures). torchft's ``start_quorum`` comes before the
last draw's sleep: the quorum overlaps that sleep and the last micro-batch (before, the M
micro-batches' compute), and a SIGSTOP in the step's first sleeps lands before the replica
joins it, as it did when the draws came first (called at the step's start, a replica stopped
inside its quorum's step timed out every other replica's allreduce, and torchft 0.2.0's DDP
hook died of ``assert fut._fut`` in all four). The optimizer is plain
SGD at the task's lr on the mean gradient of the N M micro-batches, as tailtrain's ``sync``
update (``core.update``).

Modes (``--mode``):

* ``ddp``: ``torch.nn.parallel.DistributedDataParallel`` on gloo under ``torchrun
  --nproc-per-node N --max-restarts 1``; rank 0 checkpoints every ``--checkpoint-every``
  steps, and a restarted group resumes from it.
* ``torchft``: one replica group of one process (``torchrun --nproc-per-node 1``), torchft's
  ``Manager`` on its ``ProcessGroupGloo``, its ``DistributedDataParallel``, its lighthouse
  given by ``TORCHFT_LIGHTHOUSE``; a restarted replica heals from a live peer. With
  ``--group-size G`` (``bench_faults_nodes.py``: one replica group per node) the group has G
  ranks (``torchrun --nproc-per-node G``), worker ``replica G + LOCAL_RANK``: torchft's DDP
  averages each group rank's gradient over the replicas (its ``Manager`` pairs group rank r
  of every replica), and a plain gloo allreduce inside the group then averages over the G
  ranks, so the update is the mean over every participating rank, as torchft's HSDP does.

Drills (``--drill kill:worker=W,step=S`` or ``freeze:worker=W,step=S,seconds=X``) fire once
per run (a marker file in ``--out``) at the start of worker W's step S, as tailtrain's
``--inject-fault`` does: a kill is SIGKILL to this process, a freeze sleeps the training
thread while the process (and torchft's heartbeat thread) stays alive. SIGSTOP comes from
the harness.

Each process appends one JSON line per step attempt to ``OUT/log-w{worker}-{pid}.jsonl``:
its own ``time.time()`` at the start and at the end of the step, the step number, the
batch loss, whether it committed (and, under torchft, whether this replica's gradient was
part of it), and a ``fault`` line just before a drill fires.

    torchrun ... bench/faults_peer.py --mode ddp --out DIR --steps 120 --workers 4 ...
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]


def parse_drill(text: str | None) -> dict[str, Any] | None:
    """``kill:worker=W,step=S`` or ``freeze:worker=W,step=S,seconds=X`` -> a dict."""
    if not text:
        return None
    kind, _, rest = text.partition(":")
    fields = dict(part.split("=", 1) for part in rest.split(",") if part)
    return {
        "kind": kind,
        "worker": int(fields["worker"]),
        "step": int(fields["step"]),
        "seconds": float(fields.get("seconds", 0.0)),
        "text": text,
    }


class Log:
    """This process's JSON Lines log, flushed every line (a SIGKILL keeps what came before)."""

    def __init__(self, out: Path, worker: int) -> None:
        self.fh = (out / f"log-w{worker}-{os.getpid()}.jsonl").open("a", buffering=1)
        self.worker = worker

    def write(self, **row: Any) -> None:
        self.fh.write(json.dumps({"worker": self.worker, "pid": os.getpid(), **row}) + "\n")
        self.fh.flush()


class Noise:
    """This worker's injected seconds of step s: its M micro-batches' draws from
    tailtrain's own ``Injector`` (one delay iteration of M units a step, as tailtrain's
    ``sync`` draws them), read in order (a resumed or healed rank reads past the steps it
    skipped)."""

    def __init__(self, world: Any, worker: int) -> None:
        from tailtrain.runtime.inject import Injector

        self.injector = Injector(world, worker, delays=True)
        self.m = world.scenario.micro_batches or 1
        #: ``--slow-workers``: this worker's draws times ``--slow-factor`` (a slow node)
        self.factor = 1.0
        self.next = 0
        self.began = time.time()

    def seconds(self, step: int) -> list[float]:
        """The M micro-batches' injected seconds of step ``step``."""
        while self.next < step:  # draws of steps this process did not play
            self.injector.unit_times(1, self.m, time.time() - self.began)
            self.next += 1
        self.next += 1
        draws = self.injector.unit_times(1, self.m, time.time() - self.began)
        return (self.factor * draws).tolist()


def fire(drill: dict[str, Any] | None, worker: int, step: int, out: Path, log: Log) -> None:
    """Worker ``worker``'s drill at the start of its step ``step``, once per run."""
    if drill is None or drill["worker"] != worker or step < drill["step"]:
        return
    marker = out / f"fired-{drill['kind']}-w{worker}"
    if marker.exists():
        return
    marker.write_text(str(step))
    log.write(event="fault", kind=drill["kind"], step=step, t=time.time())
    if drill["kind"] == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(drill["seconds"])  # freeze: this thread only, the process stays alive


def batch(
    world: Any, worker: int, step: int, seed: int, micro: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Worker ``worker``'s micro-batch ``micro`` of step ``step`` from its shard (the same
    on a replay)."""
    task = world.task
    shard = world.partition.shard(worker)
    rng = np.random.default_rng([seed, worker, step, micro])
    idx = torch.as_tensor(shard[rng.integers(0, len(shard), task.batch_size)])
    return task.data.trim(task.data.x_train[idx]), task.data.y_train[idx]


def accumulate(
    ddp: Any,
    world: Any,
    worker: int,
    step: int,
    seed: int,
    m: int,
    seconds: list[float] | None = None,
    before_last: Callable[[], Any] | None = None,
) -> float:
    """The mean gradient of this rank's M micro-batches, each its own forward and backward
    (as tailtrain's ranks compute them, ``runtime.units``), the allreduce only on the last
    one (``no_sync``), with the M injected ``seconds`` slept between them (module docstring:
    one sleep per micro-batch, as a tailtrain rank sleeps after each of its units, so a
    loaded machine's late wake-ups cost every row alike); ``before_last`` (torchft's
    ``start_quorum``) is called before the last draw's sleep. Returns their mean loss."""
    losses, seconds = [], list(seconds or [])
    for micro in range(m):
        if micro == m - 1:  # the last draw (and any extra) before the allreduce's micro-batch
            if before_last is not None:
                before_last()
            for s in seconds[m - 1 :]:
                time.sleep(s)
        x, y = batch(world, worker, step, seed, micro)
        quiet = ddp.no_sync() if micro < m - 1 else contextlib.nullcontext()
        with quiet:
            loss = F.cross_entropy(ddp(x), y)
            (loss / m).backward()
        losses.append(float(loss.detach()))
        if micro < m - 1 and micro < len(seconds):
            time.sleep(seconds[micro])
    return float(np.mean(losses))


def build(args: argparse.Namespace) -> Any:
    from tailtrain.core.scenario import Scenario, World

    scenario = Scenario(
        task=args.task,
        workers=args.workers,
        delay=args.delay,
        pattern=args.pattern,
        iterations=args.steps,
        micro_batches=args.micro_batches,
    )
    return World.build(scenario, args.seed)


def wait_for_peers(out: Path, worker: int, workers: int, timeout: float) -> None:
    """torchft: every replica ready before step 0, so the first quorum holds all of them
    (a replica still importing would otherwise join late and heal at once)."""
    (out / f"ready-w{worker}").write_text(str(os.getpid()))
    deadline = time.monotonic() + timeout
    while sum(1 for _ in out.glob("ready-w*")) < workers:
        if time.monotonic() > deadline:
            raise TimeoutError(f"replicas not ready after {timeout:g} s")
        time.sleep(0.02)


def run_ddp(args: argparse.Namespace, world: Any, out: Path) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    # Each attempt in its own key space of torchrun's store: with the default env:// init, a
    # restarted group's gloo mesh met the failed attempt's addresses (torch 2.13: "Gloo
    # connectFullMesh failed ... Connection refused") and the restart never trained.
    agent = dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        is_master=False,
        timeout=timedelta(seconds=args.timeout),
    )
    if args.attempts == "joins":
        # across nodes a node's torchrun started again by hand counts its restarts from 0
        # while the survivors' agents count 1: the attempt is instead how many times this
        # rank joined (every round of a fixed-size rendezvous holds every rank once)
        restart = agent.add(f"faults-joins-{os.environ['RANK']}", 1) - 1
    dist.init_process_group(
        "gloo",
        store=dist.PrefixStore(f"faults-attempt-{restart}", agent),
        rank=int(os.environ["RANK"]),
        world_size=int(os.environ["WORLD_SIZE"]),
        timeout=timedelta(seconds=args.timeout),
    )
    worker = dist.get_rank()
    log = Log(out, worker)
    model = world.task.module_at(world.task.init_params(args.seed))
    opt = torch.optim.SGD(model.parameters(), lr=world.lr)
    start = 0
    ckpt = out / "ckpt.pt"
    if ckpt.exists():  # a restarted group: the last checkpoint, on every rank
        saved = torch.load(ckpt, weights_only=False)
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["optim"])
        start = int(saved["step"])
    ddp = DistributedDataParallel(model)
    noise = Noise(world, worker)
    noise.factor = args.slow_factor if worker in args.slow_workers else 1.0
    log.write(event="start", step=start, restart=restart, t=time.time())
    for step in range(start, args.steps):
        t0 = time.time()
        fire(args.drill, worker, step, out, log)
        opt.zero_grad()
        # DDP's allreduce on the last micro-batch: the mean gradient of the N ranks' N M
        seconds = noise.seconds(step)
        loss = accumulate(ddp, world, worker, step, args.seed, args.micro_batches, seconds)
        opt.step()
        log.write(step=step, t0=t0, t=time.time(), loss=loss, committed=True, part=True)
        if worker == 0 and (step + 1) % args.checkpoint_every == 0:
            state = {"model": model.state_dict(), "optim": opt.state_dict(), "step": step + 1}
            torch.save(state, out / "ckpt.tmp")
            os.replace(out / "ckpt.tmp", ckpt)  # atomic: a kill never leaves half a file
    dist.destroy_process_group()


def run_torchft(args: argparse.Namespace, world: Any, out: Path) -> None:
    import torch.distributed as dist
    from torchft import DistributedDataParallel, Manager, ProcessGroupGloo

    group_rank = int(os.environ.get("LOCAL_RANK", "0")) if args.group_size > 1 else 0
    if args.group_size > 1:  # the replica group's own ranks (module docstring)
        dist.init_process_group("gloo")
    worker = args.replica * args.group_size + group_rank
    log = Log(out, worker)
    model = world.task.module_at(world.task.init_params(args.seed))
    opt = torch.optim.SGD(model.parameters(), lr=world.lr)

    def state_dict() -> dict[str, Any]:
        return {"model": model.state_dict(), "optim": opt.state_dict()}

    def load_state_dict(state: dict[str, Any]) -> None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optim"])

    timeouts: dict[str, Any] = {}
    pg = ProcessGroupGloo()
    if args.timeout > 0:  # tuned; 0: torchft's defaults
        # The quorum call must outlive the lighthouse's wait for a heartbeating replica that
        # does not join (--join_timeout_ms = the timeout): at equal values the frozen drill
        # measured every replica dying of "lighthouse quorum failed ... Timeout expired".
        timeouts = {
            "timeout": timedelta(seconds=args.timeout),
            "quorum_timeout": timedelta(seconds=3 * args.timeout),
        }
        pg = ProcessGroupGloo(timeout=timedelta(seconds=args.timeout))
    manager = Manager(
        pg=pg,
        min_replica_size=1,
        load_state_dict=load_state_dict,
        state_dict=state_dict,
        replica_id=f"faults_{args.replica}",
        rank=group_rank,
        world_size=args.group_size,
        **timeouts,
    )
    ddp = DistributedDataParallel(manager, model)
    noise = Noise(world, worker)
    noise.factor = args.slow_factor if worker in args.slow_workers else 1.0
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if restart == 0 and not (out / f"ready-w{worker}").exists():  # not a node started again
        wait_for_peers(out, worker, args.workers, args.timeout_ready)
    log.write(event="start", step=manager.current_step(), restart=restart, t=time.time())
    while manager.current_step() < args.steps:
        t0 = time.time()
        step = manager.current_step()
        fire(args.drill, worker, step, out, log)
        seconds = noise.seconds(step)
        opt.zero_grad()
        # torchft's allreduce on the last micro-batch, among this quorum's participants; the
        # quorum starts before the last draw's sleep (module docstring)
        m, quorum = args.micro_batches, manager.start_quorum
        loss = accumulate(ddp, world, worker, step, args.seed, m, seconds, quorum)
        if args.group_size > 1:  # the mean over the group's ranks of the replicas' means
            grads = [p.grad for p in model.parameters() if p.grad is not None]
            flat = torch.cat([g.flatten() for g in grads])
            dist.all_reduce(flat)
            for g, part in zip(grads, flat.split([g.numel() for g in grads]), strict=True):
                g.copy_(part.view_as(g) / args.group_size)
        part = manager.is_participating()
        committed = manager.should_commit()
        if committed:
            opt.step()
        log.write(
            step=step,
            t0=t0,
            t=time.time(),
            loss=loss,
            committed=bool(committed),
            part=bool(part),
            participants=manager.num_participants(),
            after=manager.current_step(),
        )
    manager.shutdown(wait=False)
    if dist.is_initialized():
        dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=("ddp", "torchft"), required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--task", default="digits-cnn")
    parser.add_argument("--delay", required=True)
    parser.add_argument("--pattern", default="iid")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--drill", type=parse_drill, default=None)
    parser.add_argument("--micro-batches", type=int, default=1, help="per rank and step")
    parser.add_argument("--checkpoint-every", type=int, default=20)
    parser.add_argument("--timeout", type=float, default=0.0, help="0: the library's default")
    parser.add_argument("--timeout-ready", type=float, default=120.0)
    parser.add_argument("--replica", type=int, default=0)
    parser.add_argument("--group-size", type=int, default=1, help="torchft: ranks per replica")
    parser.add_argument(
        "--slow-workers",
        type=lambda text: [int(w) for w in text.split(",") if w],
        default=[],
        help="workers whose injected seconds are --slow-factor times longer (a slow node)",
    )
    parser.add_argument("--slow-factor", type=float, default=1.0)
    parser.add_argument(
        "--attempts",
        choices=("restarts", "joins"),
        default="restarts",
        help="ddp: the key space of an attempt, torchrun's restart count or this rank's joins",
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    sys.path.insert(0, str(ROOT / "src"))
    world = build(args)
    if args.mode == "ddp":
        if args.timeout <= 0:
            args.timeout = 1800.0  # torch.distributed's own default for gloo
        run_ddp(args, world, args.out)
    else:
        run_torchft(args, world, args.out)


if __name__ == "__main__":
    main()
