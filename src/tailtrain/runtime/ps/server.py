"""The parameter-server topology of `tailtrain train`: one server, N workers, real processes.

Rank 0 serves; rank w + 1 is worker w (``--workers N`` starts N + 1 processes). The server
plays the simulator's ``sim.ps.timeline`` on its own wall clock, event by event, and calls the
same rule objects (``plan`` / ``select`` / ``adapt``) with ``ArrivalColumns`` keyed
(worker, job) that it builds from what arrived; it applies the Selection through the shared
update path (``tailtrain.core.update.WeightedUpdate``, which carries LGC's deferred term).

Protocol (``runtime.ps.wire``: fixed-size messages, tag UP to the server, DOWN to workers)
------------------------------------------------------------------------------------------
Messages: JOB(worker, job, version, units, blocks, cancels, start; model) and STOP, server
to worker; GRAD(job, version, loss, seconds; gradient), PARTIAL(job, version, r, s, loss;
mean gradient over r blocks) and BYE, worker to server; PING and STOP, header only on tag
PROBE, server to a worker's probe thread (liveness, below).

Server states per worker: IDLE, or BUSY(version, job, start). The server alone starts jobs:
job numbers count each worker's starts, so worker w's j-th job has the simulator's data
(``job_batches``) and delay draw. Every time is the server's ``perf_counter`` since the run
started: a job's start is when its JOB left, an arrival's finish when its message came (its
worker's receiving thread stamps it), so DBW's round trips never mix two hosts' clocks.

A step (``SyncMode``; the rules of who starts which job, and the token queue, are
``topology.ps.transition``, which ``sim.ps.timeline`` drives in virtual time too):

1. begin(version v): under an interrupting mode (PsI, pull & interrupt) every BUSY worker
   gets a JOB at v naming the job it cancels (an interrupt); under pull with stale gradients
   dropped, n tokens of v join the FIFO token queue (DBW §2 footnote 3); IDLE workers, lowest
   index first, get a JOB at v (or at their token's version).
2. collect: GRAD from a BUSY worker's current job is an arrival (worker, job, version, start,
   finish); it is usable if fresh (version v) or if the plan accepts stale gradients, whose
   version travels with them (K-async family). A GRAD of a job the server cancelled crossed
   the interrupt on the wire and is ignored (counted as ``ghosts``; the simulator cancels at
   once, so it never sees one). After an arrival the worker: under pull, gets its next job at
   once (at v, or at the oldest token; none left: IDLE until the update); under push, gets v
   at once if its gradient was stale and dropped (PsW: late workers deliver and report their
   round trip, DBW §3.2), else stays IDLE until the update (K-async counts a worker once per
   step, slow-and-stale Fig. 5). The k-th usable arrival closes the step; its worker waits
   for the update. ``complete_stragglers`` (LGC complete=true) also waits until no job of an
   older version runs, and the last straggler goes on at v at once.
3. close: ``select`` on the usable arrivals, the update, ``adapt`` with every arrival of the
   step (late workers' stale ones included, for DBW's estimator), the record row.

LGC (``partial_blocks`` s > 0): the workers BUSY at v when the step closes are its
stragglers. Their interrupt asks for blocks: a worker answers every such JOB with one PARTIAL,
r = the blocks it finished before the JOB arrived (``ps_worker``). The update of step t uses
``now`` alone (LGC's g'_t depends only on the fresh gradients), so it leaves at once; when
the reports are in, the rule is called again on fresh + partial arrivals (its ``now`` must be
the same: checked) and its ``later`` weights set e_t in the update path, which the update of
step t + 1 adds (Eqs. 6-7). Step t + 1 does not close before that. With complete=true the
stragglers' whole gradients (GRADs of version t, r = s) are the reports.

End: the server sends STOP (on PROBE, then on DOWN) to every worker and reads until every
worker's BYE has come (a worker sends BYE when STOP reaches it, interrupting any job), so no
receive is left posted; then each worker that said BYE sends its trace and counts.
Every wait is bounded by ``--timeout``.

Dead and hung workers (``runtime.ps.liveness``): a worker whose connection fails is dead, one
silent past ``--worker-timeout`` is suspected hung; a step closes with min(k, live workers)
usable arrivals, the step row records the events (``suspect``, ``rejoined``, ``dead``,
``live``) and the summary ``dead_workers``; a suspect that delivers again rejoins; a suspect
is PINGed every bound while no earlier send to it is pending. No worker ALIVE and none heard
for ``--timeout``: the run stops. The end waits one bound for a missing BYE, then gives the
worker up (dead).

Evaluations follow ``core.evaluation`` on the server's clock, on snapshots of the model in
force, scored after the run so that the clock never pauses for them. Telemetry: steps.jsonl
(the simulator's parameter-server columns, plus the jobs and weights of the contributors),
summary.json (simulate's keys, ``wall_time`` for ``virtual_time``), trace-rank{r}.csv and
trace.csv (every worker's measured unit seconds, readable by ``trace:``).

The record streams (``core.records.RecordSink``, with ``--out``): each step's row is appended
and flushed as the step closes, so Ctrl-C or a crash of the server keeps every finished step.
An LGC step's row waits for its stragglers' blocks instead (its ``partial_*`` columns), which
are in before the next step closes: the row is written once, complete, one step late, so
``steps.jsonl`` keeps one row per step and a crash loses at most that one more. The last
step's stragglers are not waited for: its row goes out with empty ``partial_*`` columns, as
before. ``evals.jsonl`` is written when the run ends (its snapshots are scored then).

Ctrl-C (``runtime.keep``): the workers ignore it, the server closes the step in flight, ends
the run as at its budget (STOP, BYE, the workers' traces and counts) without the final
evaluation, and keeps the record with its summary marked partial and the checkpoint of that
step.

Checkpoints (``runtime.keep.Keeper``, ``core.session.RunKeeper``): the server is the run's
only state. After each closed step it keeps a snapshot (``runtime.ps.keep.state_dict``: the model
versions in force, the rule, the update path's deferred term, the evaluator and its unscored
snapshots, each worker's next job number, the token queue, where the record stands, an LGC
row still waiting for blocks) and writes it every ``--checkpoint-every`` steps, after Ctrl-C,
and when the server fails (:meth:`Keeper.failed_alone`; a killed server leaves the last
periodic one). A server that starts with a checkpoint in ``--out`` (``--resume``, a restart)
goes on from it: its clock from the checkpoint's time, ``steps.jsonl`` cut back to the rows it
counts, fresh workers each started on its next job number (a job's data and delay draws
depend on that number only), so the run goes on as if the jobs in flight had been
interrupted. An LGC step whose blocks were pending is recorded as the run's last step is,
without them. ``server.pid`` in the run folder holds the server's process id while it serves.
"""

from __future__ import annotations

import functools
import os
import sys
import time
from collections import deque
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from tailtrain.core.evaluation import Evaluator
from tailtrain.core.machine import append_machine, machine_row
from tailtrain.core.records import prepare_folder
from tailtrain.core.scenario import World
from tailtrain.core.session import RunKeeper, check_entry, screened
from tailtrain.core.update import (
    WeightedUpdate,
    closed_step_stats,
    gradient_stats,
    isin,
    rows_weighed,
)
from tailtrain.errors import TailtrainError
from tailtrain.runtime.config import RankResult, TrainConfig, build_world
from tailtrain.runtime.control import RuleDriver
from tailtrain.runtime.interrupt import interrupt_requested
from tailtrain.runtime.keep import Keeper
from tailtrain.runtime.ps import keep as ps_keep
from tailtrain.runtime.ps import lgc
from tailtrain.runtime.ps.arrivals import Arrival, columns
from tailtrain.runtime.ps.liveness import Liveness
from tailtrain.runtime.ps.state import Pending
from tailtrain.runtime.ps.wire import (
    DOWN,
    HEADER,
    UP,
    Kind,
    Mailbox,
    Message,
    Outbox,
    clock_server,
)
from tailtrain.runtime.ps.worker import work
from tailtrain.runtime.rank import Updates, drive_rank
from tailtrain.runtime.reduce import SWITCH_INTERVAL, Collectives
from tailtrain.runtime.telemetry import run_record, time_means, write_rank_steps, write_trace
from tailtrain.strategies.base import (
    ArrivalColumns,
    Plan,
    Selection,
    ServerPlan,
    StepStats,
    Strategy,
    step_closes,
    usable,
)
from tailtrain.topology import ps
from tailtrain.topology.ps import IDLE

#: the server's process id, in the run folder while it serves
SERVER_PID = "server.pid"


class Server:
    """Rank 0: the rule, the model versions, the workers' states and the clock."""

    def __init__(
        self, config: TrainConfig, world: World, strategy: Strategy, keeper: Keeper
    ) -> None:
        self.config, self.world, self.strategy, self.keeper = config, world, strategy, keeper
        self.n = world.scenario.workers
        theta = world.task.init_params(world.seed)
        self.dim, self.dtype = theta.numel(), theta.dtype
        self.versions = {0: theta}
        self.update = WeightedUpdate(world.lr, self.config.on_nonfinite)
        #: the rule, reached only through its driver (``runtime.control``)
        shape = functools.partial(server_plan, strategy)
        self.rule = RuleDriver(strategy, world.context, shape, remember=False)
        self.record = run_record(config, world, lead=True)
        self.evals = Evaluator(world.scenario.evaluation, self.record, enabled=True)
        self.snapshots: list[torch.Tensor] = []
        n = self.n
        self.liveness = Liveness(n, config.timeout, config.worker_timeout)
        self.outbox = Outbox(self.dim, self.dtype, config.timeout, self.liveness.failed)
        # who computes which version, and the token queue (``topology.ps``)
        self.schedule = ps.Schedule.fresh(n)
        self.job = np.full(n, -1, dtype=np.int64)
        self.start = np.zeros(n)
        self.next_job = np.zeros(n, dtype=np.int64)
        self.backlog: deque[Message] = deque()
        self.pending: Pending | None = None
        self.version = self.step = self.ghosts = 0
        self.now = 0.0
        self.interrupted = False  # Ctrl-C ended the run before its budget
        #: seconds from the previous close until this step's jobs were sent (server's work)
        self.lag = 0.0
        self.units = world.scenario.micro_batches or 1
        self.t0 = time.perf_counter()
        self.mailbox: Mailbox | None = None
        #: whom to signal for a drill of the server's death (tests, users), while it serves
        self.pid = None if config.out is None else prepare_folder(config.out) / SERVER_PID
        if keeper.saved is not None:
            ps_keep.resume(self, keeper.saved)
        ps_keep.open_record(self, keeper.saved)

    # ---- the loop: the topology's contract (``runtime.rank.RankRun``) ------------------------
    def updates(self) -> Updates:
        """The steps until the budget is spent or Ctrl-C; each step's index is yielded as it
        starts (``runtime.rank``: the drills of rank 0)."""
        # also opens every worker's connection before t = 0; a resumed run's clock goes on
        self.t0 = clock_server(self.n, self.now)
        workers = tuple(range(1, self.n + 1))  # a thread per worker (``runtime.ps.wire``)
        self.mailbox = Mailbox(workers, UP, HEADER + self.dim, self.dtype, self.liveness.last,
                               owed=False, on_error=self.liveness.failed, start=False)  # fmt: skip
        self.liveness.connect(self.outbox, self.mailbox)
        self.mailbox.start()
        keeper = self.keeper.run
        keeper.begin(self.evals, self.scorer(), resumed=self.keeper.saved is not None)
        while not self.world.finished(self.step, self.now) and not interrupt_requested():
            plan = self.rule.plan()
            yield self.step
            before = self.scorer()
            self.begin(plan)
            self.lag = self.clock() - self.now
            arrivals, fresh = self.collect(plan)
            self.close(plan, arrivals, fresh)
            keeper.stepped(self.evals, self.step, self.now, before, self.scorer())
            self.keeper.completed(self.step, lambda: ps_keep.state_dict(self))
        if self.pending is not None:  # the last LGC step: its stragglers are not waited for
            self.record.add_step(self.pending.row)
            self.pending = None
        self.interrupted = not self.world.finished(self.step, self.now)
        keeper.end(self.evals, self.step, self.now, self.scorer(), self.interrupted)
        self.liveness.stop(self.clock)
        self.score_snapshots()

    def clock(self) -> float:
        return time.perf_counter() - self.t0

    @property
    def busy(self) -> np.ndarray:
        """The version each worker computes (``IDLE``: none): the schedule's, read-only."""
        return self.schedule.jobs

    def checked(
        self, message: Message | None, plan: ServerPlan, fresh: list[Arrival], closed: bool
    ) -> bool:
        """After a liveness event (a LOST message, or None: a check was due): whether the
        step is closed, now that k is capped at the workers still live."""
        if message is not None and self.liveness.lost(message.worker):
            self.schedule, _ = ps.transition(self.schedule, ps.Lost(message.worker))
        p = self.pending
        if p is not None and p.waiting:  # LGC: a lost straggler reports nothing
            for w in [w for w in p.waiting if not self.liveness.alive[w]]:
                del p.waiting[w]
            if not p.waiting:
                lgc.resolve(self, p)
        if closed:
            return True
        closes = bool(fresh) and self.step_done(plan, len(fresh))
        if closes:
            self.now = self.clock()
        return closes

    def step_done(self, plan: ServerPlan, count: int) -> bool:
        """Whether ``count`` usable arrivals close the step (``step_closes``), k capped at the
        live workers, a draining plan waiting for every older job."""
        waits = plan.complete_stragglers and bool(self.older().any())
        return step_closes(count, self.liveness.cap(plan.k), waits)

    def older(self) -> np.ndarray:
        """The live workers computing at a version older than the current one."""
        return (self.busy != IDLE) & (self.busy < self.version) & self.liveness.alive

    # ---- begin: interrupts, tokens, idle workers -------------------------------------------
    def begin(self, plan: ServerPlan) -> None:
        v = self.version
        self.units = self.world.scenario.micro_batches or max(1, plan.partial_blocks)
        waiting = {} if self.pending is None else self.pending.waiting
        absent = frozenset(np.flatnonzero(self.liveness.dead).tolist())
        update = ps.Update(v, plan.mode, plan.accept_stale, absent)
        self.schedule, starts = ps.transition(self.schedule, update)
        for a in starts:  # interrupts first, then the idle workers, lowest index first
            w = a.worker
            if not a.cancels:
                self.start_job(w, a.version, self.now)
                continue
            blocks = self.pending.blocks if self.pending and w in waiting else 0
            self.start_job(w, a.version, self.now, cancels=int(self.job[w]), blocks=blocks)

    def start_job(
        self, w: int, version: int, start: float, cancels: int = -1, blocks: int = 0
    ) -> None:
        """Send worker ``w`` its next job. ``start`` is the instant the server decided it (the
        close, or the arrival it follows), as the simulator starts it; the worker aims its
        injected round trip from there (``ps_worker``), so the broadcast counts towards it."""
        job = int(self.next_job[w])
        self.next_job[w] += 1
        self.job[w], self.start[w] = job, start
        theta = self.versions[version]
        message = Message(Kind.JOB, w, job, version, self.units, blocks, cancels, start, theta)
        self.outbox.send(message, w + 1, DOWN)

    # ---- collect: arrivals until the step closes -------------------------------------------
    def collect(self, plan: ServerPlan) -> tuple[list[Arrival], list[Arrival]]:
        arrivals: list[Arrival] = []
        fresh: list[Arrival] = []
        closed = False
        while not closed or self.pending is not None:
            message = self.next_message(closed)
            if message is None or message.kind is Kind.LOST:
                closed = self.checked(message, plan, fresh, closed)
                continue
            self.liveness.heard(message.worker)
            if message.kind is Kind.PARTIAL:
                lgc.partial(self, message)
            elif message.kind is Kind.GRAD and closed:
                self.backlog.append(message)  # after the close: the next step's
            elif message.kind is Kind.GRAD:
                closed = self.arrival(message, plan, arrivals, fresh)
        return arrivals, fresh

    def next_message(self, closed: bool) -> Message | None:
        """The next message, or None when a liveness check is due (``ps_liveness``)."""
        assert self.mailbox is not None
        if self.backlog and not closed:
            return self.backlog.popleft()
        if self.liveness.dead.all():
            raise TailtrainError("every worker is dead: the run cannot go on")
        busy = self.busy != IDLE
        if not closed and not busy.any():
            raise TailtrainError("no worker is computing: the step can never collect k arrivals")
        now = self.clock()
        left = min(self.liveness.watch(busy, self.start, now), self.liveness.unanswered(now))
        return self.mailbox.take(0.0) if self.mailbox.wait(max(left, 1e-4)) else None

    def arrival(
        self, m: Message, plan: ServerPlan, arrivals: list[Arrival], fresh: list[Arrival]
    ) -> bool:
        """Take GRAD ``m``; whether it closes the step. Follow-up jobs as in the docstring."""
        w = m.worker
        if self.busy[w] == IDLE or self.job[w] != m.job:
            self.ghosts += 1
            return False
        a = Arrival(w, m.job, m.version, self.start[w], m.stamp - self.t0, m.payload, m.loss)
        # held: the worker closing the step waits for the update (unless drained)
        self.schedule, _ = ps.transition(self.schedule, ps.Delivered(w, hold=True))
        self.liveness.delivered(w, a.finish - a.start)
        arrivals.append(a)
        if usable(m.version, self.version, plan.accept_stale):
            fresh.append(a)
        p = self.pending
        if p is not None and p.complete and p.waiting.get(w, (None,))[0] == m.job:
            lgc.report(self, p, w, a)
        drain = plan.complete_stragglers
        closes = self.step_done(plan, len(fresh))
        if closes:
            self.now = a.finish
        if not closes or drain:  # the closing worker waits for the update (unless drained)
            self.schedule, starts = ps.transition(self.schedule, ps.Ask(w))
            for job in starts:
                self.start_job(w, job.version, a.finish)
        return closes

    # ---- close: select, update, adapt, record ----------------------------------------------
    def close(self, plan: ServerPlan, arrivals: list[Arrival], fresh: list[Arrival]) -> None:
        cands = columns(fresh)
        keys = cands.keys
        selection = self.rule.select(cands)
        applied = selection
        if plan.partial_blocks > 0:  # LGC: e_t comes with the stragglers' reports
            applied = Selection(now=selection.now)
        index = rows_weighed(keys, selection)
        inject = self.config.faults.at(self.step)  # NaN drills, as simulate
        grads = None
        if index.size == 1 and inject is None:  # async: a view (a drill poisons rows in place)
            grads = fresh[index[0]].grad[None]
        elif index.size:
            grads = torch.stack([fresh[i].grad for i in index])
        theta = self.versions[self.version]
        if grads is not None:
            self.update.inject = inject
            theta = self.update.apply(theta, grads, keys[index], applied, plan.lr_scale)
        dropped = self.update.take_dropped()
        used = selection.used()
        finite = None if grads is None else np.ones(index.size, dtype=bool)  # just screened
        if dropped.size:
            used = screened(used, dropped)
            finite = None if grads is None else ~isin(keys[index], dropped)
        losses = torch.tensor([fresh[i].loss for i in index], dtype=self.dtype)
        whole = grads if grads is not None else torch.zeros(0, self.dim)
        scalars = gradient_stats(losses, whole, finite)
        every = cands if len(arrivals) == len(fresh) else columns(arrivals)
        lr = self.world.lr * plan.lr_scale
        stats = closed_step_stats(self.step, plan.k, self.now, every, used, scalars, lr)
        state_before = self.rule.state
        self.rule.adapt(stats)
        row = self.row(plan, cands, keys, selection, stats, len(dropped))
        row.update(self.liveness.take_events())
        if plan.partial_blocks > 0:  # LGC: recorded with its stragglers' blocks (resolve)
            lgc.defer(self, plan, state_before, fresh, selection.now, row)
        else:
            self.record.add_step(row)
        self.version += 1
        self.step += 1
        self.versions[self.version] = theta
        keep = {self.version, *(run[0] for run in self.schedule.tokens)}
        for v in [v for v in self.versions if v not in keep]:
            del self.versions[v]

    def row(
        self,
        plan: ServerPlan,
        cands: ArrivalColumns,
        keys: np.ndarray,
        selection: Selection,
        stats: StepStats,
        nonfinite: int,
    ) -> dict[str, Any]:
        """``topology.ps.step_row``, and the columns only the server measures
        (``MEASURED_ONLY``); the ``partial_*`` ones are filled as the stragglers report."""
        idx = np.flatnonzero(isin(keys, stats.used))
        a = stats.arrivals
        weights = selection.now.over(keys)[idx] if len(selection.now) else np.zeros(0)
        # every arrival fed to ``adapt``: worker, job, version, start, finish (server clock)
        arrived = zip(
            a.worker.tolist(),
            a.job.tolist(),
            a.version.tolist(),
            a.start.tolist(),
            a.finish.tolist(),
            strict=True,
        )
        row = {
            **ps.step_row(stats, plan.k, cands),
            "partial_units": [],
            "partial_jobs": [],
            "jobs": cands.job[idx].tolist(),
            "weights": weights.tolist(),
            "grad_sq_sum": stats.grad_sq_sum,
            "mean_grad_sq": stats.mean_grad_sq,
            "arrived": [list(x) for x in arrived],
            "lag": self.lag,
        }
        return RunKeeper.note_nonfinite(row, nonfinite)

    # ---- end ---------------------------------------------------------------------------------
    def failed(self, exc: BaseException) -> BaseException:
        """The server failed at the step in flight: its rows are on disk (each flushed as it
        closed); it writes the checkpoint of its last closed step and the launcher's note."""
        self.keeper.failed_alone(self.step, self.config.timeout)
        return exc

    def finish(self) -> RankResult:
        """Gather the workers' traces and counts; the summary, partial after Ctrl-C."""
        config, keeper, record = self.config, self.keeper, self.record
        if self.pid is not None:
            self.pid.unlink(missing_ok=True)
        reports = self.liveness.reports()
        parts = [r for r in reports if r is not None]
        steps = [[], *([] if r is None else r[2] for r in reports)]  # by rank: 0 serves
        record.summary = self.summary([None if r is None else r[1] for r in reports], steps)
        if config.out is not None:
            folder = prepare_folder(config.out)
            per_mb = config.scenario.micro_batches is not None
            width = 5 + per_mb  # TraceRows.table's, with noncompute
            table = np.concatenate([t for t, _, _ in parts]) if parts else np.empty((0, width))
            write_trace(folder / "trace.csv", table, per_mb, charged=True)
            append_machine(folder, machine_row())  # what advise needs to see contention
            write_rank_steps(folder, steps)
        if self.interrupted:  # Ctrl-C (runtime.keep): the summary marked partial, checkpointed
            keeper.interrupted(record, self.step)
        elif config.out is not None:
            keeper.finish(record)  # the steps streamed; the scored evaluations go out now
        theta = self.versions[self.version]
        return RankResult(0, record, theta.numpy().copy())

    def scorer(self):
        """A snapshot of the model in force; scored after the run (module docstring)."""
        theta = self.versions[self.version]

        def scores() -> dict[str, Any]:
            self.snapshots.append(theta)
            return {"_snapshot": len(self.snapshots) - 1}

        return scores

    def score_snapshots(self) -> None:
        done: dict[int, dict[str, Any]] = {}
        for row in self.record.evals:
            theta = self.snapshots[row.pop("_snapshot")]
            if id(theta) not in done:
                done[id(theta)] = self.world.task.evaluate(theta)
            row.update(done[id(theta)])

    def summary(
        self, worker_stats: list[dict[str, int] | None], steps: Sequence[list[dict]] = ()
    ) -> dict[str, Any]:
        """simulate's keys, ``wall_time`` for ``virtual_time``, the run's own counts (None for
        a worker that died) and the means of the workers' ``steps`` parts, per job and worker
        (``telemetry.time_means``; they sum to a worker's mean step, not to the server's)."""
        topology: dict[str, Any] = {"topology": "parameter-server", "ghosts": self.ghosts}
        for key in ("jobs", "interrupted", "units_computed", "partial_reports"):
            topology[f"worker_{key}"] = [None if s is None else s[key] for s in worker_stats]
        topology |= self.liveness.summary()
        topology |= time_means([row for rank in steps for row in rank])
        return self.keeper.run.summary(self.world, self.strategy, self.record, topology)


def server_plan(strategy: Strategy, plan: Plan) -> ServerPlan:
    """``strategy``'s ``plan`` as the server takes it (``RuleDriver``'s shape)."""
    if not isinstance(plan, ServerPlan):
        raise TailtrainError(f"{strategy.describe()} gave no parameter-server plan")
    return plan


# ---- the rank entry ----------------------------------------------------------------------------
def train_parameter_server(config: TrainConfig, comm: Collectives, task: Any = None) -> RankResult:
    """Rank 0 serves, rank w + 1 is worker w. ``task`` replaces the scenario's (own models,
    ``runtime.launching.own_model``)."""
    world, strategy = build_world(config, task)
    check_entry(world, comm.world_size, servers=1)
    # threads hand over the GIL every 5 ms by default: a message's receiving thread would
    # wait that long to stamp it while the main thread works; 0.5 ms keeps stamps honest
    interval = sys.getswitchinterval()
    sys.setswitchinterval(SWITCH_INTERVAL)
    try:
        if comm.rank == 0:
            return serve(config, world, strategy, comm)
        return work(config, world, comm)
    finally:
        sys.setswitchinterval(interval)


def serve(config: TrainConfig, world: World, strategy: Strategy, comm: Collectives) -> RankResult:
    """Rank 0: run the server, then gather the workers' traces and counts. The run is kept
    as the other topologies keep theirs (``runtime.keep``): a checkpoint every
    ``--checkpoint-every`` steps, of the last closed step after Ctrl-C or a failure of the
    server; a checkpoint in ``--out`` (``--resume``, a restart) is gone on from."""
    keeper = Keeper.of(config, world, strategy, comm.rank, comm.world_size)
    server = Server(config, world, strategy, keeper)
    if server.pid is not None:
        server.pid.write_text(f"{os.getpid()}\n")
    comm.barrier()
    return drive_rank(server, comm.drill)
