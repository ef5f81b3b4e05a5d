"""One rank of ``tailtrain train``: join the process group, run the configs, leave.

Every rank, whether forked by the local launcher (``launching.launch``) or started by
torchrun, runs :func:`rank_entry`. A local parameter server's workers (and every rank but 0
of an allreduce that shrinks) run shielded (``runtime.expendable``), so the job outlives
them; after Ctrl-C a local rank keeps what finished and exits with status 130.
"""

from __future__ import annotations

import dataclasses
import datetime
import gc
import logging
import os
import signal
import sys
from collections.abc import Mapping

import torch
import torch.distributed as dist

from tailtrain.core.records import RunRecord
from tailtrain.errors import UsageError
from tailtrain.runtime.config import RankResult, TrainConfig
from tailtrain.runtime.elastic.store import REJOIN, note_dead
from tailtrain.runtime.expendable import shielded
from tailtrain.runtime.inject import FaultDrill
from tailtrain.runtime.interrupt import interrupt_on_signals, interrupt_requested
from tailtrain.runtime.keep import restarts
from tailtrain.runtime.launching.failures import one_line
from tailtrain.runtime.launching.topologies import RankEntry, spec_of
from tailtrain.runtime.reduce import Collectives
from tailtrain.runtime.telemetry import close_record


def rank_entry(
    configs: list[TrainConfig], own_launcher: bool, entry: RankEntry | None = None
) -> list[RankResult]:
    """One rank: join the process group, run every config in turn (with ``entry``, or the
    strategy's topology entry), leave."""
    if own_launcher:  # die at once when our launcher stops the job, even inside a collective
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    interrupt_on_signals(torchrun=not own_launcher)  # Ctrl-C: stop at a step (runtime.interrupt)
    # a forked rank's first full collection would touch, and so copy, the parent's whole heap
    # (hundreds of ms, in the middle of a timed round); the inherited objects are not garbage
    gc.freeze()
    rank = int(os.environ.get("RANK", "0"))
    try:
        if own_launcher and rank > 0 and expendable(configs[0]):
            first = configs[0]
            on_death = note_dead if first.on_rank_loss == "shrink" else None
            again = (lambda: run_rank(configs, entry, rejoin=True)) if first.restart_lost else None
            body = lambda: run_rank(configs, entry)  # noqa: E731
            results = shielded(body, rank, len(configs), on_death, again, first.restart_lost)
        else:
            # under torchrun each rank returns to its own caller: each gets the job's record
            results = run_rank(configs, entry, share=not own_launcher)
    except BaseException:
        if own_launcher and interrupt_requested():  # whatever ended an interrupted rank
            leave_interrupted()
        raise
    if own_launcher and interrupt_requested():
        leave_interrupted()
    return results


def expendable(config: TrainConfig) -> bool:
    """Whether a local worker rank's death leaves the job going (``runtime.expendable``): a
    parameter server's workers, and every rank but 0 of an allreduce that shrinks."""
    return spec_of(config.strategy).expendable_workers or config.on_rank_loss == "shrink"


def leave_interrupted() -> None:
    """A local rank after Ctrl-C, its part kept (``runtime.keep``): exit now, status 130.
    Returning would leave it waiting for a launcher that no longer collects results (torch
    elastic's ``_wrap``) until the agent kills it."""
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(130)


def run_rank(
    configs: list[TrainConfig],
    entry: RankEntry | None,
    rejoin: bool = False,
    share: bool = False,
) -> list[RankResult]:
    """This rank's runs; ``rejoin``: a rank started again after it died
    (``--restart-lost``), which joins the live ranks' generation instead of the job's
    process group (``runtime.elastic.shrink``); ``share``: every rank's results hold rank
    0's records (:func:`lead_records`)."""
    first = configs[0]
    torch.set_num_threads(first.threads)
    if rejoin:
        os.environ[REJOIN] = "1"
        rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        comm = Collectives(rank, size, torch.device("cpu"))
    else:
        comm = join(first)
    tag_logs(comm.rank, first.verbose)
    results = []
    for config in configs:  # after a Ctrl-C, no config starts (rank_entry leaves)
        spec = spec_of(config.strategy)
        # the run's drills ride on the collectives, once per run (``runtime.rank``)
        worker = spec.worker_of(comm.rank)
        comm.arm(FaultDrill(config.faults, worker, config.out, rank=comm.rank))
        results.append((entry or spec.entry)(config, comm))
        if interrupt_requested():
            break
    for result in results:  # flush TensorBoard; a sink does not go back by pickle
        close_record(result.record)
    if share:
        results = lead_records(results, comm)
    if dist.is_initialized():  # a rank started again never joined the job's group
        dist.destroy_process_group()  # only on success: after a failure the launcher stops us
    return results


def lead_records(results: list[RankResult], comm: Collectives) -> list[RankResult]:
    """``results`` with rank 0's records (steps, evaluations, summary) on every rank, each
    rank's own final parameters kept: one object broadcast after the last run.

    Rank 0 holds the job's record; the others hold a partial view (an allreduce rank's rows
    without evaluations or summary) or only their own counts (a parameter server's worker).
    Under torchrun each rank returns to its own caller, so without this a script that reads
    the summary fails on every rank but 0."""
    lead = comm.broadcast_object(
        [(r.record.steps, r.record.evals, r.record.summary) for r in results]
        if comm.rank == 0
        else None
    )
    if comm.rank == 0:
        return results
    return [
        dataclasses.replace(r, record=RunRecord(steps=steps, evals=evals, summary=summary))
        for r, (steps, evals, summary) in zip(results, lead, strict=False)
    ]


def tag_logs(rank: int, verbose: bool) -> None:
    """Every log line of this process names its rank (the rules' lines included)."""
    root = logging.getLogger()
    if not root.handlers:  # spawned: nothing inherited
        logging.basicConfig(level=logging.INFO if verbose else logging.WARNING)
    for handler in root.handlers:
        handler.setFormatter(logging.Formatter(f"%(levelname)s rank {rank} %(name)s: %(message)s"))


def join(config: TrainConfig) -> Collectives:
    """init_process_group by env://, with ``--timeout`` on the rendezvous and collectives."""
    device = torch.device("cpu")
    if config.on_cuda:  # gloo ranks on CUDA tensors may share a GPU: LOCAL_RANK modulo GPUs
        local = int(os.environ.get("LOCAL_RANK", "0"))
        device = torch.device("cuda", local % max(torch.cuda.device_count(), 1))
        torch.cuda.set_device(device)
    where = f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}"
    timeout = datetime.timedelta(seconds=config.timeout)
    try:
        store = restarted_store(os.environ, timeout)
        if store is None:
            dist.init_process_group(config.backend, init_method="env://", timeout=timeout)
        else:
            rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
            dist.init_process_group(
                config.backend, store=store, rank=rank, world_size=size, timeout=timeout
            )
    except (RuntimeError, ValueError, TimeoutError) as exc:
        raise UsageError(
            f"cannot join the rendezvous at {where} within {config.timeout:g}s: {one_line(exc)}"
        ) from None
    return Collectives(dist.get_rank(), dist.get_world_size(), device)


def restarted_store(env: Mapping[str, str], timeout: datetime.timedelta) -> dist.Store | None:
    """A restarted group's store: the agent's, under a prefix of this restart. A static
    rendezvous hands every restart the same agent store, whose keys still hold the last
    group's addresses (env:// would connect to them); None for a first start."""
    attempt = restarts(env)
    if attempt == 0 or env.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    host, port, size = env["MASTER_ADDR"], int(env["MASTER_PORT"]), int(env["WORLD_SIZE"])
    base = dist.TCPStore(host, port, size, is_master=False, timeout=timeout)
    return dist.PrefixStore(f"tailtrain/attempt_{attempt}", base)
