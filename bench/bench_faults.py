"""Fault benchmark, side by side: tailtrain, torchft and plain DDP losing a rank (issue 26, item 4).

Every row trains the same task (``digits-cnn``: tailtrain's model, initial weights, shards and
lr; ``faults_peer.py`` builds them with tailtrain's own ``World.build``) on N gloo ranks on
127.0.0.1, with the same injected straggler noise (tailtrain's seeded delay process, slept for
real: ``--delay`` plus ``slowdown:at=0,fraction=1/N,factor=1.5``, one persistent 1.5x
straggler throughout, worker 2 of 4) and the same drills, each fired at the start of worker
W's step S (W in 1..N-1 and S drawn from ``--seed``; W's SIGSTOP lands in its injected sleep
of step S).

The same work a step in every row: each rank computes ``--micro-batches`` M (8) micro-batches
of the task's 32 samples, one forward and backward each, and the step's update is the mean
gradient of all of them (tailtrain's ``sync``; DDP's and torchft's allreduce on the last
micro-batch, ``no_sync`` before it). ``--delay`` is one micro-batch's injected seconds (default
``shifted-exp`` with shift 0.08/M and scale 0.02/M: a step sleeps 0.08 s plus the noise,
whatever M), drawn from the same seeded process in every row and slept one micro-batch at a
time, between the micro-batches (tailtrain's ``Injector``, one delay iteration of M units a
step, as ``sync`` draws them): a tailtrain rank sleeps each draw after its micro-batch, a peer
too, but for the last draw, which it sleeps before its last micro-batch (whose backward
starts the allreduce; a tailtrain rank's allreduce also follows its last sleep). Before, a
peer slept its M draws before it computed, so its straggler's compute ran while the others
sat in the allreduce, alone on the CPU; interleaved, it shares the CPU with the other ranks' as
a tailtrain straggler's does (calm, to step 99: torchft-tuned 0.178 s a step before, 0.183 s
after, medians of 3 runs interleaved with the old peer's at load 1.3-2.6). Except
``tailtrain-shrink-eager``: eager-SGD's job (the partial topology's) is one mini-batch of 32
samples whatever M, which sleeps the sum of its M draws (the same law a step), so its ranks
compute 1/M of the others' samples a step and its ``per_rank`` (no ``micro_batches`` in its
rows) and ``skipped`` count one mini-batch a rank; its time to target is not the same work's.
Rebalance's ranks compute their shares m_n of the N M micro-batches (sum m_n = N M, or L M
for the L live ranks after a shrink), each share's draws from the same rank's law; DropCompute
cuts the micro-batches its threshold passes (counted as ``samples_dropped_by_rule``). The
drills:

* ``none``: no fault (the reference for the drills' cost);
* ``kill``: SIGKILL of W; ``heal``: the same, and W comes back (its run ``--heal-extra``
  steps longer, so that W is back before the end);
* ``stop``: SIGSTOP of W for ``--hold`` seconds (sent by this script), then SIGCONT;
* ``freeze``: W's training thread sleeps ``--hold`` seconds, its process stays alive
  (tailtrain's ``--inject-fault freeze:``; the same in ``faults_peer.py``).

Rows:

* ``tailtrain-before``: ``tailtrain train --strategy sync --max-restarts 1``, today's path
  (census, checkpoint of the last completed round, exit, restart, resume from it); a kill's
  restart brings W back, so its ``heal`` is its ``kill`` run (not run twice);
* ``torchft-default`` / ``torchft-tuned``: torchft's ``Manager`` + ``DistributedDataParallel``
  on its ``ProcessGroupGloo``, one ``torchrun --nproc-per-node 1`` per replica, its lighthouse
  (``torchft_lighthouse``) on 127.0.0.1, ``min_replica_size=1``; default timeouts (60 s;
  the lighthouse's heartbeat 5 s), or ``--tuned`` seconds (2) for the manager's collectives,
  its process group and the lighthouse's join and heartbeat timeouts, and 3x that for the
  manager's quorum call (at 1x, a frozen replica made every replica die of the quorum call's
  "Timeout expired" while the lighthouse still waited for it to join);
  ``kill``: W's torchrun has no restart; ``heal``: ``--max-restarts 1``, W rejoins and heals
  from a live peer;
* ``ddp``: plain ``DistributedDataParallel`` under ``torchrun --max-restarts 1``, a checkpoint
  every 20 steps; ``heal`` is its ``kill`` run;
* ``tailtrain-shrink-{sync,dropcompute,eager}``: ``tailtrain train --on-rank-loss shrink`` with
  ``sync``, ``dropcompute:threshold=auto`` and ``eager:mode=majority`` (``heal``: with
  ``--restart-lost 1``, W started again and rejoining); when ``train --help`` has no
  ``--on-rank-loss`` they say "not available in this tree" and nothing else;
* ``tailtrain-shrink-rebalance``, ``tailtrain-shrink-rebalance-dropcompute``: the same with
  ``rebalance`` (the persistent straggler's remedy: per-rank shares of the global batch
  proportional to the measured speeds, dealt again over the live ranks on a shrink) and
  ``rebalance:then=dropcompute`` (DropCompute's ``threshold=auto`` on top, for the noise);
  they need M >= 2 (shares of one micro-batch cannot move).

Measured, every instant a process's own ``time.time()``: the peers log each step's start and
end; tailtrain's ranks are stamped as they start each update (``faults_stamp/
sitecustomize.py``); a kill or freeze is stamped by the drilled process just before it fires, a
SIGSTOP by this script as it sends it. A rank starting update s (tailtrain) or ending step s
committed (peers) commits s, resp. s-1. Per row and drill:

* ``fault_to_next_step``: from the fault to the first commit, by any rank, of a step after
  the last one W committed before the fault (a restart's replayed steps do not count);
* ``restart_seconds`` (restart paths): from the fault to the first commit of a restarted
  process, whatever its step;
* ``heal_seconds``: from the kill to W's first commit in its new process; ``heal_from``:
  ``peer`` when no other rank restarted, else ``checkpoint``; ``healed_behind``: steps the
  others had committed beyond W's first one (0: W joined at the head);
* ``steps_replayed`` / ``samples_replayed``: (worker, step) commits made twice (a restart
  from a checkpoint plays its steps again; a step in flight at the fault, computed again by
  the others, is committed once and not counted); ``samples_absent``: samples of the N ranks'
  shards missing from the final history's steps because of the fault (a shrinking run: the
  ranks not ``live``; otherwise those not contributing); ``samples_counted_skipped``: those
  the record counts (``skipped``; peers count none); ``steps_lost``: steps missing from the
  final history; ``samples_lost``: absent and not counted, plus the missing steps' samples;
  ``samples_dropped_by_rule``: the micro-batches a threshold cut (dealt less ``completed``),
  counted by the record and weighed by DropCompute's Eq. 1, so not lost;
* ``time_to_target``: from the commit of the first step (step 0) to the commit of the step
  (``target_step``) whose mean loss over the last 10 steps first reaches ``--target-loss``
  (loss: the mean of the contributing ranks' batch losses); ``absence_steps_to_target``: the
  ranks absent up to it, in steps of the whole world; ``final_loss``: the last 10 steps' mean;
* ``hang_deadline_s`` (shrink rows): the learned hang deadline, as the run's ``summary.json``
  records it (its ``hang_deadline``) (null where this tree's ``train`` does not record it);
* ``load_1min_at_start``: the machine's 1-minute load average as the run started.

The rows run drill by drill, interleaved. A row that cannot run (not in this tree, torchft not
installed, or refused at start: a rule that cannot shrink) is one entry with its reason, and
every goal that needs it says so.

Goals (issue 26's "Done when"), in ``goals``, each computed from this run's rows with its
figures (``by_row``) and its ``rule``; null with ``why`` when a row or figure is missing.
"tailtrain" is each shrink row that ran: the latency and accounting goals must hold for every
one; the time-to-target goals for one of them on every drill (the straggler-tolerant rule is
the one meant). The calm allowance is 1.10 times the row's own ``none`` time to target plus
``absence_steps_to_target`` times that run's seconds per step to target.

    python bench/bench_faults.py [--quick] [--json] [--rows ROW,...] [--drills kill,...]
    python bench/bench_faults.py --goals-from REPORT.json  # score a saved report again

One full run of the first 7 rows (5 drills: 23 runs, a refused row one line), one
micro-batch a step, took 17.2 min on this 2-core machine at load averages 1.3 to 5 (25.5 min
at 10 to 22); ``--quick`` (60 steps, 4 s holds) is a smoke test, and ``--rows``/``--drills``
pick a part.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench import faults_goals as fg  # noqa: E402
from bench import faults_measure as fm  # noqa: E402

PEER = ROOT / "bench" / "faults_peer.py"
STAMP = ROOT / "bench" / "faults_stamp"
BIN = Path(sys.executable).parent
ROWS = (
    "tailtrain-before",
    "torchft-default",
    "torchft-tuned",
    "ddp",
    "tailtrain-shrink-sync",
    "tailtrain-shrink-dropcompute",
    "tailtrain-shrink-eager",
    "tailtrain-shrink-rebalance",
    "tailtrain-shrink-rebalance-dropcompute",
)
#: rows whose rule deals micro-batch shares: with one micro-batch a rank they cannot move
SHARES_ROWS = ("tailtrain-shrink-rebalance", "tailtrain-shrink-rebalance-dropcompute")
DRILLS = ("none", "kill", "stop", "freeze", "heal")
#: rows whose kill already brings the rank back (a restart of the group): heal = kill
RESTART_ROWS = ("tailtrain-before", "ddp")
#: micro-batches a rank computes per step, every row alike (``--micro-batches``)
MICRO_BATCHES = 8
#: a step's injected seconds: the shift, and the mean of its exponential noise (default law)
STEP_SHIFT, STEP_SCALE = 0.08, 0.02


# ---- processes ---------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


#: the tree whose tailtrain the tailtrain rows run (``--tailtrain-src``; default this one's)
SRC = {"tailtrain": ROOT / "src"}


def env(stamps: Path | None = None) -> dict[str, str]:
    paths = [str(SRC["tailtrain"] if stamps is not None else ROOT / "src"), str(ROOT)]
    out = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    if stamps is not None:
        paths.insert(0, str(STAMP))
        out["TAILTRAIN_FAULTS_STAMPS"] = str(stamps)
    out["PYTHONPATH"] = os.pathsep.join(paths)
    return out


class Group:
    """The processes of one run, each in its own session: all of them (and their children)
    are continued and killed in :meth:`close`, whatever happened."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.procs: list[subprocess.Popen] = []

    def start(self, argv: list[str], name: str, environ: dict[str, str]) -> subprocess.Popen:
        log = (self.folder / f"{name}.out").open("w")
        proc = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, env=environ, start_new_session=True
        )
        self.procs.append(proc)
        return proc

    def wait(self, procs: list[subprocess.Popen], deadline: float) -> bool:
        """Whether ``procs`` all ended before ``deadline`` (monotonic)."""
        for proc in procs:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                return False
        return True

    def close(self) -> None:
        for proc in self.procs:
            for sig in (signal.SIGCONT, signal.SIGKILL):  # a stopped child is woken to die
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
        self.procs.clear()


def read_jsonl(paths: list[Path]) -> list[dict[str, Any]]:
    rows = []
    for path in paths:
        for line in path.read_text().splitlines():
            try:
                rows.append(json.loads(line))
            except ValueError:  # a line torn by a kill
                continue
    return rows


def stopper(
    folder: Path,
    pattern: str,
    worker: int,
    step: int,
    hold: float,
    deadline: float,
    procs: list[subprocess.Popen],
) -> dict[str, Any] | None:
    """SIGSTOP worker ``worker`` as it starts step ``step`` (its log or stamps say it), hold
    ``hold`` s, SIGCONT. The fault as this script sent it, or None if the step never came
    (the run ended, or was refused, first)."""
    while time.monotonic() < deadline and any(p.poll() is None for p in procs):
        for path in folder.glob(pattern.format(worker=worker)):
            for row in read_jsonl([path]):
                # peers log a step's end: ending step-1, W is in step's injected sleep;
                # tailtrain's stamps mark a step's start, before its sleep
                reached = row.get("step", -1) + (1 if "t0" in row else 0)
                if row.get("event") is None and reached >= step:
                    pid = int(row["pid"]) if "pid" in row else int(path.stem.split("-")[-1])
                    os.kill(pid, signal.SIGSTOP)
                    t = time.time()
                    time.sleep(hold)
                    os.kill(pid, signal.SIGCONT)
                    return {"kind": "stop", "worker": worker, "step": reached, "t": t, "pid": pid}
        time.sleep(0.01)
    return None


# ---- runs --------------------------------------------------------------------------------------
def run_steps(cfg: argparse.Namespace, drill: str) -> int:
    """A heal run goes on ``--heal-extra`` steps longer: a restarted process takes 15-20 s to
    import and rejoin on a loaded 2-core machine, and at 150 steps torchft's returning replica
    sometimes found the run over (measured: healed at step 147, or not at all)."""
    return cfg.steps + (cfg.heal_extra if drill == "heal" else 0)


def has_flag(flag: str, scratch: Path) -> bool:
    """Whether the tailtrain rows' ``train --help`` lists ``flag``."""
    done = subprocess.run(
        [sys.executable, "-m", "tailtrain", "train", "--help"],
        capture_output=True,
        text=True,
        timeout=180,
        env=env(stamps=scratch),
    )
    return flag in done.stdout


def run_tailtrain(
    row: str, drill: str, folder: Path, cfg: argparse.Namespace, fault: dict[str, Any]
) -> dict[str, Any]:
    strategy = fg.SHRINK.get(row, "sync")
    out = folder / "run"
    argv = [sys.executable, "-m", "tailtrain", "train", "--workers", str(cfg.workers)]
    steps = str(run_steps(cfg, drill))
    argv += ["--task", "digits-cnn", "--strategy", strategy, "--iterations", steps]
    argv += ["--delay", cfg.delay, "--pattern", cfg.pattern, "--seed", str(cfg.seed)]
    argv += ["--eval-every", steps, "--out", str(out), "--json", "--no-progress"]
    if cfg.micro_batches > 1:  # --delay is then per micro-batch, as in the peers
        argv += ["--micro-batches", str(cfg.micro_batches)]
    if row in fg.SHRINK:
        argv += ["--on-rank-loss", "shrink"]
    w, s = fault["worker"], fault["step"]
    if drill in ("kill", "heal"):
        argv += ["--inject-fault", f"kill:worker={w},step={s}"]
    if drill == "freeze":
        argv += ["--inject-fault", f"freeze:worker={w},step={s},seconds={cfg.hold:g}"]
    if row == "tailtrain-before":
        argv += ["--max-restarts", "1"]
    elif drill == "heal":  # shrink: the launcher starts the killed rank again, it rejoins
        argv += ["--restart-lost", "1"]
    group = Group(folder)
    deadline = time.monotonic() + cfg.run_timeout
    began = time.time()
    stop = None
    try:
        proc = group.start(argv, "train", env(stamps=folder))
        if drill == "stop":
            stop = stopper(folder, "stamps-w{worker}-*.jsonl", w, s, cfg.hold, deadline, [proc])
        ended = group.wait([proc], deadline)
        status = proc.returncode if ended else "timed out"
    finally:
        group.close()
    stamps = []
    for path in sorted(folder.glob("stamps-w*-*.jsonl")):
        pid = int(path.stem.split("-")[-1])
        stamps += [{**r, "pid": pid} for r in read_jsonl([path])]
    commits = fm.commits_from_starts(stamps)
    steps = read_jsonl([out / "steps.jsonl"]) if (out / "steps.jsonl").exists() else []
    summary = {}
    if (out / "summary.json").exists():
        summary = json.loads((out / "summary.json").read_text())
    history = {int(r["step"]): tailtrain_step(r, cfg) for r in steps}
    if drill in ("kill", "heal", "freeze"):
        mine = [c for c in stamps if c["worker"] == w and c["step"] >= s]
        first = min(mine, key=lambda c: c["t"]) if mine else None
        fired = {"kind": drill, "worker": w, "step": s, "t": first["t"] if first else None}
    else:
        fired = stop
    live = [(int(r["step"]), len(r["live"])) for r in steps if r.get("live") is not None]
    extra = {
        # under --on-rank-loss shrink: [step, live ranks] where the count changes
        "live_ranks": [[st, n] for i, (st, n) in enumerate(live) if i == 0 or n != live[i - 1][1]]
        or None,
        "dead": sorted({int(d) for r in steps for d in r.get("dead") or []})
        or summary.get("dead_workers"),
        "rejoined": sorted({int(d) for r in steps for d in r.get("rejoined") or []})
        or summary.get("rejoins"),
        "skipped_recorded": sum(int(r.get("skipped") or 0) for r in steps) or None,
        "hung": summary.get("hung_workers"),
        # the learned hang deadline of the shrink protocol, as the run's summary records it
        "hang_deadline_s": summary.get("hang_deadline"),
        "deadlines_logged_s": logged_deadlines(folder / "train.out"),
        "failures": read_jsonl([out / "failures.jsonl"])
        if (out / "failures.jsonl").exists()
        else [],
        "stamps": len(stamps),
    }
    return fm.measure(commits, history, fired, began, status, cfg, folder, "train.out", extra=extra)


def logged_deadlines(log: Path) -> list[float] | None:
    """The deadlines the ranks' warnings name as they give up on a collective ("no answer
    within the deadline 2.68s"): shown beside the goals, never scored (the goal reads
    summary.json's ``hang_deadline``; a log line's wording may change)."""
    if not log.exists():
        return None
    found = re.findall(r"within the deadline ([0-9.]+)s", log.read_text(errors="replace"))
    return [float(x) for x in found] or None


def tailtrain_step(row: dict[str, Any], cfg: argparse.Namespace) -> dict[str, Any]:
    """One ``steps.jsonl`` row as :func:`measure` reads it. Ranks absent because of the fault
    are the original ranks missing from ``live`` (a shrinking run), else from ``workers`` (a
    rule's own choice of contributors is not a fault's absence); ``skipped`` counts the samples
    the record says the missing shards did not contribute; ``dropped``, the samples the rule
    itself cut (DropCompute's threshold: the units dealt, ``shares`` or M a rank, less the
    record's ``completed``), counted by the record, never lost."""
    contributors = len(row.get("workers") or [])
    live = row.get("live")
    units = int(row.get("micro_batches") or 1) * int(row.get("local_steps") or 1)
    completed = [int(c) for c in row.get("completed") or []]
    dealt = sum(int(n) for n in row["shares"]) if row.get("shares") else units * len(completed)
    return {
        "loss": row.get("loss"),
        "contributors": contributors,
        "absent": cfg.workers - (len(live) if live is not None else contributors),
        "per_rank": units * cfg.batch,
        "counted": int(row.get("skipped") or 0),
        "dropped": max(0, dealt - sum(completed)) * cfg.batch,
    }


def run_peer(
    row: str, drill: str, folder: Path, cfg: argparse.Namespace, fault: dict[str, Any]
) -> dict[str, Any]:
    mode = "ddp" if row == "ddp" else "torchft"
    w, s = fault["worker"], fault["step"]
    steps = str(run_steps(cfg, drill))
    base = [str(PEER), "--mode", mode, "--out", str(folder), "--steps", steps]
    base += ["--workers", str(cfg.workers), "--delay", cfg.delay, "--pattern", cfg.pattern]
    base += ["--seed", str(cfg.seed), "--micro-batches", str(cfg.micro_batches)]
    if drill in ("kill", "heal"):
        base += ["--drill", f"kill:worker={w},step={s}"]
    if drill == "freeze":
        base += ["--drill", f"freeze:worker={w},step={s},seconds={cfg.hold:g}"]
    torchrun = [str(BIN / "torchrun"), "--nnodes", "1", "--monitor-interval", "0.1"]
    group = Group(folder)
    deadline = time.monotonic() + cfg.run_timeout
    began = time.time()
    stop = None
    try:
        if mode == "ddp":
            argv = [*torchrun, "--nproc-per-node", str(cfg.workers), "--max-restarts", "1"]
            argv += ["--master-addr", "127.0.0.1", "--master-port", str(free_port())]
            argv += [*base, "--checkpoint-every", "20"]
            procs = [group.start(argv, "torchrun", env())]
        else:
            tuned = row == "torchft-tuned"
            port = free_port()
            house = [str(BIN / "torchft_lighthouse"), "--min_replicas", "1"]
            house += ["--bind", f"127.0.0.1:{port}"]
            if tuned:
                ms = str(int(cfg.tuned * 1000))
                house += ["--join_timeout_ms", ms, "--heartbeat_timeout_ms", ms]
            group.start(house, "lighthouse", env())
            environ = {**env(), "TORCHFT_LIGHTHOUSE": f"http://127.0.0.1:{port}"}
            procs = []
            for replica in range(cfg.workers):
                restarts = "1" if drill == "heal" else "0"
                argv = [*torchrun, "--nproc-per-node", "1", "--max-restarts", restarts]
                argv += ["--master-addr", "127.0.0.1", "--master-port", str(free_port())]
                argv += [*base, "--replica", str(replica)]
                if tuned:
                    argv += ["--timeout", f"{cfg.tuned:g}"]
                procs.append(group.start(argv, f"replica{replica}", environ))
        if drill == "stop":
            stop = stopper(folder, "log-w{worker}-*.jsonl", w, s, cfg.hold, deadline, procs)
        ended = group.wait(procs, deadline)
        status: Any = [p.returncode for p in procs] if ended else "timed out"
    finally:
        group.close()
    rows = read_jsonl(sorted(folder.glob("log-w*-*.jsonl")))
    commits = [
        {"worker": r["worker"], "pid": r["pid"], "step": r["step"], "t": r["t"]}
        for r in rows
        if r.get("committed") and r.get("part", True) and "t0" in r
    ]
    last: dict[tuple[int, int], dict[str, Any]] = {}
    for r in sorted((r for r in rows if r.get("committed") and "t0" in r), key=lambda r: r["t"]):
        if r.get("part", True):
            last[(r["worker"], r["step"])] = r
    by_step: dict[int, list[float]] = defaultdict(list)
    for (_, step), r in last.items():
        by_step[step].append(r["loss"])
    history = {
        step: {"loss": float(np.mean(v)), "contributors": len(v), "per_rank": fm.unit_samples(cfg)}
        for step, v in by_step.items()
    }
    if drill in ("kill", "heal", "freeze"):
        marks = [r for r in rows if r.get("event") == "fault"]
        fired = {**marks[0], "kind": drill} if marks else None
    else:
        fired = stop
    name = "torchrun.out" if mode == "ddp" else f"replica{w}.out"
    starts = [r for r in rows if r.get("event") == "start"]
    return fm.measure(
        commits, history, fired, began, status, cfg, folder, name, extra={"starts": starts}
    )


# ---- the benchmark -----------------------------------------------------------------------------
def plan(cfg: argparse.Namespace) -> dict[str, Any]:
    """The seeded fault: worker W (not rank 0, which hosts tailtrain's and DDP's store) and step
    S in [30%, 50%] of the run."""
    rng = np.random.default_rng(cfg.seed)
    worker = int(rng.integers(1, cfg.workers))
    step = int(rng.integers(int(0.3 * cfg.steps), int(0.5 * cfg.steps) + 1))
    return {"worker": worker, "step": step}


def run_all(
    rows: list[str],
    drills: list[str],
    cfg: argparse.Namespace,
    fault: dict[str, Any],
    top: Path,
    torchft_error: str | None,
) -> dict[str, dict[str, Any]]:
    """Every selected row through every selected drill, drill by drill with the rows
    interleaved (load that drifts during the run then weighs on every row alike). A row that
    cannot run says why once: not available here, or refused at start (its one line)."""
    results: dict[str, dict[str, Any]] = {}
    shrink_ok = any(r in fg.SHRINK for r in rows) and has_flag("--on-rank-loss", top)
    for row in rows:
        results[row] = {}
        if row in fg.SHRINK and not shrink_ok:
            results[row] = {
                "unavailable": "not available in this tree: `tailtrain train --help` "
                "has no --on-rank-loss"
            }
        elif row.startswith("torchft") and torchft_error:
            results[row] = {"unavailable": torchft_error}
    for drill in drills:
        for row in rows:
            if fg.blocked(results[row]) is not None:
                continue
            if drill == "heal" and row in RESTART_ROWS and "kill" in drills:
                continue  # its kill's restart is its heal: copied below
            folder = top / row / drill
            folder.mkdir(parents=True, exist_ok=True)
            runner = run_peer if row in ("ddp", *fg.TORCHFT) else run_tailtrain
            load = round(os.getloadavg()[0], 2)
            cell = {**runner(row, drill, folder, cfg, fault), "load_1min_at_start": load}
            tail = cell.get("log_tail") or [""]
            if cell["status"] == 2 and "error:" in tail[-1]:
                # refused before any process started (a usage error): so is every drill
                results[row] = {"refused": tail[-1]}
            else:
                results[row][drill] = cell
            short = {k: cell.get(k) for k in ("status", "wall", "fault_to_next_step")}
            print(row, drill, json.dumps(short), file=sys.stderr, flush=True)
    for row in RESTART_ROWS:
        if "kill" in results.get(row, {}) and "heal" in drills:
            results[row]["heal"] = {"same_run_as": "kill", **results[row]["kill"]}
    return results


def default_delay(micro_batches: int) -> str:
    """One micro-batch's injected seconds: a step of M of them sleeps ``STEP_SHIFT`` plus
    the sum of M exponentials of mean ``STEP_SCALE`` / M (the same law in every row)."""
    m = micro_batches
    return f"shifted-exp:shift={STEP_SHIFT / m:.6g},scale={STEP_SCALE / m:.6g}"


def bad_arguments(rows: list[str], drills: list[str], cfg: argparse.Namespace) -> str | None:
    """One line saying what is wrong with the selection, or None."""
    bad = [r for r in rows if r not in ROWS] + [d for d in drills if d not in DRILLS]
    if bad:
        return f"unknown rows/drills {bad} (rows: {', '.join(ROWS)}; drills: {', '.join(DRILLS)})"
    if not 2 <= cfg.workers <= 8:
        return f"--workers {cfg.workers}: use 2 to 8 ranks"
    if cfg.micro_batches < 1:
        return f"--micro-batches {cfg.micro_batches}: use 1 or more"
    shares = [r for r in rows if r in SHARES_ROWS]
    if shares and cfg.micro_batches < 2:
        return (
            f"{', '.join(shares)} deal micro-batch shares, which one micro-batch a rank "
            "cannot move: use --micro-batches 2 or more, or leave the rows out"
        )
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps, shorter holds")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--rows", default=",".join(ROWS))
    parser.add_argument("--drills", default=",".join(DRILLS))
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--steps", type=int, default=None, help="default 150 (quick: 60)")
    parser.add_argument("--hold", type=float, default=None, help="stop/freeze s (10; quick 4)")
    parser.add_argument("--heal-extra", type=int, default=None, help="heal: steps more (150)")
    parser.add_argument("--tuned", type=float, default=2.0, help="torchft's tuned timeout, s")
    parser.add_argument(
        "--micro-batches",
        type=int,
        default=MICRO_BATCHES,
        metavar="M",
        help=f"micro-batches a rank computes per step, in every row ({MICRO_BATCHES}); "
        "--delay is then per micro-batch",
    )
    parser.add_argument(
        "--delay",
        default=None,
        help="the injected seconds of one micro-batch (default: shifted-exp with shift "
        f"{STEP_SHIFT:g}/M and scale {STEP_SCALE:g}/M, so a step sleeps {STEP_SHIFT:g} s plus "
        "noise whatever M)",
    )
    parser.add_argument("--target-loss", type=float, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--run-timeout", type=float, default=None, help="seconds per run")
    parser.add_argument("--out", type=Path, default=None, help="keep the run folders here")
    parser.add_argument(
        "--tailtrain-src",
        type=Path,
        default=None,
        help="the tailtrain rows import tailtrain from this src folder (another branch's, "
        "e.g. to try the shrink rows before it is merged); default: this tree's",
    )
    parser.add_argument(
        "--goals-from",
        type=Path,
        default=None,
        help="score the goals again from a report this script printed (no run)",
    )
    cfg = parser.parse_args()
    if cfg.goals_from is not None:
        report = json.loads(cfg.goals_from.read_text())
        report["goals"] = fg.goals(report["rows"], cfg)
        print(json.dumps(report, indent=2, default=str))
        return
    if cfg.tailtrain_src is not None:
        SRC["tailtrain"] = cfg.tailtrain_src.resolve()
    rows = [r for r in cfg.rows.split(",") if r]
    drills = [d for d in cfg.drills.split(",") if d]
    wrong = bad_arguments(rows, drills, cfg)
    if wrong:
        parser.error(wrong)
    cfg.delay = cfg.delay or default_delay(cfg.micro_batches)
    cfg.steps = cfg.steps or (60 if cfg.quick else 150)
    cfg.heal_extra = cfg.heal_extra if cfg.heal_extra is not None else (60 if cfg.quick else 150)
    cfg.hold = cfg.hold if cfg.hold is not None else (4.0 if cfg.quick else 10.0)
    cfg.run_timeout = cfg.run_timeout or (150.0 if cfg.quick else 300.0)
    cfg.target_loss = cfg.target_loss or (2.2 if cfg.quick else 0.8)
    cfg.pattern = f"slowdown:at=0,fraction={1 / cfg.workers:g},factor=1.5"
    cfg.batch = 32  # digits-cnn's mini-batch per rank
    fault = plan(cfg)
    report: dict[str, Any] = {
        "config": {
            k: getattr(cfg, k)
            for k in ("workers", "steps", "heal_extra", "hold", "tuned", "delay", "pattern", "seed")
        }
        | {"micro_batches": cfg.micro_batches}
        | {"target_loss": cfg.target_loss, "fault": fault, "quick": cfg.quick}
        | {"tailtrain_src": str(SRC["tailtrain"])},
        "load_average_before": [round(x, 2) for x in os.getloadavg()],
    }
    try:
        import torchft  # noqa: F401

        torchft_error = None
    except ImportError as exc:
        torchft_error = f"{type(exc).__name__}: {exc}"
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="faults-") as scratch:
        results = run_all(rows, drills, cfg, fault, cfg.out or Path(scratch), torchft_error)
    report["wall_s"] = round(time.monotonic() - began, 1)
    report["rows"] = results
    report["shrink_rows"] = {r: fg.blocked(results.get(r)) or "ran" for r in fg.SHRINK}
    report["goals"] = fg.goals(results, cfg)
    report["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    if cfg.json:
        print(json.dumps(report, indent=2, default=str))
        return
    for name, goal in report["goals"].items():
        print(f"{name}: {goal['holds']}", goal.get("why", ""))
    print(
        f"wall {report['wall_s']} s; load {report['load_average_before']} -> "
        f"{report['load_average_after']}; --json for every figure"
    )


if __name__ == "__main__":
    main()
