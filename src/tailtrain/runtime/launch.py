"""Starting `tailtrain train`, the PyTorch way: one rank under torchrun, or N local ranks.

* Under ``torchrun`` (``RANK``, ``WORLD_SIZE`` and ``MASTER_ADDR`` in the environment) this
  process is one rank of that job: it joins the process group by ``env://``.
* Otherwise ``--workers N`` starts N local processes with torch's elastic launcher
  (``torch.distributed.launcher.api.elastic_launch``), a static rendezvous hosted on
  ``--rdzv-endpoint`` (127.0.0.1 and a free port by default), restarting a failed group up
  to ``--max-restarts`` times (the new ranks go on from the run folder's checkpoint,
  ``runtime.keep``). Gloo ranks are
  forked, which shares the parent's imported torch (spawning re-imports it: seconds per rank
  on a small machine); NCCL ranks are spawned, as CUDA cannot be used after a fork.

Everything that can be checked is checked before anything starts: the strategy's topology
and its own checks with the job's worker count (``Strategy.init``), the scenario, task and
delays (by building them once), the number of local ranks (at most ``MAX_LOCAL_WORKERS`` and
``WORKERS_PER_CORE`` per CPU core: each rank is a whole Python process with its own copy of
the data), the backend, CUDA for nccl, and that the rendezvous address is this machine's and
its port is free. Those errors are one-line ``UsageError``\\ s; under torchrun every rank
finds them, rank 0 says it and the others exit with status 2 without a word.

A parameter server's workers are the exception to what follows: in a local launch each runs
shielded (``runtime.expendable``), so its death is logged and the server goes on without it
(``runtime.ps.liveness``); under torchrun, torchrun's agent stops the job as for any rank.

A rank that fails stops the job: the launcher kills the other ranks (they take SIGTERM's
default action, even inside a collective; the allreduce topology's ranks first take a census
and checkpoint, ``runtime.keep``) and :class:`JobFailed` names the failed rank in one line,
with the step and the checkpoint when the survivors left a note. Ranks that only saw a
collective fail wait a moment first (``runtime.reduce``), so the rank named is the one that
failed first. A hung rank makes the others' collectives time out after ``--timeout`` seconds.

Ctrl-C is no failure: the agent forwards the launcher's SIGINT to the ranks and waits for
them, and they stop at a step boundary and keep what finished (``runtime.keep``); the
launcher then raises :class:`~tailtrain.runtime.interrupt.Interrupted` with the lead rank's one
line (exit status 130). Under torchrun each rank stops on the SIGINT or SIGTERM torchrun
forwards, and rank 0 raises that line.
"""

from __future__ import annotations

import ast
import dataclasses
import datetime
import errno
import gc
import logging
import multiprocessing
import os
import pickle
import pickletools
import signal
import socket
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from tailtrain.core.records import RunRecord
from tailtrain.core.session import check_entry
from tailtrain.errors import TailtrainError, UsageError
from tailtrain.runtime.config import RankResult, TrainConfig, build_world
from tailtrain.runtime.control import RuleDriver
from tailtrain.runtime.elastic.refusals import check_shrink
from tailtrain.runtime.elastic.store import REJOIN, note_dead
from tailtrain.runtime.expendable import shielded
from tailtrain.runtime.inject import FaultDrill
from tailtrain.runtime.interrupt import (
    Interrupt,
    Interrupted,
    interrupt_on_signals,
    interrupt_requested,
)
from tailtrain.runtime.keep import (
    describe,
    interrupted_line,
    read_interrupted,
    read_note,
    restarts,
    resume_hint,
)
from tailtrain.runtime.reduce import Collectives
from tailtrain.runtime.telemetry import close_record
from tailtrain.runtime.topologies import RankEntry, TopologySpec, spec_of
from tailtrain.strategies.base import Context, Strategy, Topology

MAX_LOCAL_WORKERS = 64
WORKERS_PER_CORE = 8
TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "MASTER_ADDR")
#: torch loggers that narrate the launch; quiet unless --verbose (we report failures ourselves)
LAUNCH_LOGGERS = (
    "torch.distributed.elastic",
    "torch.distributed.launcher",
    "torch.multiprocessing",
)
#: signals the elastic agent handles in the launching process (and does not restore)
AGENT_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)


class JobFailed(TailtrainError):
    """A rank failed; the message names it in one line."""


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


# ---- what runs where ---------------------------------------------------------------------------
def in_torchrun(env: Mapping[str, str] = os.environ) -> bool:
    """Whether this process is a rank of a job someone else launched (torchrun, env://)."""
    return all(name in env for name in TORCHRUN_VARIABLES)


def default_backend() -> str:
    return "nccl" if torch.cuda.is_available() else "gloo"


def max_local_workers() -> int:
    return min(MAX_LOCAL_WORKERS, (os.cpu_count() or 1) * WORKERS_PER_CORE)


def train(
    config: TrainConfig, endpoint: str = "127.0.0.1:0", prepare: Callable[[], None] | None = None
) -> RankResult:
    """Run ``config``; returns rank 0's result (under torchrun, this rank's, holding rank 0's
    record: :func:`lead_records`). ``prepare`` runs once the input is checked, before any rank
    starts (the CLI claims the run folder there)."""
    local = not in_torchrun()
    try:
        validate(config, local=local)
    except UsageError:
        if local or os.environ["RANK"] == "0":
            raise
        raise UsageError("") from None  # every rank finds it; rank 0 says it, the others exit 2
    if prepare is not None:
        prepare()
    if not local:
        check_rendezvous(os.environ, config.timeout)
        with tempfile.TemporaryDirectory(prefix="tailtrain-") as notes:
            return torchrun_rank(dataclasses.replace(config, report=Path(notes) / "failure.json"))
    return launch([config], reserve(parse_endpoint(endpoint)))[0][0]


def torchrun_rank(config: TrainConfig) -> RankResult:
    """This process as one rank of a torchrun job. After Ctrl-C (SIGINT or SIGTERM from
    torchrun, ``runtime.interrupt``) it raises :class:`Interrupted`, with the one line on rank 0."""
    rank = os.environ["RANK"]
    try:
        result = rank_entry([config], own_launcher=False)[0]
    except UsageError:
        raise
    except BaseException as exc:  # torchrun reports the job; this line says which rank and why
        if isinstance(exc, Interrupt) or read_interrupted(config.report) is not None:
            raise interrupted_rank(config, rank) from None
        if not isinstance(exc, Exception):
            raise
        raise JobFailed(f"rank {rank} failed: {one_line(exc)}") from exc
    # rank 0 kept an interrupted run (its note); the others only know that they were asked
    if read_interrupted(config.report) is not None or (rank != "0" and interrupt_requested()):
        raise interrupted_rank(config, rank)
    return result


def interrupted_rank(config: TrainConfig, rank: str) -> Interrupted:
    """The end of an interrupted torchrun rank: rank 0's one line, the others' silence."""
    return Interrupted(interrupted_line(read_interrupted(config.report)) if rank == "0" else "")


def launch(
    configs: Sequence[TrainConfig], endpoint: Endpoint, entry: RankEntry | None = None
) -> dict[int, list[RankResult]]:
    """Run ``configs`` one after the other in one local job; every rank's results by rank.

    ``entry`` replaces the strategy's topology entry on every rank (own models,
    ``runtime.ps.runner``); forked ranks inherit it, spawned ones need it picklable."""
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    first = configs[0]
    with tempfile.TemporaryDirectory(prefix="tailtrain-") as logs, quiet(first.verbose):
        note = Path(logs) / "failure.json"  # what the survivors of a failure saw (runtime.keep)
        configs = [dataclasses.replace(c, report=note) for c in configs]
        spec = LaunchConfig(
            min_nodes=1,
            max_nodes=1,
            nproc_per_node=spec_of(first.strategy).processes(first.scenario.workers),
            run_id=f"tailtrain-{uuid.uuid4().hex[:12]}",
            rdzv_backend="static",
            rdzv_endpoint=str(endpoint),
            rdzv_configs={"rank": 0, "timeout": max(1, round(first.timeout))},
            max_restarts=first.max_restarts,
            monitor_interval=0.1,
            start_method=start_method(first.on_cuda, own_entry=not reaches_fork_server(entry)),
            logs_specs=DefaultLogsSpecs(log_dir=logs),
        )
        try:
            return elastic_launch(spec, rank_entry)(list(configs), True, entry)
        except ChildFailedError as exc:  # the agent gives up after its last restart
            if (kept := read_interrupted(note)) is not None:  # a rank alone got the Ctrl-C
                raise Interrupted(interrupted_line(kept)) from None
            last = read_note(note, restart=first.max_restarts)
            line = describe_failure(exc, last)
            if first.on_rank_loss == "shrink":  # only rank 0 is not shielded
                line += (
                    "; --on-rank-loss shrink goes on without any rank but 0, which keeps the "
                    "record: add --max-restarts 1 and --out DIR to go on from a checkpoint"
                )
            if last is None:  # nobody outlived the failure to note it (a killed server)
                line += resume_hint(first.out)
            raise JobFailed(line) from None
        except SignalException as exc:  # Ctrl-C: the agent forwarded it and waited for the ranks
            if exc.sigval != signal.SIGINT:
                raise
            raise Interrupted(interrupted_line(read_interrupted(note))) from None


def reaches_fork_server(entry: RankEntry | None) -> bool:
    """Whether the fork server can run ``entry``: none, or one that pickles by reference
    (a library function, a ``functools.partial`` over such functions). A script's own
    functions qualify when the fork server's rank can find them: as under ``spawn``, it
    re-runs the script's top level as ``__mp_main__`` (not its ``if __name__ ==
    "__main__":`` block), so each must be defined there. A closure, a lambda, or an
    interactive session's function does not qualify."""
    if entry is None:
        return True
    try:
        pickled = pickle.dumps(entry, protocol=2)  # protocol 2 names every global in one op
    except (pickle.PicklingError, AttributeError, TypeError):
        return False
    names = {
        str(arg).split(" ", 1)[1].split(".", 1)[0]
        for op, arg, _ in pickletools.genops(pickled)
        if op.name == "GLOBAL" and str(arg).startswith("__main__ ")
    }
    return not names or names <= script_top_level_names()


def script_top_level_names() -> set[str]:
    """The names this process's script binds at its top level, outside its ``__main__``
    guard: what a fork-server (or spawned) rank that re-runs the script will find."""
    main = sys.modules["__main__"]
    path = getattr(main, "__file__", None)
    if path is None:  # an interactive session: nothing to re-run
        return set()
    try:
        tree = ast.parse(Path(path).read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError):
        return set()
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.If) and is_main_guard(node.test):
            continue
        for inner in ast.walk(node) if isinstance(node, ast.If | ast.Try) else [node]:
            if isinstance(inner, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(inner.name)
            elif isinstance(inner, ast.Assign | ast.AnnAssign):
                targets = inner.targets if isinstance(inner, ast.Assign) else [inner.target]
                names |= {t.id for t in targets if isinstance(t, ast.Name)}
            elif isinstance(inner, ast.Import | ast.ImportFrom):
                names |= {(a.asname or a.name).split(".")[0] for a in inner.names}
    return names


def is_main_guard(test: ast.expr) -> bool:
    """``__name__ == "__main__"`` (either way round)."""
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1):
        return False
    sides = {ast.dump(test.left), ast.dump(test.comparators[0])}
    return sides == {ast.dump(ast.Name("__name__", ast.Load())), ast.dump(ast.Constant("__main__"))}


def start_method(on_cuda: bool, *, own_entry: bool) -> str:
    """How local ranks start. Ranks on a GPU (nccl, or gloo on CUDA tensors) are spawned
    (CUDA cannot be used after a fork).
    Gloo ranks fork from a fork server: a clean process that imported torch and tailtrain
    once, so every launch after the first starts in about a second, and no rank inherits the
    launching process's state: forked straight from the launching process (its agent's store
    and threads already running), a rank sometimes never joined the process group (CI saw it
    in the parameter-server tests, and again in a user's script's entry). Only an entry the
    fork server cannot reach (:func:`reaches_fork_server`: a closure over a user's model)
    forks from the launching process."""
    if on_cuda:
        return "spawn"
    if own_entry:
        return "fork"
    multiprocessing.set_forkserver_preload(["torch", "tailtrain.runtime.launch"])
    return "forkserver"


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


# ---- checks before anything starts -------------------------------------------------------------
def validate(config: TrainConfig, *, local: bool) -> None:
    """Every check that needs no other process (module docstring)."""
    scenario = config.scenario
    spec = spec_of(config.strategy)
    if config.checkpoint_every is not None and not spec.checkpoints:
        raise UsageError(
            f"the {spec.topology} topology keeps no checkpoints; drop --checkpoint-every"
        )
    if local and scenario.workers > max_local_workers():
        raise UsageError(
            f"--workers {scenario.workers} local processes is too many: at most "
            f"{max_local_workers()} here ({WORKERS_PER_CORE} per CPU core, "
            f"{MAX_LOCAL_WORKERS} in all); use torchrun across machines for more"
        )
    world, strategy = build_world(config)  # loads the task and reads trace files
    # every rank's own entry check (a task with no model, among others), before any starts
    check_entry(world, spec.processes(scenario.workers), servers=spec.extra_ranks)
    check_rule(strategy, spec, world.context, local=local)
    if config.on_rank_loss == "shrink":  # before the GPUs are counted: the same line anywhere
        check_shrink(
            strategy,
            str(spec.topology),
            local=local,
            ctx=world.context,
            backend=config.backend,
            on_cuda=config.on_cuda,
        )
    if config.backend == "nccl":
        check_cuda(scenario.workers if local else 1)
    elif config.on_cuda:
        check_cuda(1, "device cuda")


def check_rule(strategy: Strategy, spec: TopologySpec, ctx: Context, *, local: bool) -> None:
    """The rule's own checks with the job's workers (``Strategy.init``, as every rank runs
    it), and its first plan as its topology takes it; where the topology has ranks of its own
    (a parameter server's rank 0), the refusal says which ranks are the workers."""
    try:
        driver = RuleDriver(strategy, ctx, remember=False)  # init, as every rank runs it
        if spec.topology is Topology.ALLREDUCE:
            driver.plan()  # as the allreduce takes it (``as_allreduce``)
    except TailtrainError as exc:
        if not spec.extra_ranks:
            raise UsageError(str(exc)) from None
        n = ctx.n_workers
        job = f"with --workers {n}" if local else f"of torchrun's {n + 1} ranks"
        raise UsageError(
            f"{exc}: {job}, rank 0 is the parameter server and ranks 1-{n} are its {n} workers"
        ) from None


def check_cuda(gpus: int, asked: str = "--backend nccl") -> None:
    if not torch.cuda.is_available():
        raise UsageError(f"{asked} needs CUDA GPUs and none is available; use gloo on cpu")
    if torch.cuda.device_count() < gpus:
        raise UsageError(
            f"--backend nccl runs one rank per GPU: {gpus} ranks but "
            f"{torch.cuda.device_count()} GPUs; use fewer --workers or gloo"
        )


def check_rendezvous(env: Mapping[str, str], timeout: float) -> None:
    """Under torchrun: the store at MASTER_ADDR:MASTER_PORT resolves and answers (a rank 0
    outside torchrun hosts it itself, so only the name is checked there)."""
    host, port = env["MASTER_ADDR"], int(env.get("MASTER_PORT", "29500"))
    try:
        socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        raise UsageError(f"the rendezvous host MASTER_ADDR={host!r} does not resolve") from None
    if env["RANK"] == "0" and env.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection((host, port), timeout=min(1.0, timeout)).close()
            return
        except OSError:
            if time.monotonic() >= deadline:
                raise UsageError(
                    f"cannot reach the rendezvous at {host}:{port} within --timeout "
                    f"{timeout:g}s; check MASTER_ADDR/MASTER_PORT"
                ) from None
            time.sleep(0.2)


def parse_endpoint(text: str) -> Endpoint:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise UsageError(f"--rdzv-endpoint {text!r} must be HOST:PORT with PORT in 0..65535")
    return Endpoint(host.strip("[]"), int(port))


def reserve(endpoint: Endpoint) -> Endpoint:
    """Check that the local launcher can host the rendezvous there; port 0 picks a free one.

    The port is released again before the launcher binds it (as PyTorch's own tests do).
    """
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            endpoint.host, endpoint.port, type=socket.SOCK_STREAM
        )[0]
    except (socket.gaierror, UnicodeError):
        raise UsageError(f"--rdzv-endpoint host {endpoint.host!r} does not resolve") from None
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(address)
        except OSError as exc:
            raise UsageError(unusable(endpoint, exc)) from None
        return Endpoint(endpoint.host, sock.getsockname()[1])


def unusable(endpoint: Endpoint, exc: OSError) -> str:
    if exc.errno == errno.EADDRINUSE:
        return f"--rdzv-endpoint port {endpoint.port} is in use; choose another, or 0 (a free one)"
    if exc.errno == errno.EADDRNOTAVAIL:
        return (
            f"--rdzv-endpoint {endpoint} is unreachable: {endpoint.host} is not an address of "
            "this machine, and a local launch hosts the rendezvous itself (use torchrun "
            "across machines)"
        )
    return f"--rdzv-endpoint {endpoint} cannot be used: {exc.strerror}"


# ---- failures ----------------------------------------------------------------------------------
def describe_failure(exc: Exception, note: dict | None = None) -> str:
    """One line naming the first rank that failed and why (from torch elastic's error file);
    with the survivors' ``note`` (``runtime.keep``), also the step, a rank that hung, and the
    checkpoint to resume from."""
    rank, failure = exc.get_first_failure()  # type: ignore[attr-defined]
    message = failure.message
    if isinstance(message, dict):
        message = message.get("message", "")
    text = one_line(str(message)) if message else f"exit code {failure.exitcode}"
    signal_name = failure.signal_name() if failure.exitcode < 0 else None
    return describe(rank, text, signal_name, note)


def one_line(exc: BaseException | str) -> str:
    text = str(exc).strip()
    if isinstance(exc, BaseException):
        text = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return text.splitlines()[0] if text else "no message"


@contextmanager
def quiet(verbose: bool) -> Iterator[None]:
    """Silence torch's launch narration (it logs a traceback per failure, and a line per rank
    it stops on Ctrl-C) unless verbose, and give back the signal handlers the elastic agent
    installs in this process. torch's loggers below those names set their own levels."""
    known = list(logging.root.manager.loggerDict)
    names = [n for n in known if any(n.startswith(f"{p}.") for p in LAUNCH_LOGGERS)]
    loggers = [logging.getLogger(name) for name in (*LAUNCH_LOGGERS, *names)]
    levels = [logger.level for logger in loggers]
    handlers = {sig: signal.getsignal(sig) for sig in AGENT_SIGNALS}
    if not verbose:
        for logger in loggers:
            logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)
        if threading.current_thread() is threading.main_thread():
            for sig, handler in handlers.items():
                signal.signal(sig, handler)
