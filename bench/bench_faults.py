"""Fault benchmark, side by side: tailtrain, torchft and plain DDP losing a rank (issue 26, item 4).

Every row trains the same task (``digits-cnn``: tailtrain's model, initial weights, shards and
lr; ``faults_peer.py`` builds them with tailtrain's own ``World.build``) on N gloo ranks on
127.0.0.1, with the same injected straggler noise (tailtrain's seeded delay process, slept for
real: ``--delay`` plus ``slowdown:at=0,fraction=1/N,factor=1.5``, one persistent 1.5x
straggler throughout) and the same drills, each fired at the start of worker W's step S
(W in 1..N-1 and S drawn from ``--seed``; W's SIGSTOP lands in its injected sleep of step S):

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
  ``--on-rank-loss`` they say "not available in this tree" and nothing else.

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
  from a checkpoint plays its steps again); ``samples_absent``: mini-batches of the N ranks
  missing from the final history's steps (a dead, stopped or healing rank's shard), counted;
* ``time_to_target``: from the commit of the first step (step 0) to the commit of the step
  whose mean loss over the last 10 steps first reaches ``--target-loss`` (loss: the mean of
  the contributing ranks' batch losses); ``final_loss``: that mean over the last 10 steps.

Goals (issue 26) are booleans in ``goals`` when their rows ran, null with the reason otherwise.

    python bench/bench_faults.py [--quick] [--json] [--rows ROW,...] [--drills kill,...]
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
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
)
SHRINK = {
    "tailtrain-shrink-sync": "sync",
    "tailtrain-shrink-dropcompute": "dropcompute:threshold=auto",
    "tailtrain-shrink-eager": "eager:mode=majority",
}
DRILLS = ("none", "kill", "stop", "freeze", "heal")
#: rows whose kill already brings the rank back (a restart of the group): heal = kill
RESTART_ROWS = ("tailtrain-before", "ddp")
SMOOTH = 10  # steps in the loss's moving mean


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
    strategy = SHRINK.get(row, "sync")
    out = folder / "run"
    argv = [sys.executable, "-m", "tailtrain", "train", "--workers", str(cfg.workers)]
    steps = str(run_steps(cfg, drill))
    argv += ["--task", "digits-cnn", "--strategy", strategy, "--iterations", steps]
    argv += ["--delay", cfg.delay, "--pattern", cfg.pattern, "--seed", str(cfg.seed)]
    argv += ["--eval-every", steps, "--out", str(out), "--json", "--no-progress"]
    if row in SHRINK:
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
    commits = commits_from_starts(stamps)
    steps = read_jsonl([out / "steps.jsonl"]) if (out / "steps.jsonl").exists() else []
    summary = {}
    if (out / "summary.json").exists():
        summary = json.loads((out / "summary.json").read_text())
    history = {
        int(r["step"]): {
            "loss": r.get("loss"),
            "contributors": len(r.get("workers") or []),
        }
        for r in steps
    }
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
        "deadline": summary.get("hang_deadline", summary.get("deadline")),
        "failures": read_jsonl([out / "failures.jsonl"])
        if (out / "failures.jsonl").exists()
        else [],
        "stamps": len(stamps),
    }
    return measure(commits, history, fired, began, status, cfg, folder, "train.out", extra=extra)


def run_peer(
    row: str, drill: str, folder: Path, cfg: argparse.Namespace, fault: dict[str, Any]
) -> dict[str, Any]:
    mode = "ddp" if row == "ddp" else "torchft"
    w, s = fault["worker"], fault["step"]
    steps = str(run_steps(cfg, drill))
    base = [str(PEER), "--mode", mode, "--out", str(folder), "--steps", steps]
    base += ["--workers", str(cfg.workers), "--delay", cfg.delay, "--pattern", cfg.pattern]
    base += ["--seed", str(cfg.seed)]
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
        step: {"loss": float(np.mean(v)), "contributors": len(v)} for step, v in by_step.items()
    }
    if drill in ("kill", "heal", "freeze"):
        marks = [r for r in rows if r.get("event") == "fault"]
        fired = {**marks[0], "kind": drill} if marks else None
    else:
        fired = stop
    name = "torchrun.out" if mode == "ddp" else f"replica{w}.out"
    starts = [r for r in rows if r.get("event") == "start"]
    return measure(
        commits, history, fired, began, status, cfg, folder, name, extra={"starts": starts}
    )


def commits_from_starts(stamps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A tailtrain rank starting update s commits its previous one (same process)."""
    commits = []
    per_pid: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for r in stamps:
        per_pid[r["pid"]].append(r)
    for rows in per_pid.values():
        rows.sort(key=lambda r: r["t"])
        for prev, nxt in itertools.pairwise(rows):
            if nxt["step"] > prev["step"]:
                commits.append({**prev, "t": nxt["t"]})
    return commits


# ---- measures ----------------------------------------------------------------------------------
def measure(
    commits: list[dict[str, Any]],
    history: dict[int, dict[str, Any]],
    fault: dict[str, Any] | None,
    began: float,
    status: Any,
    cfg: argparse.Namespace,
    folder: Path,
    log_name: str,
    extra: dict[str, Any],
) -> dict[str, Any]:
    """The metrics of the module docstring from one run's commits and loss history."""
    result: dict[str, Any] = {"status": status, "wall": round(time.time() - began, 2)}
    if not commits:
        log = folder / log_name
        tail = log.read_text().strip().splitlines()[-3:] if log.exists() else []
        return {**result, "error": "no step committed", "log_tail": tail, **extra}
    initial: dict[int, int] = {}  # each worker's first process
    for c in sorted(commits, key=lambda c: c["t"]):
        initial.setdefault(c["worker"], c["pid"])
    t_first = min(c["t"] for c in commits)
    result["steps"] = len(history)
    result["last_step"] = max(history) if history else None
    seen: dict[tuple[int, int], int] = defaultdict(int)
    for c in commits:
        seen[(c["worker"], c["step"])] += 1
    twice = {k: n - 1 for k, n in seen.items() if n > 1}
    result["steps_replayed"] = len({step for _, step in twice})
    result["samples_replayed"] = sum(twice.values()) * cfg.batch
    absent = sum(max(0, cfg.workers - h["contributors"]) for h in history.values())
    result["samples_absent"] = absent * cfg.batch
    # loss: moving mean over the final history; each step's time: its latest commit
    latest: dict[int, float] = {}
    for c in commits:
        latest[c["step"]] = max(latest.get(c["step"], 0.0), c["t"])
    series = sorted((s, h["loss"]) for s, h in history.items() if h["loss"] is not None)
    losses = np.array([v for _, v in series], dtype=float)
    if len(losses) >= SMOOTH:
        mean = np.convolve(losses, np.ones(SMOOTH) / SMOOTH, mode="valid")
        result["final_loss"] = round(float(mean[-1]), 4)
        hit = np.flatnonzero(mean <= cfg.target_loss)
        result["time_to_target"] = None
        for i in hit:
            step = series[i + SMOOTH - 1][0]
            if step in latest:
                result["time_to_target"] = round(latest[step] - t_first, 3)
                break
    if fault is None or fault.get("t") is None:
        result["fault"] = None if fault is None else fault
        return {**result, **extra}
    tf, w = float(fault["t"]), int(fault["worker"])
    result["fault"] = {k: fault[k] for k in ("kind", "worker", "step") if k in fault}
    before = [c["step"] for c in commits if c["worker"] == w and c["t"] <= tf]
    last_w = max(before) if before else -1
    nxt = [c["t"] for c in commits if c["t"] > tf and c["step"] > last_w]
    result["fault_to_next_step"] = round(min(nxt) - tf, 3) if nxt else None
    restarted = [c for c in commits if c["t"] > tf and c["pid"] != initial.get(c["worker"])]
    if restarted:
        result["restart_seconds"] = round(min(c["t"] for c in restarted) - tf, 3)
    back = [c for c in restarted if c["worker"] == w]
    if fault.get("kind") in ("kill", "heal") and back:
        first = min(back, key=lambda c: c["t"])
        others = [c["step"] for c in commits if c["worker"] != w and c["t"] <= first["t"]]
        result["heal_seconds"] = round(first["t"] - tf, 3)
        result["healed_at_step"] = first["step"]
        result["healed_behind"] = max(0, (max(others) if others else 0) - first["step"])
        moved = {c["worker"] for c in restarted if c["worker"] != w}
        result["heal_from"] = "checkpoint" if moved else "peer"
    return {**result, **extra}


# ---- the benchmark -----------------------------------------------------------------------------
def plan(cfg: argparse.Namespace) -> dict[str, Any]:
    """The seeded fault: worker W (not rank 0, which hosts tailtrain's and DDP's store) and step
    S in [30%, 50%] of the run."""
    rng = np.random.default_rng(cfg.seed)
    worker = int(rng.integers(1, cfg.workers))
    step = int(rng.integers(int(0.3 * cfg.steps), int(0.5 * cfg.steps) + 1))
    return {"worker": worker, "step": step}


def goals(rows: dict[str, dict[str, Any]], cfg: argparse.Namespace) -> dict[str, Any]:
    """Issue 26's goals, each a boolean from this run's rows, or null with why."""
    out: dict[str, Any] = {}
    shrink = rows.get("tailtrain-shrink-sync", {})
    if not shrink or "unavailable" in shrink or "refused" in shrink:
        missing = shrink.get("unavailable", shrink.get("refused", "not selected"))
        why = f"tailtrain-shrink-sync did not run: {missing}"
        for name in (
            "kill_next_step_no_later_than_torchft",
            "kill_next_step_5x_sooner_than_restart",
            "stop_next_step_no_later_than_torchft",
            "stop_next_step_5x_sooner_than_restart",
            "freeze_within_deadline_plus_1s",
            "freeze_sooner_than_torchft_default_and_tuned",
            "heal_no_slower_than_torchft",
            "no_sample_replayed",
            "time_to_target_at_most_0.67x_torchft",
            "time_to_target_within_10pct_of_calm",
        ):
            out[name] = {"holds": None, "why": why}
        return out

    def val(row: str, drill: str, key: str) -> float | None:
        value = rows.get(row, {}).get(drill, {}).get(key)
        return None if value is None else float(value)

    def check(name: str, holds: bool | None, **figures: Any) -> None:
        out[name] = {"holds": holds, **figures}

    ft = ("torchft-default", "torchft-tuned")
    for drill in ("kill", "stop"):
        mine = val("tailtrain-shrink-sync", drill, "fault_to_next_step")
        theirs = [v for v in (val(r, drill, "fault_to_next_step") for r in ft) if v is not None]
        before = val("tailtrain-before", drill, "fault_to_next_step")
        check(
            f"{drill}_next_step_no_later_than_torchft",
            None if mine is None or not theirs else mine <= min(theirs),
            tailtrain=mine,
            torchft_best=min(theirs) if theirs else None,
        )
        check(
            f"{drill}_next_step_5x_sooner_than_restart",
            None if mine is None or before is None else 5 * mine <= before,
            tailtrain=mine,
            before=before,
        )
    mine = val("tailtrain-shrink-sync", "freeze", "fault_to_next_step")
    deadline = rows["tailtrain-shrink-sync"].get("freeze", {}).get("deadline")
    check(
        "freeze_within_deadline_plus_1s",
        None if mine is None or deadline is None else mine <= float(deadline) + 1.0,
        tailtrain=mine,
        deadline=deadline,
        why=None
        if deadline is not None
        else "the run's summary.json gives no learned deadline (read as hang_deadline or deadline)",
    )
    theirs = [val(r, "freeze", "fault_to_next_step") for r in ft]
    check(
        "freeze_sooner_than_torchft_default_and_tuned",
        None
        if mine is None or any(v is None for v in theirs)
        else all(mine < v for v in theirs if v is not None),
        tailtrain=mine,
        torchft=theirs,
    )
    mine = val("tailtrain-shrink-sync", "heal", "heal_seconds")
    theirs = [v for v in (val(r, "heal", "heal_seconds") for r in ft) if v is not None]
    check(
        "heal_no_slower_than_torchft",
        None if mine is None or not theirs else mine <= min(theirs),
        tailtrain=mine,
        torchft_best=min(theirs) if theirs else None,
    )
    replayed = [
        val(r, d, "samples_replayed") for r in SHRINK for d in DRILLS if r in rows and d in rows[r]
    ]
    check(
        "no_sample_replayed",
        None if not replayed or None in replayed else all(v == 0 for v in replayed),
        samples_replayed=replayed,
    )
    ratios, calm = [], []
    for drill in DRILLS:
        mine = val("tailtrain-shrink-sync", drill, "time_to_target")
        theirs = [v for v in (val(r, drill, "time_to_target") for r in ft) if v is not None]
        if mine is not None and theirs:
            ratios.append(round(mine / min(theirs), 3))
        base = val("tailtrain-shrink-sync", "none", "time_to_target")
        if drill != "none" and mine is not None and base:
            calm.append(round(mine / base, 3))
    check(
        "time_to_target_at_most_0.67x_torchft",
        all(r <= 0.67 for r in ratios) if ratios else None,
        ratios=ratios,
    )
    check(
        "time_to_target_within_10pct_of_calm",
        all(r <= 1.10 for r in calm) if calm else None,
        ratios=calm,
        note="without the issue's allowance for the dead rank's absence",
    )
    return out


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
    parser.add_argument("--delay", default="shifted-exp:shift=0.08,scale=0.02")
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
    cfg = parser.parse_args()
    if cfg.tailtrain_src is not None:
        SRC["tailtrain"] = cfg.tailtrain_src.resolve()
    rows = [r for r in cfg.rows.split(",") if r]
    drills = [d for d in cfg.drills.split(",") if d]
    bad = [r for r in rows if r not in ROWS] + [d for d in drills if d not in DRILLS]
    if bad or not 2 <= cfg.workers <= 8:
        parser.error(f"unknown rows/drills {bad} (rows: {ROWS}; drills: {DRILLS}), workers 2-8")
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
        | {"target_loss": cfg.target_loss, "fault": fault, "quick": cfg.quick}
        | {"tailtrain_src": str(SRC["tailtrain"])},
        "load_average_before": [round(x, 2) for x in os.getloadavg()],
    }
    try:
        import torchft  # noqa: F401

        torchft_error = None
    except ImportError as exc:
        torchft_error = f"{type(exc).__name__}: {exc}"
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="faults-") as scratch:
        top = cfg.out or Path(scratch)
        shrink_ok = any(r in SHRINK for r in rows) and has_flag("--on-rank-loss", Path(scratch))
        for row in rows:
            if row in SHRINK and not shrink_ok:
                results[row] = {
                    "unavailable": "not available in this tree: `tailtrain train --help` "
                    "has no --on-rank-loss"
                }
                continue
            if row.startswith("torchft") and torchft_error:
                results[row] = {"unavailable": torchft_error}
                continue
            results[row] = {}
            for drill in drills:
                if drill == "heal" and row in RESTART_ROWS and "kill" in drills:
                    results[row][drill] = {"same_run_as": "kill"}
                    continue
                folder = top / row / drill
                folder.mkdir(parents=True, exist_ok=True)
                runner = run_peer if row in ("ddp", "torchft-default", "torchft-tuned") else None
                runner = runner or run_tailtrain
                results[row][drill] = runner(row, drill, folder, cfg, fault)
                tail = results[row][drill].get("log_tail") or [""]
                if results[row][drill]["status"] == 2 and "error:" in tail[-1]:
                    # refused before any process started (a usage error): so is every drill
                    results[row] = {"refused": tail[-1]}
                    break
                if not cfg.json:
                    print(row, drill, json.dumps(results[row][drill]), flush=True)
            if "same_run_as" in results[row].get("heal", {}):
                results[row]["heal"] = {"same_run_as": "kill", **results[row]["kill"]}
    report["rows"] = results
    report["goals"] = goals(results, cfg)
    report["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(report, indent=2, default=str))


if __name__ == "__main__":
    main()
