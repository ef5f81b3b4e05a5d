"""A parameter-server worker of `tailtrain train`: compute the jobs the server hands out.

The worker holds no rule and no clock that matters: the server decides every job (``ps``).
Its loop (protocol in ``runtime.ps``)::

    wait for JOB or STOP (bounded)
    JOB: split the mini-batch of (worker, job) (``tasks.stream.job_batches``, the
         simulator's) into ``units`` equal parts (micro-batches, or LGC's blocks) and compute
         them in order; between two units, and during a unit's injected seconds, look at the
         mailbox: any message interrupts the job (push & interrupt, pull & interrupt)
         - finished: send GRAD (the mean gradient over the whole mini-batch), wait again
         - interrupted: answer each queued JOB that asks for blocks with a PARTIAL, then take
           the newest JOB
    STOP: send BYE and leave

Injected delays (``JobClock``): worker w's j-th job lasts the simulator's draw for that job
(``delays.schedule.JobDurations``, round trips, T^c included), spread over its units as the
simulator spreads it (micro-batch shares, or equal blocks). The draw is the job's whole
round trip as simulated (pull, compute, push), so the worker aims at it: unit u ends at
start + (its units' injected seconds) on the server's clock (the job's start comes in its
JOB; the clocks' offset is estimated once, ``runtime.ps.wire.clock_worker``), or when its real
compute ends, if later. The model's download and the real compute thus count towards the
injected time; what is left over is the real system's cost (the gradient's upload, the
server's work). A unit's real compute is never cut (a device cannot stop halfway through a
micro-batch); the injected rest is waited on the mailbox, so an interrupt ends it at once,
as the simulator cancels at once.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from tailtrain.core.records import RunRecord, prepare_folder
from tailtrain.core.scenario import World
from tailtrain.runtime.config import RankResult, TrainConfig
from tailtrain.runtime.ps.wire import (
    DOWN,
    HEADER,
    PROBE,
    UP,
    Kind,
    Mailbox,
    Message,
    Outbox,
    clock_worker,
    send_report,
)
from tailtrain.runtime.rank import Updates, drive_rank
from tailtrain.runtime.reduce import Collectives
from tailtrain.runtime.telemetry import RankLog, TraceRows, split_step, time_row, write_trace
from tailtrain.tasks.stream import job_batches

SERVER = 0


class JobClock:
    """Injected seconds of this worker's jobs: the simulator's draws, job by job."""

    def __init__(self, world: World, worker: int, inject: bool) -> None:
        self.worker = np.array([worker])
        self.inject = inject
        self.durations = world.durations(round_trips=True) if inject else None

    def unit_seconds(self, job: int, start: float, units: int) -> np.ndarray:
        """(units,) seconds of job ``job`` starting at ``start`` (the server's clock)."""
        d = self.durations
        if d is None:
            return np.zeros(units)
        while d.next_job[self.worker[0]] < job:  # jobs the server gave up before we saw them
            d.advance(self.worker)
        total = float(d.peek(self.worker, np.array([start]))[0])
        shares = d.peek_progress(self.worker)
        d.advance(self.worker)
        if shares is None or shares.shape[1] != units:
            return np.full(units, total / units)
        return np.diff(shares[0] * total, prepend=0.0)


@dataclass
class Job:
    """The job in hand and what of it is done."""

    job: int
    version: int
    theta: torch.Tensor
    batch: np.ndarray
    units: int
    done: int = 0
    #: when each finished unit ended, on the server's clock (``Worker.compute``)
    ends: list[float] = field(default_factory=list)
    #: the seconds it waited out injected rests (``Worker.compute``)
    slept: float = 0.0


@dataclass
class WorkerStats:
    jobs: int = 0
    finished: int = 0
    interrupted: int = 0
    units_computed: int = 0
    partial_reports: int = 0


class Worker:
    """Worker ``index`` (rank index + 1) of a parameter-server job."""

    def __init__(
        self,
        world: World,
        index: int,
        inject: bool,
        timeout: float,
        out: Path | None = None,
    ) -> None:
        self.world, self.index, self.timeout = world, index, timeout
        self.rank, self.out = index + 1, out  # its traces go to ``out`` (the run folder)
        task = world.task
        self.dim, self.dtype = task.dim, task.init_params(world.seed).dtype
        self.clock = JobClock(world, index, inject)
        self.outbox = Outbox(self.dim, self.dtype, self.timeout)
        self.log = RankLog()
        self.trace = TraceRows(index, world.scenario.micro_batches is not None, charged=True)
        #: each job's step in parts (``telemetry.time_row``), for the server's summary
        self.step_times: list[dict] = []
        self.mark = 0.0  # when the job in hand came (this clock): its step starts there
        self.stats = WorkerStats()
        self.current: Job | None = None  # the job in hand, finished or interrupted
        self.mailbox: Mailbox | None = None
        self.zero = 0.0  # the server's time zero on this worker's clock

    def batch(self, job: int) -> np.ndarray:
        w = self.world
        indices = job_batches(w.partition, w.seed, w.task.batch_size, [self.index], [job])
        return indices[0, 0]

    def warm_up(self) -> None:
        """The first gradient call builds torch.func machinery: keep it out of the run."""
        theta = self.world.task.init_params(self.world.seed)
        self.world.task.grads(theta, self.batch(0)[None])

    # ---- the topology's contract (``runtime.rank.RankRun``) ----------------------------------
    def updates(self) -> Updates:
        """The jobs until the server's STOP; each job's version is yielded as its work starts
        (``runtime.rank``: the drills; a skipped version's drill hits at the next one)."""
        self.zero = clock_worker()
        size = HEADER + self.dim
        stop = lambda m: m.kind is Kind.STOP  # noqa: E731
        self.mailbox = Mailbox(SERVER, DOWN, size, self.dtype, stop)
        # drops PINGs (ps_liveness); a healthy run may send none for longer than --timeout
        probes = Mailbox(SERVER, PROBE, HEADER, self.dtype, stop, owed=False)
        message = self.mailbox.take(self.timeout)
        self.mark = time.perf_counter()
        while message.kind is Kind.JOB:
            yield message.version
            message = self.follow(message)
        self.outbox.send(Message(Kind.BYE, worker=self.index), SERVER, UP)
        self.outbox.flush()
        self.mailbox.join(self.timeout)
        probes.join(self.timeout)  # the server sent its STOP on PROBE before the one on DOWN

    def failed(self, exc: BaseException) -> BaseException:
        """A worker keeps nothing: it ends with ``exc`` (the server goes on without it)."""
        return exc

    def finish(self) -> RankResult:
        """Send the server this worker's trace and counts; write its trace file."""
        stats = vars(self.stats)
        send_report((self.trace.table(), stats, self.step_times))
        if self.out is not None:
            folder = prepare_folder(self.out)
            per_mb = self.trace.per_micro_batch
            path = folder / f"trace-rank{self.rank}.csv"
            write_trace(path, self.trace.table(), per_mb, charged=True)
        return RankResult(self.rank, RunRecord(summary=stats), np.zeros(0))

    def follow(self, message: Message) -> Message:
        """Run the job ``message`` gives; return the next message to act on."""
        assert self.mailbox is not None
        if asks_blocks(message):
            self.report(message)
        job = Job(
            message.job,
            message.version,
            message.payload,  # a view of the buffer the mailbox received it in, used once
            self.batch(message.job),
            max(1, message.units),
        )
        self.current = job
        self.stats.jobs += 1
        self.log.step = message.version
        injected = self.clock.unit_seconds(message.job, message.seconds, job.units)
        grad, loss, compute = self.compute(job, injected, self.zero + message.seconds)
        computed = time.perf_counter()
        if grad is None:
            self.stats.interrupted += 1
            following = self.newest()
        else:
            self.stats.finished += 1
            reply = Message(
                Kind.GRAD, self.index, job.job, job.version, job.units, 0, loss, compute, grad
            )
            self.outbox.send(reply, SERVER, UP)
            following = self.mailbox.take(self.timeout)
        self.time_step(job, compute, computed, following)
        return following

    def time_step(self, job: Job, compute: float, computed: float, following: Message) -> None:
        """Job ``job``'s step, from its JOB's coming to the next message's, in its parts
        (``telemetry.split_step``): after its compute, the worker waits for the next message;
        the seconds since that JOB left the server (its start, on this clock by the offset
        ``zero``) are its download, the collective's own, and the rest waited for the server
        (the other workers, its update); its wall seconds charge the trace's noncompute."""
        end = time.perf_counter()
        down = end - (self.zero + following.seconds) if following.kind is Kind.JOB else 0.0
        times = split_step(compute, job.slept, end - computed, down, end - self.mark)
        self.step_times.append({"job": job.job, **time_row(times)})
        self.trace.charge(job.job, times.wall)
        self.mark = end

    def compute(
        self, job: Job, injected: np.ndarray, deadline: float
    ) -> tuple[torch.Tensor | None, float, float]:
        """The units in order; (mean gradient, mean loss, seconds), or None if interrupted.

        ``deadline`` starts at the job's start (this clock) and moves on by each unit's
        injected seconds: a unit ends at its deadline or when its compute does, if later."""
        assert self.mailbox is not None
        task = self.world.task
        parts = np.array_split(job.batch, job.units)
        total = torch.zeros(self.dim, dtype=self.dtype)
        loss_sum, started = 0.0, time.perf_counter()
        times = np.full(job.units, np.nan)
        for u, part in enumerate(parts):
            if self.mailbox.wait(0.0):
                break
            began = time.perf_counter()
            loss, grad = task.grads(job.theta, part[None])
            self.stats.units_computed += 1
            deadline += injected[u]
            rest = deadline - time.perf_counter()
            waited = time.perf_counter()
            interrupted = self.mailbox.wait(rest)
            job.slept += time.perf_counter() - waited if rest > 0 else 0.0
            if interrupted:
                break  # interrupted during the injected rest: the unit does not count
            # a padded unit ends at its deadline (the timer's wake-up is no part of it)
            job.ends.append((deadline if rest > 0 else time.perf_counter()) - self.zero)
            times[u] = time.perf_counter() - began
            total += grad[0] * len(part)
            loss_sum += float(loss[0]) * len(part)
            job.done += 1
        self.record_trace(job, times)
        if job.done < job.units:
            return None, math.nan, time.perf_counter() - started
        n = len(job.batch)
        return total / n, loss_sum / n, time.perf_counter() - started

    def record_trace(self, job: Job, times: np.ndarray) -> None:
        """Rows for ``trace:`` (iteration = the job, the delay process's row): each unit
        with micro-batches, else the whole job's seconds once it finished."""
        if self.trace.per_micro_batch:
            self.trace.add(job.job, job.units, 1, times)
        elif job.done == job.units:
            self.trace.add(job.job, 1, 1, np.array([times.sum()]))

    def newest(self) -> Message:
        """After an interrupt: the newest message; the JOBs it overtook that ask for blocks
        are answered in order (each JOB with blocks gets exactly one PARTIAL)."""
        assert self.mailbox is not None
        message = self.mailbox.take(self.timeout)
        while message.kind is Kind.JOB and self.mailbox.wait(0.0):
            if asks_blocks(message):
                self.report(message)
            message = self.mailbox.take(self.timeout)
        return message

    def report(self, message: Message) -> None:
        """LGC Eq. (6): r of s blocks of job ``cancels`` done by the step's close (the start
        of the interrupting job, on the server's clock), and the mean gradient over them (the
        first r/s of the mini-batch, as simulated). r < s: a job still running at the close
        has not finished, even if its GRAD crossed the interrupt on the wire.
        """
        s, job = message.blocks, self.current
        r = 0  # a job never started (overtaken in the mailbox) did nothing
        if job is not None and message.cancels == job.job:
            close = message.seconds  # the interrupt's job starts at the close
            done = sum(end <= close for end in job.ends)
            r = min(s * done // job.units, s - 1)
        grad, loss, version = torch.zeros(self.dim, dtype=self.dtype), 0.0, message.version - 1
        if r > 0:
            size = max(1, round(len(job.batch) * r / s))
            losses, grads = self.world.task.grads(job.theta, job.batch[None, :size])
            grad, loss, version = grads[0], float(losses[0]), job.version
        reply = Message(Kind.PARTIAL, self.index, message.cancels, version, r, s, loss, 0.0, grad)
        self.outbox.send(reply, SERVER, UP)
        self.stats.partial_reports += 1


def asks_blocks(message: Message) -> bool:
    """A JOB interrupting a job whose finished blocks the server wants (LGC)."""
    return message.kind is Kind.JOB and message.blocks > 0 and message.cancels >= 0


def work(config: TrainConfig, world: World, comm: Collectives) -> RankResult:
    """Rank w + 1: worker w."""
    worker = Worker(world, comm.rank - 1, config.inject, config.timeout, config.out)
    worker.warm_up()
    comm.barrier()
    return drive_rank(worker, comm.drill)
