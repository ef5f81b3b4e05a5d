"""Run your own training script on local ranks whose death the job survives (issue 26).

``tailtrain launch --nproc-per-node N [--on-rank-loss shrink] script.py args...`` starts N
processes of ``python script.py args...`` on this machine (through
``runtime.launching.script_rank``, which runs the script as that command would), as
``torchrun --standalone`` does: each gets torch's ``env://`` variables (``RANK``,
``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``,
``TORCHELASTIC_RUN_ID``, ``TORCHELASTIC_RESTART_COUNT``), so ``dist.init_process_group("gloo")``
works unchanged. What differs from torchrun:

* **The store lives in the launcher.** The launcher hosts the ``TCPStore`` at
  ``MASTER_ADDR:MASTER_PORT`` and sets ``TORCHELASTIC_USE_AGENT_STORE=True``, so every rank
  is a client of it (as of torchrun's agent store), rank 0 included: any rank may die and the
  store, the shrink protocol's meeting place (``runtime.elastic.shrink``), stays.
* **The launcher is each rank's shield.** It is every rank's parent and watches them
  (``ranks.RankState``). Under ``--on-rank-loss stop`` (the default: torchrun's behaviour) the
  first rank that exits non-zero stops the others and the launch fails with one line naming
  it. Under ``--on-rank-loss shrink`` a rank that dies (a non-zero exit or a signal, SIGKILL
  included) is logged in one line and noted ``dead/{rank}`` in the store at once, as
  ``runtime.expendable``'s shield does for ``train``, so the survivors' census need not wait
  its window; the others go on (``integrate.StragglerStep(..., on_rank_loss="shrink")``,
  which refuses to shrink elsewhere: it reads ``LAUNCHED``, ``runtime.elastic.store``,
  from its environment). A rank the survivors told to leave (``left/{rank}``: it hung past
  the deadline and woke) is logged as leaving, not as a death.
* **One line for the user** (``runtime.launching.script_rank``, each rank's bootstrap). Bad input
  (the script's argparse refusing its arguments, or a :class:`~tailtrain.UsageError`) is found
  by every rank: the ranks say nothing and leave their line here, and the launch prints it once
  and ends with ``outcome.refused`` (exit 2), under shrink too. A crashed rank's traceback
  is printed by that rank alone (one whose collective failed because a peer left first is
  stopped before it speaks), and the launcher's line names it with its exception's last line.
* **The outcome.** The launch succeeds (exit 0) when every rank finished (status 0), or,
  under shrink, when at least one did and every other one died, left, or was stopped because
  it still ran ``--timeout`` seconds after the first rank finished (a hung rank the survivors
  went on without: SIGKILL, which a stopped process takes too), and no heal failed (below);
  otherwise it fails with one line (:class:`~tailtrain.runtime.launching.failures.JobFailed`,
  exit 1) naming the first rank that failed and why.
* **Only what holds is said** (under shrink). A rank that dies is said dead and noted so;
  that the live ranks went on is said once they did: the members of a generation that formed
  and synced write ``gen{g}/held`` (``Shrinker.held``), and the launcher, which reads those
  keys (:class:`Generations`), says "ranks [...] went on from step s (generation g): without
  ranks [...]" then, never when it only expects it; a generation whose forming failed is not
  said. A restart is said started, and "rejoined ... at step s" once the generation that took
  it in held (``healed/{rank}``, ``ranks.taken_in``).
* **Ctrl-C** (SIGINT, or SIGTERM or SIGHUP to the launcher) is forwarded once to every
  rank (whose ``KeyboardInterrupt`` ends it with status 130, no traceback), each in a
  process group of its own (a terminal's Ctrl-C would otherwise reach each twice) that the
  signal goes to whole, so what a rank started goes too; the launcher waits up to
  ``ranks.STOP_GRACE`` seconds for them, kills what is left, and exits 130. A rank dies with
  the launcher (``PR_SET_PDEATHSIG``), so a killed launcher leaves no rank behind (what a
  rank started is the rank's to end, as under torchrun).

Every wait is bounded: the watch looks at the ranks every :data:`WATCH_POLL` seconds (and at
the store's notes every :data:`STORE_LOOK`); a stop waits ``ranks.STOP_GRACE`` seconds before
SIGKILL. Bad input (the script, the count, the option) is one line and exit 2, checked before
any process starts (:func:`check_launch`).

**Restarts** (``--restart-lost N``, under shrink only): a rank that died is started again, the
same script with the same ``RANK``, at most N times per rank, each logged in one line; its
environment says it is a restart (``TAILTRAIN_RESTART`` = how many times it was started
again, and ``TAILTRAIN_REJOIN=1``, ``runtime.elastic.store``), so the script skips
``dist.init_process_group`` (the job's group is broken, and joining it again hangs) and
``StragglerStep`` asks the live ranks to take it in (JOINING), which they do at their next step
boundary, handing it the model, optimizer and rule state (``integrate.step``). Once a rank
finished, the launcher sets ``finished`` in the store: a rank still waiting to join is
refused then and leaves (``ranks.RankState`` ``LEFT``: no failure, the run ended first).
**A heal that fails is a failure**: a restart that ends before the live ranks took it in
(``healed/{rank}`` unwritten), whether it crashed, exited 0, or found no one to take it in
within ``--timeout`` (``Shrinker.join`` then raises), fails the launch (exit 1) with one line,
``the heal failed: rank r was started again and died before it was taken in (why)``, unless
another restart of it heals; the other ranks' training goes on meanwhile.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch.distributed as dist

from tailtrain.core.machine import max_local_workers
from tailtrain.errors import UsageError
from tailtrain.runtime.elastic.shrink import OnRankLoss
from tailtrain.runtime.elastic.store import (
    CLEARED,
    LAUNCHED,
    REJOIN,
    REJOIN_WITH,
    RESTART,
    prefix,
)
from tailtrain.runtime.expendable import die_with, exit_reason
from tailtrain.runtime.launching import script_rank
from tailtrain.runtime.launching.endpoint import Endpoint, parse_endpoint, reserve
from tailtrain.runtime.launching.failures import JobFailed
from tailtrain.runtime.launching.nodes import (
    GroupBy,
    Meeting,
    Nodes,
    StoreAt,
    check_nodes,
    env_of_run,
    meet,
    node_env,
)
from tailtrain.runtime.launching.ranks import (
    Rank,
    RankState,
    Restarts,
    judged,
    node_leaves,
    stop,
    taken_in,
)

log = logging.getLogger(__name__)

#: seconds between two looks at the ranks
WATCH_POLL = 0.05
#: seconds between two reads of the store for what to say and whom the live ranks took in
#: while every rank runs (a rank's end reads them at once): a line 0.25 s late costs nothing,
#: and it halves the launchers' and the store's small share of a running job's CPU
STORE_LOOK = 0.25
#: what the launcher forwards to the ranks and then ends on (SIGHUP: its terminal closed,
#: which would otherwise end it at once, its ranks killed by PR_SET_PDEATHSIG and no stop)
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@dataclass(frozen=True)
class LaunchPlan:
    """What ``tailtrain launch`` runs: ``script`` with ``args`` on ``nproc`` local ranks."""

    script: Path
    args: tuple[str, ...]
    nproc: int
    on_rank_loss: OnRankLoss = OnRankLoss.STOP
    endpoint: str = "127.0.0.1:0"
    timeout: float = 300.0
    #: how often a rank that died is started again (``--restart-lost``, under shrink)
    restart_lost: int = 0
    #: the job's nodes, this launcher's among them (``runtime.launching.nodes``)
    nodes: Nodes = field(default_factory=Nodes)


@dataclass
class LaunchOutcome:
    """The ranks' end states and the first failure (None: the job succeeded)."""

    states: dict[int, RankState] = field(default_factory=dict)
    failure: str | None = None
    interrupted: bool = False
    #: a rank's one line on bad input (its arguments, a UsageError): the CLI's exit 2
    refused: str | None = None
    #: restarted ranks that died before they were taken in, with no restart after (a failure)
    heal_failed: dict[int, str] = field(default_factory=dict)


def check_launch(
    script: str | None,
    nproc: int,
    on_rank_loss: str,
    endpoint: str = "127.0.0.1:0",
    timeout: float = 300.0,
    args: Sequence[str] = (),
    restart_lost: int = 0,
    nnodes: int = 1,
    node_rank: int = 0,
    store_at: str = StoreAt.LAUNCHER,
    group_by: str | None = None,
) -> LaunchPlan:
    """Every check before any process starts; one-line :class:`UsageError` s."""
    if script is None:
        raise UsageError("no script given: tailtrain launch --nproc-per-node N script.py [ARGS...]")
    if nproc < 1:
        raise UsageError(f"--nproc-per-node must be >= 1, got {nproc}")
    if nproc > max_local_workers():
        raise UsageError(
            f"--nproc-per-node {nproc} local processes is too many: at most "
            f"{max_local_workers()} here; use --nnodes across machines for more"
        )
    if on_rank_loss not in tuple(OnRankLoss):
        choices = ", ".join(OnRankLoss)
        raise UsageError(f"--on-rank-loss must be one of {choices}, got {on_rank_loss!r}")
    if not timeout > 0 or timeout == float("inf"):
        raise UsageError(f"--timeout must be finite seconds > 0, got {timeout}")
    if restart_lost < 0:
        raise UsageError(f"--restart-lost must be >= 0, got {restart_lost}")
    if restart_lost and on_rank_loss != OnRankLoss.SHRINK:
        raise UsageError(
            f"--restart-lost {restart_lost} starts a dead rank again for the live ranks to take "
            "in: add --on-rank-loss shrink (under stop a death ends the job)"
        )
    path = Path(script)
    if not path.is_file():
        raise UsageError(f"no script {script!r}: give the path of a Python file to run")
    nodes = check_nodes(nnodes, node_rank, store_at, group_by, parse_endpoint(endpoint))
    if nodes.hosts_store:
        reserve(parse_endpoint(endpoint))  # an address of this machine, a usable port
    return LaunchPlan(
        path, tuple(args), nproc, OnRankLoss(on_rank_loss), endpoint, timeout, restart_lost, nodes
    )


def launch_script(plan: LaunchPlan) -> LaunchOutcome:
    """Run ``plan`` (module docstring); raises :class:`JobFailed` with one line when the job
    failed. Ctrl-C ends with ``outcome.interrupted`` (the CLI's exit 130)."""
    timeout = datetime.timedelta(seconds=plan.timeout)
    meeting = meet(plan.nodes, parse_endpoint(plan.endpoint), timeout, plan.nproc)
    store = meeting.store
    where = Endpoint(parse_endpoint(plan.endpoint).host, store.port)
    env = env_of_run(os.environ, meeting, where)
    env[LAUNCHED] = str(plan.on_rank_loss)
    notes = dist.PrefixStore(prefix(env), store)  # the shrink protocol's keys
    said = Path(tempfile.mkdtemp(prefix="tailtrain-launch-"))  # the ranks' one lines
    env[script_rank.NOTES] = str(said)
    parent = os.getpid()
    ranks = []
    asked: list[int] = []
    previous = {sig: signal.signal(sig, lambda s, _f: asked.append(s)) for sig in STOP_SIGNALS}

    nodes = plan.nodes
    by_node, loss = nodes.group_by is GroupBy.NODE, plan.on_rank_loss
    node_ranks = ",".join(str(nodes.rank_of(i, plan.nproc)) for i in range(plan.nproc))

    def forget(rank: int) -> None:
        for word in ("left", "healed", "joined"):  # an earlier start's words are not its own
            with contextlib.suppress(Exception):
                notes.delete_key(f"{word}/{rank}")

    def start(local: int, restarts: int = 0, cleared: str | None = None) -> subprocess.Popen:
        if cleared is None:  # else once the node's start is confirmed, before the clearance
            forget(nodes.rank_of(local, plan.nproc))
        mine = dict(env, **node_env(nodes, plan.nproc, local))
        if restarts:  # it joins the live ranks instead of the job's (broken) group
            mine.update({RESTART: str(restarts), REJOIN: "1"})
        if restarts and by_node:  # the node's ranks are taken in together
            mine[REJOIN_WITH] = node_ranks
        if cleared is not None:  # it asks to join once this launcher's look found no other
            mine[CLEARED] = cleared
        # by hand, not torch's elastic agent: the stock agent restarts every worker of the job
        # on a membership change, where shrink keeps the survivors running
        return subprocess.Popen(  # the script as `python script.py` runs it (script_rank)
            [sys.executable, "-m", script_rank.__name__, str(plan.script), *plan.args],
            env=mine,
            process_group=0,  # a terminal's Ctrl-C reaches it once: from us
            preexec_fn=lambda: die_with(parent),
        )

    cleared = meeting.clearance()
    try:
        for local in range(plan.nproc):  # a node started again: each of its ranks rejoins
            rank = nodes.rank_of(local, plan.nproc)
            process = start(local, meeting.restarts, cleared)
            ranks.append(Rank(rank, process, local=local, rejoins=meeting.restarts > 0))
        meeting.confirm()  # a second start: its look at the node's earlier launcher, meanwhile
        if cleared is not None and not asked:  # after a Ctrl-C in the look they never ask
            for r in ranks:
                forget(r.rank)
            notes.set(cleared, "1")
        meeting.keep_beating(where)  # its thread ends with meeting.ended(), in the finally
        again = Restarts(plan.restart_lost, start) if plan.restart_lost else None
        try:
            return watch(ranks, loss, notes, asked, plan.timeout, again, said, by_node, meeting)
        except dist.DistError as exc:  # the store went with its host: this node cannot go on
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise JobFailed(
                f"the job's store at {where} is gone ({first[:120]}): its host (node 0, or "
                "`tailtrain store`) was lost; the ranks of this node were stopped"
            ) from None
    finally:
        # a second start refused in its look counted nothing: its ranks never asked to join,
        # and this node's word in the store is its earlier launcher's to say
        stop(ranks, signal.SIGTERM if meeting.counted else signal.SIGKILL)
        if meeting.counted:
            meeting.ended(finished=any(r.state is RankState.FINISHED for r in ranks))
        if meeting.counted and not asked:  # node 0's store serves the nodes still going
            meeting.wait_for_others(plan.timeout, lambda: bool(asked))
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        shutil.rmtree(said, ignore_errors=True)


def watch(
    ranks: list[Rank],
    on_rank_loss: OnRankLoss,
    notes: dist.Store,
    asked: list[int],
    timeout: float = 300.0,
    again: Restarts | None = None,
    said: Path | None = None,
    by_node: bool = False,
    shared: Meeting | None = None,
) -> LaunchOutcome:
    """Poll the ranks until none runs (module docstring); a rank still running ``timeout``
    seconds after another finished is stopped (a hung rank the survivors left behind).
    ``said``: the folder where a rank that ends on bad input or a crash leaves its one line
    (``runtime.launching.script_rank``); bad input stops the job, under shrink too.
    ``by_node``: these ranks are one node, which leaves whole (``runtime.launching.nodes``);
    ``shared``: the job's meeting across nodes (beats; under stop, the others' failure)."""
    outcome = LaunchOutcome()
    first_done: float | None = None
    # what the live ranks did, said once it holds (a generation formed, a restart taken in)
    said_held = Generations(notes) if on_rank_loss is OnRankLoss.SHRINK else None
    next_look = 0.0
    while any(r.state is RankState.RUNNING for r in ranks):
        if shared is not None:  # (it beats from a thread of its own: Meeting.keep_beating)
            other = shared.stop_asked() if on_rank_loss is OnRankLoss.STOP else None
            if other is not None:  # another node failed: this one stops, as torchrun's agents
                outcome.failure = f"another node failed ({other}); this node's ranks were stopped"
                stop(ranks, signal.SIGTERM)
                break
        if asked:  # Ctrl-C: forward it once and wait for them
            outcome.interrupted = True
            if said is not None:  # a rank whose peer left on it ends silent (script_rank)
                (said / script_rank.INTERRUPTED_MARK).touch()
            stop(ranks, asked[0])
            break
        if first_done is not None and time.monotonic() > first_done + timeout:
            late = [r.rank for r in ranks if r.state is RankState.RUNNING]
            line = f"ranks {late} still ran {timeout:g}s after the first rank finished"
            stop(ranks, signal.SIGKILL)  # a stopped (SIGSTOP) process takes no SIGTERM
            if on_rank_loss is OnRankLoss.SHRINK:
                log.warning("%s; stopped", line)
            else:
                outcome.failure = f"{line}; they were stopped"
            break
        if said_held is not None and (now := time.monotonic()) >= next_look:
            next_look = now + STORE_LOOK
            say_held(said_held)
            for r in ranks:
                if r.state is RankState.RUNNING:
                    taken_in(r, notes)
        for r in ranks:
            if r.state is not RankState.RUNNING or (code := r.process.poll()) is None:
                continue
            r.why = exit_reason(_status(code))
            note = script_rank.take_note(said, r.rank) if said is not None and code else None
            if note is not None and note["kind"] == script_rank.USAGE_NOTE:
                outcome.refused = note["line"]  # every rank finds it: said once, status 2
                r.state = RankState.DIED  # ended on its input: no death to restart or note
                stop(ranks, signal.SIGTERM)
                break
            if note is not None:  # a crash: its exception's last line names the cause
                r.why = f"{note['line']}; {r.why}"
            # asked before its status: a loop that catches Refused exits 0, and a rank told to
            # leave must not start the clock that stops the survivors still training
            if notes.check([f"left/{r.rank}"]):
                r.state, r.why = RankState.LEFT, notes.get(f"left/{r.rank}").decode()
                log.warning("rank %d left the job: %s", r.rank, r.why)
                continue
            # a restart that ends, even with status 0, before the live ranks took it in: the
            # heal failed (a failure unless another restart heals)
            if said_held is not None:  # what held is said before whom it took in
                say_held(said_held)
            unhealed = r.heals and not taken_in(r, notes)
            if code == 0 and not unhealed:
                r.state = RankState.FINISHED
                if first_done is None:  # a rank still waiting to join is refused now
                    first_done = time.monotonic()
                    notes.set("finished", "1")
                continue
            r.state, r.died = RankState.DIED, time.monotonic()
            if unhealed:
                how = "died" if code else "ended"
                late = f"rank {r.rank} was started again and {how} before it was taken in"
                outcome.heal_failed[r.rank] = f"{late} ({r.why})"  # unless a restart heals
            if on_rank_loss is OnRankLoss.SHRINK and by_node:
                stopped = node_leaves(ranks, r, notes)
                if again is not None and first_done is None and again.restart_node(ranks, r):
                    outcome.heal_failed = {}  # the node gets another start
                    continue
                failed = outcome.heal_failed.get(r.rank)
                cause = f"the heal failed: {failed}" if failed else f"rank {r.rank} died ({r.why})"
                # the other nodes' census decides whether they go on: not said here
                outcome.failure = f"this node left the job: {cause}{stopped}"
                break
            if on_rank_loss is OnRankLoss.SHRINK:
                notes.set(f"dead/{r.rank}", r.why)  # the census need not wait its window
                if again is not None and first_done is None and again.restart(r):
                    outcome.heal_failed.pop(r.rank, None)  # it gets another start
                    continue
                # that the others went on is said once a generation without it held
                log.warning("rank %d died (%s); noted dead for the live ranks", r.rank, r.why)
            else:
                outcome.failure = f"rank {r.rank} failed ({r.why}); the other ranks were stopped"
                stop(ranks, signal.SIGTERM)
                if shared is not None:  # and so do the other nodes'
                    shared.stop_others(outcome.failure)
                break
        if outcome.refused is not None or outcome.failure is not None:
            break  # decided: a rank that ended meanwhile is no further death or restart
        time.sleep(WATCH_POLL)
    if said_held is not None:  # a generation that held in the last look's interval
        say_held(said_held)
    outcome.states = {r.rank: r.state for r in ranks}
    if outcome.interrupted or outcome.refused is not None:
        return outcome
    if outcome.failure is None and outcome.heal_failed:  # the others may have finished: still
        outcome.failure = f"the heal failed: {next(iter(outcome.heal_failed.values()))}"
    if outcome.failure is None:
        outcome.failure = judged(ranks)
    if outcome.failure is not None:
        raise JobFailed(outcome.failure)
    return outcome


def say_held(generations: Generations) -> None:
    """Log each generation that held since the last look (:class:`Generations`)."""
    for line in generations.look():
        log.warning("%s", line)


@dataclass
class Generations:
    """The live ranks' generations as the launcher reads them from the store: the members of a
    generation that held (formed, and synced from the lead) write ``gen{g}/held``
    (``Shrinker.regroup``), so the launcher says that the job went on only once it did. A
    generation whose forming failed is followed by its own census or grow
    (``gen{g}/members``, ``gen{g}/grow``) with no ``held``: it is passed over, unsaid."""

    notes: dist.Store
    #: the next generation to look for (generation 0 is the job's group)
    next: int = 1

    def look(self) -> list[str]:
        """The lines of the generations that held since the last look."""
        lines = []
        with contextlib.suppress(Exception):  # the store gone: the watch finds it
            while True:
                g, notes = self.next, self.notes
                if notes.check([f"gen{g}/held"]):
                    held = json.loads(notes.get(f"gen{g}/held"))
                    line = f"ranks {held['members']} went on from step {held['step']}"
                    line += f" (generation {g})"
                    parts = [f"without ranks {held['lost']}"] if held["lost"] else []
                    parts += [f"with ranks {held['joined']} taken back"] if held["joined"] else []
                    lines.append(f"{line}: {', '.join(parts)}" if parts else line)
                elif not (notes.check([f"gen{g}/members"]) or notes.check([f"gen{g}/grow"])):
                    return lines
                self.next += 1
        return lines


def _status(code: int) -> int:
    """A wait status for :func:`~tailtrain.runtime.expendable.exit_reason` from Popen's code
    (negative: the signal)."""
    return -code if code < 0 else code << 8
