"""Starting `tailtrain train`, the PyTorch way: one rank under torchrun, or N local ranks.

* Under ``torchrun`` (``RANK``, ``WORLD_SIZE`` and ``MASTER_ADDR`` in the environment) this
  process is one rank of that job: it joins the process group by ``env://``.
* Otherwise ``--workers N`` starts N local processes with torch's elastic launcher
  (``torch.distributed.launcher.api.elastic_launch``), a static rendezvous hosted on
  ``--rdzv-endpoint`` (127.0.0.1 and a free port by default), restarting a failed group up
  to ``--max-restarts`` times (the new ranks go on from the run folder's checkpoint,
  ``runtime.keep``). Gloo ranks fork from a fork server that imported torch once
  (:func:`start_method`; spawning re-imports it: seconds per rank on a small machine), or
  from the launching process for an entry the fork server cannot reach
  (:func:`reaches_fork_server`); NCCL ranks are spawned, as CUDA cannot be used after a fork.

Everything that can be checked is checked before anything starts: the strategy's topology
and its own checks with the job's worker count (``Strategy.init``), the scenario, task and
delays (by building them once), the number of local ranks (at most ``MAX_LOCAL_WORKERS`` and
``WORKERS_PER_CORE`` per CPU core: each rank is a whole Python process with its own copy of
the data), the backend, CUDA for nccl, and that the rendezvous address is this machine's and
its port is free (``launching.checks``, ``launching.endpoint``). Those errors are one-line
``UsageError``\\ s; under torchrun every rank finds them, rank 0 says it and the others
exit with status 2 without a word.

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
import logging
import multiprocessing
import os
import pickle
import pickletools
import signal
import sys
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from tailtrain.errors import UsageError
from tailtrain.runtime.config import RankResult, TrainConfig
from tailtrain.runtime.interrupt import Interrupt, Interrupted, interrupt_requested
from tailtrain.runtime.keep import interrupted_line, read_interrupted, read_note, resume_hint
from tailtrain.runtime.launching.checks import in_torchrun, validate
from tailtrain.runtime.launching.endpoint import Endpoint, check_rendezvous, parse_endpoint, reserve
from tailtrain.runtime.launching.failures import JobFailed, describe_failure, one_line
from tailtrain.runtime.launching.rank_entry import rank_entry
from tailtrain.runtime.launching.topologies import RankEntry, spec_of

#: torch loggers that narrate the launch; quiet unless --verbose (we report failures ourselves)
LAUNCH_LOGGERS = (
    "torch.distributed.elastic",
    "torch.distributed.launcher",
    "torch.multiprocessing",
)
#: signals the elastic agent handles in the launching process (and does not restore)
AGENT_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)


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
    ``runtime.launching.own_model``); forked ranks inherit it, spawned ones need it picklable."""
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
    functions qualify when the fork server's rank can find them and re-running the script
    is safe: as under ``spawn``, the rank re-runs the script's top level as ``__mp_main__``
    (not its ``if __name__ == "__main__":`` block), so each must be defined there, and the
    script must have that block (without it, the re-run would launch the job again from
    inside every rank). A closure, a lambda, an interactive session's function or a script
    without the block forks from the launching process, as before."""
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
    if not names:
        return True
    found = script_top_level_names()
    return found is not None and names <= found


def script_top_level_names() -> set[str] | None:
    """The names this process's script binds at its top level, outside its ``__main__``
    guard: what a fork-server (or spawned) rank that re-runs the script will find; None
    where re-running it is not safe (no script, or no guard)."""
    main = sys.modules["__main__"]
    path = getattr(main, "__file__", None)
    if path is None:  # an interactive session: nothing to re-run
        return None
    try:
        tree = ast.parse(Path(path).read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError):
        return None
    names: set[str] = set()
    guarded = False
    for node in tree.body:
        if isinstance(node, ast.If) and is_main_guard(node.test):
            guarded = True
            continue
        for inner in ast.walk(node) if isinstance(node, ast.If | ast.Try) else [node]:
            if isinstance(inner, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(inner.name)
            elif isinstance(inner, ast.Assign | ast.AnnAssign):
                targets = inner.targets if isinstance(inner, ast.Assign) else [inner.target]
                names |= {t.id for t in targets if isinstance(t, ast.Name)}
            elif isinstance(inner, ast.Import | ast.ImportFrom):
                names |= {(a.asname or a.name).split(".")[0] for a in inner.names}
    return names if guarded else None


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
    multiprocessing.set_forkserver_preload(["torch", "tailtrain.runtime.launching.launch"])
    return "forkserver"


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
