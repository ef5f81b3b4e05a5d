"""Fault benchmark across nodes, side by side: tailtrain, torchft and torchrun losing a node
(issue 37, item 7). A sibling of ``bench_faults.py``: its processes and logs, its measures and
accounting (``faults_measure.py``: ``measure``, ``accounting``) and its goal helpers
(``faults_goals.py``) are imported, not copied. This bench's own accounting and goals are
``faults_nodes_accounting.py`` and ``faults_nodes_goals.py``; its nodes, rows and drills, which
they share, ``faults_nodes_setting.py``.

**Setting.** 3 nodes x 2 ranks on this machine, each node one launcher in a session of its own
(a node is its launcher's whole process tree: torchrun starts its workers in sessions of their
own, so a drill signals every process of the tree at once, :func:`signal_tree`), gloo,
``digits-cnn`` (tailtrain's model, initial weights, shards and lr from ``World.build``, worker
= the job's rank), the injected noise of ``bench_faults.py`` (its ``default_delay``: a step
sleeps 0.08 s plus exponential noise, one draw per micro-batch, M = ``--micro-batches`` a rank,
drawn from tailtrain's seeded ``Injector``). Addresses: the store, the lighthouse and
torchrun's c10d rendezvous on 127.0.0.1; torchrun's nodes ``--local-addr`` 127.0.0.2-4,
torchft's replica groups' stores on 127.0.0.2-4; ``tailtrain launch`` has no option for its
node's own address (its ranks' gloo binds the host name's address, 127.0.0.1 here:
``bind_note`` in the JSON).

**Drills**, on node W (1 or 2, drawn from ``--seed``; never node 0, which hosts torchrun's
rendezvous store) as a rank of W reaches step S (30-50% of the run), sent by this script to
the node's whole process tree:

* ``kill``: SIGKILL; ``heal``: the same, then the node's launcher is started again
  ``--heal-delay`` s after the kill (5: a quick reboot), its run ``--heal-extra`` steps longer
  (quick 300, else 400: a node that starts again takes 20-35 s to import and rejoin at load
  10-14, and a run whose survivors ended first heals nothing, ``heal_void``);
* ``stop``: SIGSTOP for ``--hold`` s (10; quick 4), then SIGCONT;
* ``slow``: no fault; node W's two ranks sleep ``--slow-factor`` (1.5) times their draws
  throughout.

**Rows**: ``tailtrain-sync`` / ``tailtrain-deal-demand`` (``rebalance:deal=demand``: each
step's 48 micro-batches of the job's stream dealt to whichever rank asks next, the survivors
computing a lost node's part) / ``tailtrain-rebalance``: ``bench/faults_nodes_rank.py`` under
``tailtrain launch --nnodes 3 --node-rank I --nproc-per-node 2 --rdzv-endpoint 127.0.0.1:P
--store apart --on-rank-loss shrink --restart-lost 1`` (the store in ``tailtrain store``);
``StragglerStep`` refuses ``rebalance`` by shares under shrink at start (a redone round would
need another draw; the row then says its one line); ``torchft-default`` / ``torchft-tuned``:
``faults_peer.py --group-size 2``, one ``torchrun --nproc-per-node 2`` per node as one replica
group (torchft 0.2.0's ``Manager`` on its ``ProcessGroupGloo``, its lighthouse), default
timeouts or ``--tuned`` s; ``torchrun``: ``faults_peer.py --mode ddp`` under ``torchrun
--nnodes 3 --nproc-per-node 2 --rdzv-backend c10d --max-restarts 1``, a checkpoint every 20
steps (its fixed 3-node rendezvous waits for a lost node: a run whose ranks log nothing for
``--stall`` s after the fault, the hold's end or the node's restart is ended and says so;
``--attempts joins`` keys each attempt's gloo mesh by the rank's joins, since a node's torchrun
started again counts its restarts from 0; in every heal measured here (restarted 0.1, 5
and 20 s after the kill) torch 2.13's c10d rendezvous never formed again: the survivors'
agents timed out on its ``role_info`` keys, the new one on ``MASTER_ADDR``).
Every row runs drill by drill, the rows interleaved, so a load that drifts weighs on each
alike. ``--repeats heal=3,slow=3`` runs those drills three times each, repeat by repeat with
the rows interleaved, and keeps each row's median run with every run's figure beside it
(``repeats``): on 2 cores one run of a heal moves by 1-2 s with the load, as much as the
rows differ, so a goal read off one run of each row is a coin flip between equals.

**Measured** (``faults_measure.measure`` on every rank's own log): ``fault_to_next_step``,
``heal_seconds`` / ``heal_from``, ``samples_replayed`` / ``samples_lost`` /
``samples_absent``, ``time_to_target`` (the 10-step mean loss first at ``--target-loss``),
``final_loss``; and here: ``global_batch`` (micro-batches per update before the fault and
after it: the median and the smallest after), ``bound_time_to_target``: the best time to
the row's own target step under the bench's law, every live rank always busy
(:func:`faults_nodes_accounting.bound_time`), and ``law_time_to_target``: the row's own rule
under that law with no communication (:func:`faults_nodes_accounting.law_time`; sync waits
for its slowest rank, ``deal=demand`` ends at the pool's last unit), so a row's time over its
law is what its communication and the machine cost. A tailtrain record names the ranks that
entered each step and their micro-batches, so the absent node's samples are counted
(``samples_counted_skipped``), as ``bench_faults`` counts ``train``'s ``skipped``; the peers'
logs count none.

**Goals** (issue 37's first Done-when item), each from this run's rows with its bound, null
with why when a row or figure is missing: see :data:`faults_nodes_goals.GOAL_NAMES`. A drill
run several times is read at its median run, on both sides; a run of it that failed (no heal,
no target) fails the row's goal, and the books are read on every run.

    python bench/bench_faults_nodes.py --quick [--rows ...] [--drills ...] [--repeats ...] [--json]
    python bench/bench_faults_nodes.py --goals-from REPORT.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench import bench_faults as bf  # noqa: E402
from bench import faults_goals as fg  # noqa: E402
from bench import faults_measure as fm  # noqa: E402
from bench import faults_nodes_accounting as na  # noqa: E402
from bench import faults_nodes_goals as ng  # noqa: E402
from bench import faults_nodes_setting as ns  # noqa: E402

RANK_SCRIPT = ROOT / "bench" / "faults_nodes_rank.py"
ADDRESS = "127.0.0.1"  # the store, the lighthouse and torchrun's rendezvous


def node_address(node: int) -> str:
    """Node ``node``'s own loopback address (127.0.0.2, .3, .4)."""
    return f"127.0.0.{2 + node}"


# ---- arguments ---------------------------------------------------------------------------------
def bad_arguments(rows: list[str], drills: list[str], cfg: argparse.Namespace) -> str | None:
    """One line saying what is wrong with the selection, or None."""
    bad = [r for r in rows if r not in ns.ROWS] + [d for d in drills if d not in ns.DRILLS]
    if bad:
        return (
            f"unknown rows/drills {bad} (rows: {', '.join(ns.ROWS)}; "
            f"drills: {', '.join(ns.DRILLS)})"
        )
    if not rows or not drills:
        return "--rows and --drills need one name at least"
    if cfg.micro_batches < 1:
        return f"--micro-batches {cfg.micro_batches}: use 1 or more"
    if "tailtrain-rebalance" in rows and cfg.micro_batches < 2:
        return "tailtrain-rebalance deals micro-batch shares: use --micro-batches 2 or more"
    if cfg.steps is not None and cfg.steps < 20:
        return f"--steps {cfg.steps}: use 20 or more (the fault comes at 30-50% of the run)"
    if cfg.slow_factor < 1.0:
        return f"--slow-factor {cfg.slow_factor:g}: a slow node is 1 or more times slower"
    return None


def parse_repeats(spec: str) -> dict[str, int]:
    """``--repeats``: ``N`` (every drill) or ``drill=N,...`` (the others once)."""
    try:
        if "=" not in spec:
            counts = dict.fromkeys(ns.DRILLS, int(spec))
        else:
            pairs = (part.split("=", 1) for part in spec.split(",") if part)
            counts = {drill.strip(): int(n) for drill, n in pairs}
    except ValueError:
        raise ValueError(f"--repeats {spec}: give N or drill=N,... (e.g. heal=3,slow=3)") from None
    unknown = sorted(set(counts) - set(ns.DRILLS))
    if unknown or any(n < 1 for n in counts.values()):
        raise ValueError(
            f"--repeats {spec}: drills are {', '.join(ns.DRILLS)}, each run once or more"
        )
    return counts


def plan(cfg: argparse.Namespace) -> dict[str, Any]:
    """The seeded fault: node W in 1..NODES-1 and step S in [30%, 50%] of the run."""
    rng = np.random.default_rng(cfg.seed)
    node = int(rng.integers(1, ns.NODES))
    step = int(rng.integers(int(0.3 * cfg.steps), int(0.5 * cfg.steps) + 1))
    return {"node": node, "step": step, "workers": [node * ns.NPROC + i for i in range(ns.NPROC)]}


# ---- processes ---------------------------------------------------------------------------------
def parents() -> dict[int, int]:
    """Every process's parent (``/proc``), now."""
    out = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:  # ended meanwhile
            continue
        # "pid (comm) state ppid ...": comm may hold spaces, the last ")" ends it
        out[int(stat.parent.name)] = int(text[text.rindex(")") + 2 :].split()[1])
    return out


def tree(leader: int, parent: dict[int, int] | None = None) -> list[int]:
    """``leader`` and every process under it: a node (torchrun starts its workers in
    sessions of their own, so a node is its launcher's tree, not its process group)."""
    parent = parents() if parent is None else parent
    children: dict[int, list[int]] = {}
    for pid, ppid in parent.items():
        children.setdefault(ppid, []).append(pid)
    found, todo = [], [leader]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += children.get(pid, [])
    return found


def signal_tree(leader: int, sig: int) -> list[int]:
    """Send ``sig`` to the node's every process at once (its tree as it is now)."""
    pids = tree(leader)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)
    return pids


class NodeGroup(bf.Group):
    """``bench_faults.Group`` whose close also ends what the nodes' launchers started in
    sessions of their own (torchrun's workers)."""

    def close(self) -> None:
        parent = parents()
        for proc in self.procs:
            for pid in tree(proc.pid, parent)[1:]:
                for sig in (signal.SIGCONT, signal.SIGKILL):
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(pid, sig)
        super().close()


class Drill:
    """Fires the drill on node W's session as one of its ranks logs having reached step S
    (its log's ``step`` S-1 committed), in a thread; ``restart`` starts the node again
    (``heal``). ``fired`` is the fault as sent (``t``: just before the signal)."""

    def __init__(
        self,
        kind: str,
        folder: Path,
        fault: dict[str, Any],
        hold: float,
        node: Callable[[], Any],
        restart: Callable[[], Any] | None,
    ) -> None:
        self.kind, self.folder, self.fault, self.hold = kind, folder, fault, hold
        self.node, self.restart = node, restart
        self.fired: dict[str, Any] | None = None
        self.heal_delay = 0.0
        self.done = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def start(self) -> None:
        if self.kind != "slow":
            self.thread.start()

    def reached(self) -> dict[str, Any] | None:
        mine = set(tree(self.node().pid))
        for row in bf.read_jsonl(sorted(self.folder.glob("log-w*-*.jsonl"))):
            reached = "t0" in row and row["step"] + 1 >= self.fault["step"]
            if reached and int(row["pid"]) in mine:
                return row
        return None

    def run(self) -> None:
        while not self.done.is_set():
            row = self.reached()
            if row is None:
                time.sleep(0.02)
                continue
            leader = self.node().pid
            t = time.time()
            sig = signal.SIGKILL if self.kind in ("kill", "heal") else signal.SIGSTOP
            pids = signal_tree(leader, sig)
            self.fired = {"kind": self.kind, "worker": row["worker"], "step": row["step"] + 1}
            self.fired |= {"t": t, "node": self.fault["node"]}
            if self.kind == "stop":
                time.sleep(self.hold)
                for pid in pids:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(pid, signal.SIGCONT)
            elif self.kind == "heal" and self.restart is not None:
                self.node().wait(timeout=30)
                # the machine's reboot (--heal-delay), the same for every row
                self.done.wait(max(0.0, self.fired["t"] + self.heal_delay - time.time()))
                self.fired["restarted_at"] = time.time()
                self.restart()
            return


def last_log_write(folder: Path) -> float:
    times = [p.stat().st_mtime for p in folder.glob("log-w*-*.jsonl")]
    return max(times) if times else 0.0


def wait_run(
    group: bf.Group,
    mains: Callable[[], list[subprocess.Popen]],
    drill: Drill,
    cfg: argparse.Namespace,
) -> Any:
    """The run's status once its main processes ended (their exit statuses), or ``timed
    out``, or ``stalled`` (no rank logged a step for ``--stall`` s after the fault)."""
    deadline = time.monotonic() + cfg.run_timeout
    while time.monotonic() < deadline:
        procs = mains()
        healing = drill.kind == "heal" and drill.fired and "restarted_at" not in drill.fired
        if all(p.poll() is not None for p in procs) and not healing:
            return [p.returncode for p in procs]
        if drill.fired is not None and not healing:
            # the last sign of life: a step logged, the end of a hold, the node restarted
            held = drill.fired["t"] + (cfg.hold if drill.kind == "stop" else 0.0)
            alive = max(last_log_write(group.folder), held, drill.fired.get("restarted_at", 0))
            if time.time() - alive > cfg.stall:
                return f"stalled: no step logged for {cfg.stall:g} s after the fault"
        time.sleep(0.2)
    return "timed out"


# ---- rows --------------------------------------------------------------------------------------
def script_args(cfg: argparse.Namespace, drill: str, fault: dict[str, Any]) -> list[str]:
    steps = bf.run_steps(cfg, drill)
    args = ["--steps", str(steps), "--workers", str(ns.WORKERS), "--delay", cfg.delay]
    args += ["--pattern", "iid", "--seed", str(cfg.seed)]
    args += ["--micro-batches", str(cfg.micro_batches)]
    if drill == "slow":
        args += ["--slow-workers", ",".join(map(str, fault["workers"]))]
        args += ["--slow-factor", f"{cfg.slow_factor:g}"]
    return args


def start_tailtrain(row: str, drill: str, group: bf.Group, cfg: argparse.Namespace, fault: dict):
    port = bf.free_port()
    environ = ns.child_env()
    tt = [sys.executable, "-m", "tailtrain"]
    store = [*tt, "store", "--rdzv-endpoint", f"{ADDRESS}:{port}", "--nnodes", str(ns.NODES)]
    group.start([*store, "--timeout", f"{cfg.launch_timeout:g}"], "store", environ)
    time.sleep(0.5)
    script = [str(RANK_SCRIPT), "--out", str(group.folder), "--strategy", ns.STRATEGY[row]]
    script += script_args(cfg, drill, fault)
    starts = {n: 0 for n in range(ns.NODES)}

    def launch(node: int) -> subprocess.Popen:
        argv = [*tt, "launch", "--nnodes", str(ns.NODES), "--node-rank", str(node)]
        argv += ["--nproc-per-node", str(ns.NPROC), "--rdzv-endpoint", f"{ADDRESS}:{port}"]
        argv += ["--store", "apart", "--on-rank-loss", "shrink", "--restart-lost", "1"]
        argv += ["--timeout", f"{cfg.launch_timeout:g}", *script]
        starts[node] += 1
        return group.start(argv, f"node{node}-{starts[node]}", environ)

    return launch


def start_torchft(row: str, drill: str, group: bf.Group, cfg: argparse.Namespace, fault: dict):
    tuned = row == "torchft-tuned"
    port = bf.free_port()
    house = [str(bf.BIN / "torchft_lighthouse"), "--min_replicas", "1"]
    house += ["--bind", f"{ADDRESS}:{port}"]
    if tuned:
        ms = str(int(cfg.tuned * 1000))
        house += ["--join_timeout_ms", ms, "--heartbeat_timeout_ms", ms]
    environ = {**ns.child_env(), "TORCHFT_LIGHTHOUSE": f"http://{ADDRESS}:{port}"}
    group.start(house, "lighthouse", environ)
    base = [str(bf.PEER), "--mode", "torchft", "--out", str(group.folder), "--group-size"]
    base += [str(ns.NPROC), *script_args(cfg, drill, fault)]
    if tuned:
        base += ["--timeout", f"{cfg.tuned:g}"]
    starts = {n: 0 for n in range(ns.NODES)}

    def launch(node: int) -> subprocess.Popen:
        argv = [str(bf.BIN / "torchrun"), "--nnodes", "1", "--monitor-interval", "0.1"]
        argv += ["--nproc-per-node", str(ns.NPROC), "--max-restarts", "0"]
        argv += ["--master-addr", node_address(node), "--master-port", str(bf.free_port())]
        argv += [*base, "--replica", str(node)]
        starts[node] += 1
        return group.start(argv, f"node{node}-{starts[node]}", environ)

    return launch


def start_torchrun(row: str, drill: str, group: bf.Group, cfg: argparse.Namespace, fault: dict):
    port = bf.free_port()
    base = [str(bf.PEER), "--mode", "ddp", "--out", str(group.folder), "--attempts", "joins"]
    base += ["--checkpoint-every", "20", *script_args(cfg, drill, fault)]
    starts = {n: 0 for n in range(ns.NODES)}

    def launch(node: int) -> subprocess.Popen:
        argv = [str(bf.BIN / "torchrun"), "--nnodes", str(ns.NODES), "--monitor-interval", "0.1"]
        argv += ["--nproc-per-node", str(ns.NPROC), "--max-restarts", "1"]
        argv += ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"{ADDRESS}:{port}"]
        argv += ["--rdzv-id", "bench", "--rdzv-conf", f"is_host={int(node == 0)}"]
        argv += ["--local-addr", node_address(node), *base]
        starts[node] += 1
        return group.start(argv, f"node{node}-{starts[node]}", ns.child_env())

    return launch


STARTERS = {
    "tailtrain-sync": start_tailtrain,
    "tailtrain-rebalance": start_tailtrain,
    "tailtrain-deal-demand": start_tailtrain,
    "torchft-default": start_torchft,
    "torchft-tuned": start_torchft,
    "torchrun": start_torchrun,
}


def run_row(
    row: str, drill: str, folder: Path, cfg: argparse.Namespace, fault: dict[str, Any]
) -> dict[str, Any]:
    """One row through one drill: its nodes started, the drill fired on node W, the run's
    logs measured by ``faults_measure.measure`` plus this bench's global batch and bound."""
    group = NodeGroup(folder)
    began = time.time()
    nodes: dict[int, subprocess.Popen] = {}
    try:
        launch = STARTERS[row](row, drill, group, cfg, fault)
        for node in range(ns.NODES):
            nodes[node] = launch(node)
        w = fault["node"]

        def restart() -> None:
            nodes[w] = launch(w)

        drill_ = Drill(drill, folder, fault, cfg.hold, lambda: nodes[w], restart)
        drill_.heal_delay = cfg.heal_delay
        drill_.start()
        status = wait_run(group, lambda: list(nodes.values()), drill_, cfg)
        drill_.done.set()
    finally:
        group.close()
    rows = bf.read_jsonl(sorted(folder.glob("log-w*-*.jsonl")))
    commits, history = na.commits_and_history(rows, cfg)
    fired = drill_.fired if drill != "slow" else None
    extra = {"starts": [r for r in rows if r.get("event") == "start"]}
    cell = fm.measure(commits, history, fired, began, status, cfg, folder, "node0-1.out", extra)
    cell["starts"] = len(cell["starts"])
    if fired is not None:
        cell["fault"] = {**cell.get("fault", {}), "node": w}
        if "restarted_at" in fired:
            cell["node_restarted_after_s"] = round(fired["restarted_at"] - fired["t"], 3)
            if cell.get("heal_seconds") is not None:
                back = cell["heal_seconds"] - cell["node_restarted_after_s"]
                cell["heal_after_restart_s"] = round(back, 3)
    elif drill != "slow":
        cell["fault"] = None
        cell["why_no_fault"] = "node W never reached the drill's step"
    if "heal_seconds" in cell and fired is not None:
        cell |= heal_check(commits, fired, fault["workers"])
    cell["global_batch"] = na.global_batch(history, fired)
    cell |= na.bound_time(history, cell, cfg, fault if drill == "slow" else None)
    cell |= na.law_time(row, history, cell, cfg, fault if drill == "slow" else None)
    if not isinstance(status, list) or any(status):
        cell["log_tail"] = log_tails(folder)
    return cell


def log_tails(folder: Path) -> dict[str, list[str]]:
    """The last lines of each process's output, for a run that did not end cleanly."""
    tails = {}
    for path in sorted(folder.glob("*.out")):
        lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
        tails[path.stem] = [ln[:300] for ln in lines[-3:]]
    return tails


def heal_check(
    commits: list[dict[str, Any]], fired: dict[str, Any], node_workers: list[int]
) -> dict[str, Any]:
    """A node's heal as ``faults_measure.measure`` cannot tell it: ``heal_from`` ``peer`` when
    no worker outside the node restarted (``measure`` counts the node's second rank as
    another restart), and the heal void (``heal_seconds`` None, ``heal_void`` why) when no
    survivor committed a step after the node's first one: the survivors had ended, and the
    node trained alone (torchft's replica then forms a quorum of its own from step 0)."""
    tf, mine = float(fired["t"]), set(node_workers)
    initial: dict[int, int] = {}
    for c in sorted(commits, key=lambda c: c["t"]):
        initial.setdefault(c["worker"], c["pid"])
    restarted = [c for c in commits if c["t"] > tf and c["pid"] != initial[c["worker"]]]
    back = [c["t"] for c in restarted if c["worker"] in mine]
    others = {c["worker"] for c in restarted if c["worker"] not in mine}
    out: dict[str, Any] = {"heal_from": "checkpoint" if others else "peer"}
    if back and not any(c["t"] > min(back) for c in commits if c["worker"] not in mine):
        out |= {"heal_seconds": None, "heal_from": None}
        out["heal_void"] = "no survivor committed a step after the node's first: it ran alone"
    return out


# ---- the benchmark -----------------------------------------------------------------------------
def run_all(
    rows: list[str], drills: list[str], cfg: argparse.Namespace, fault: dict, top: Path
) -> ng.Rows:
    """Every selected row through every selected drill, drill by drill with the rows
    interleaved (and, where ``--repeats`` asks for several runs of a drill, repeat by repeat
    with the rows interleaved, so a load that drifts weighs on each alike); a row that cannot
    run says why once (not available, or refused at start). A drill run several times keeps
    its median run (:func:`median_run`)."""
    results: ng.Rows = {}
    for row in rows:
        results[row] = {}
        if row in ns.TORCHFT and cfg.torchft_error:
            results[row] = {"unavailable": cfg.torchft_error}
    for drill in drills:
        runs: dict[str, list[dict[str, Any]]] = {row: [] for row in rows}
        for repeat in range(cfg.repeats.get(drill, 1)):
            for row in rows:
                if fg.blocked(results[row]) is not None:
                    continue
                folder = top / row / (drill if repeat == 0 else f"{drill}-{repeat + 1}")
                folder.mkdir(parents=True, exist_ok=True)
                load = round(os.getloadavg()[0], 2)
                cell = {**run_row(row, drill, folder, cfg, fault), "load_1min_at_start": load}
                refusal = refused(cell)
                if refusal:
                    results[row] = {"refused": refusal}
                else:
                    runs[row].append(cell)
                short = {k: cell.get(k) for k in ("status", "wall", KEY_FIGURE[drill])}
                print(row, drill, repeat + 1, json.dumps(short, default=str), file=sys.stderr)
        for row, cells in runs.items():
            if cells and fg.blocked(results[row]) is None:
                results[row][drill] = median_run(cells, KEY_FIGURE[drill])
    return results


#: the figure a drill's goal reads, by which its median run is chosen
KEY_FIGURE = {
    "kill": "fault_to_next_step",
    "stop": "fault_to_next_step",
    "slow": "time_to_target",
    "heal": "heal_seconds",
}
#: what each run of a drill run several times keeps in ``repeats``
REPEAT_KEYS = (
    "status",
    "load_1min_at_start",
    "samples_replayed",
    "samples_lost",
    "steps_lost",
    "heal_from",
    "heal_void",
)


def median_run(cells: list[dict[str, Any]], key: str) -> dict[str, Any]:
    """The run of a drill whose ``key`` is the median (the lower middle of an even count; a
    run without the figure counts as the slowest), with every run's figure in ``repeats`` and
    the runs without it counted in ``repeats_failed``: a single run is returned as it is."""
    if len(cells) == 1:
        return cells[0]

    def value(cell: dict[str, Any]) -> float:
        figure = cell.get(key)
        return float("inf") if figure is None else float(figure)

    ranked = sorted(cells, key=value)
    chosen = dict(ranked[(len(ranked) - 1) // 2])
    chosen["repeats"] = [
        {key: c.get(key), **{k: c[k] for k in REPEAT_KEYS if k in c}} for c in cells
    ]
    chosen["repeats_failed"] = sum(c.get(key) is None for c in cells)
    return chosen


def refused(cell: dict[str, Any]) -> str | None:
    """The one line a row was refused with before it stepped (exit status 2), or None."""
    if "error" not in cell or not isinstance(cell.get("status"), list):
        return None
    if 2 not in cell["status"]:
        return None
    lines = [ln for tail in (cell.get("log_tail") or {}).values() for ln in tail]
    said = [ln for ln in lines if "error" in ln.lower()]
    return (said or lines or ["exit status 2"])[-1]


def torchft_probe() -> str | None:
    """Why torchft cannot run here (not importable), or None."""
    try:
        import torchft  # noqa: F401
    except ImportError as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def parse(argv: list[str] | None = None) -> tuple[argparse.Namespace, list[str], list[str]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps, shorter holds")
    parser.add_argument("--json", action="store_true", help="print the whole report")
    parser.add_argument("--rows", default=",".join(ns.ROWS))
    parser.add_argument("--drills", default=",".join(ns.DRILLS))
    parser.add_argument("--steps", type=int, default=None, help="default 150 (quick: 60)")
    parser.add_argument("--hold", type=float, default=None, help="stop s (10; quick 4)")
    parser.add_argument("--heal-extra", type=int, default=None, help="heal: steps more")
    parser.add_argument(
        "--heal-delay", type=float, default=5.0, help="heal: s from the kill to the restart"
    )
    parser.add_argument("--tuned", type=float, default=2.0, help="torchft's tuned timeout, s")
    parser.add_argument("--slow-factor", type=float, default=1.5)
    parser.add_argument("--micro-batches", type=int, default=bf.MICRO_BATCHES, metavar="M")
    parser.add_argument("--target-loss", type=float, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--repeats",
        default="1",
        help="runs of each drill, its median kept: N for every drill, or drill=N,... "
        "(e.g. heal=3,slow=3: the goals closest to their noise)",
    )
    parser.add_argument("--run-timeout", type=float, default=None, help="seconds per run")
    parser.add_argument("--stall", type=float, default=None, help="s without a step: ended")
    parser.add_argument("--out", type=Path, default=None, help="keep the run folders here")
    parser.add_argument("--save", type=Path, default=None, help="write the JSON report here")
    parser.add_argument("--goals-from", type=Path, default=None, help="score a saved report")
    cfg = parser.parse_args(argv)
    rows = [r for r in cfg.rows.split(",") if r]
    drills = [d for d in cfg.drills.split(",") if d]
    wrong = bad_arguments(rows, drills, cfg)
    try:
        cfg.repeats = parse_repeats(cfg.repeats)
    except ValueError as exc:
        wrong = wrong or str(exc)
    if wrong:
        parser.error(wrong)
    cfg.delay = bf.default_delay(cfg.micro_batches)
    cfg.steps = cfg.steps or (60 if cfg.quick else 150)
    cfg.heal_extra = cfg.heal_extra if cfg.heal_extra is not None else (300 if cfg.quick else 400)
    cfg.hold = cfg.hold if cfg.hold is not None else (4.0 if cfg.quick else 10.0)
    cfg.run_timeout = cfg.run_timeout or (240.0 if cfg.quick else 420.0)
    cfg.stall = cfg.stall or (45.0 if cfg.quick else 60.0)
    cfg.target_loss = cfg.target_loss or (2.2 if cfg.quick else 0.8)
    cfg.launch_timeout = 60.0
    cfg.workers, cfg.batch = ns.WORKERS, 32
    return cfg, rows, drills


def main(argv: list[str] | None = None) -> None:
    cfg, rows, drills = parse(argv)
    if cfg.goals_from is not None:
        report = json.loads(cfg.goals_from.read_text())
        report["goals"] = ng.goals(report["rows"])
        print(json.dumps(report, indent=2, default=str))
        return
    fault = plan(cfg)
    cfg.torchft_error = torchft_probe()
    report: dict[str, Any] = {"load_average_before": [round(x, 2) for x in os.getloadavg()]}
    cfg.compute_s = na.calibrate_compute(cfg)
    keys = ("steps", "heal_extra", "heal_delay", "hold", "tuned", "delay", "seed", "micro_batches")
    keys += ("repeats",)
    report["config"] = {k: getattr(cfg, k) for k in keys} | {
        "nodes": ns.NODES,
        "nproc_per_node": ns.NPROC,
        "slow_factor": cfg.slow_factor,
        "target_loss": cfg.target_loss,
        "fault": fault,
        "quick": cfg.quick,
        "stall_s": cfg.stall,
        "compute_s_per_micro_batch": round(cfg.compute_s, 5),
        "mean_draw_s_per_micro_batch": na.mean_delay(cfg.delay),
    }
    report["bind_note"] = (
        "store, lighthouse, rendezvous on 127.0.0.1; torchrun --local-addr and torchft's "
        "replica stores on 127.0.0.2-4; tailtrain launch has no per-node address option; "
        "gloo binds the host name's address (127.0.0.1); torchrun's TCPStore and torchft's "
        "manager server ([::]:port, not configurable in 0.2.0) listen on the wildcard"
    )
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="faults-nodes-") as scratch:
        results = run_all(rows, drills, cfg, fault, cfg.out or Path(scratch))
    report["wall_s"] = round(time.monotonic() - began, 1)
    report["rows"] = results
    report["goals"] = ng.goals(results)
    report["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    text = json.dumps(report, indent=2, default=str)
    if cfg.save is not None:
        cfg.save.parent.mkdir(parents=True, exist_ok=True)
        cfg.save.write_text(text)
    if cfg.json:
        print(text)
        return
    for name, goal in report["goals"].items():
        print(f"{name}: {goal['holds']}", goal.get("why", ""))
    print(
        f"wall {report['wall_s']} s; load {report['load_average_before']} -> "
        f"{report['load_average_after']}"
    )


if __name__ == "__main__":
    main()
