"""The allreduce topology's ledger, shared by the simulator (``sim.allreduce``) and the runtime
(``runtime.allreduce``, ``integrate``): a round's arrivals, how a
plan becomes an allreduce round, what a worker's units leave it (:class:`Stops`) and its
gradient G_n = H A_n / C_n, the round data every rank keeps (:class:`RoundData`), and a
round's record row and the run's summary (its ``StepStats``: ``core.update.closed_step_stats``).
Only the clocks differ between the two engines: ``sim.allreduce.timing`` stops units on a
virtual one, ``runtime.units`` on the wall clock.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from tailtrain.core.records import RunRecord
from tailtrain.errors import TailtrainError
from tailtrain.strategies.base import AllreducePlan, ArrivalColumns, Plan, StepStats
from tailtrain.tasks.stream import CarryOver, Draws, deal


def round_arrivals(
    step: int,
    now: float,
    done: np.ndarray,
    compute: np.ndarray,
    units: int,
    workers: np.ndarray | int | None = None,
) -> ArrivalColumns:
    """An allreduce round's arrivals from gathered per-rank counts C_n and compute seconds
    T~_n. Built from gathered rows, they are identical on every rank. ``workers``: the ranks
    the rows are (default: all, in order; :func:`own_arrival`: one).

    Rank n's r-th round is its r-th job, from model r, a fraction C_n / units of a full one.
    """
    n = len(done)
    ints = np.empty((3, n), dtype=np.int64)  # worker, job, version: one array, three rows
    ints[0] = np.arange(n) if workers is None else workers
    ints[1:] = step
    floats = np.empty((3, n))  # start, finish, units
    floats[0] = now
    np.add(compute, now, out=floats[1])
    np.divide(done, units, out=floats[2])
    return ArrivalColumns.trusted(*ints, *floats, np.zeros(n, bool))


def own_arrival(
    step: int, now: float, rank: int, done: int, compute: float, units: int
) -> ArrivalColumns:
    """This rank's row of :func:`round_arrivals`, known before anything is exchanged."""
    return round_arrivals(step, now, (done,), (compute,), units, rank)


def as_allreduce(plan: Plan) -> AllreducePlan:
    """An allreduce rule's plan; another topology's plan is refused (its rule declares that
    topology, so ``check_topology`` refuses it before any rank starts)."""
    if isinstance(plan, AllreducePlan):
        return plan
    raise TailtrainError(f"a plan {plan!r} needs a topology other than allreduce")


@dataclass(frozen=True)
class Stops:
    """Per worker: units done ``done``, compute seconds ``compute`` and ``full`` = T_n^(U);
    ``dealt``: the micro-batches each was dealt on demand (None: its share)."""

    done: np.ndarray
    compute: np.ndarray
    full: np.ndarray
    dealt: np.ndarray | None = None


def worker_grads(total: torch.Tensor, done: np.ndarray, local_steps: int) -> torch.Tensor:
    """G_n = H * A_n / C_n, and 0 for a worker that completed nothing."""
    if len(done) == 1:
        return worker_grad(total, int(done[0]), local_steps)
    if local_steps == 1 and bool((done == 1).all()):  # G_n = A_n: no pass over G
        return total
    counts = torch.from_numpy(np.maximum(done, 1).astype(np.float64)).to(total.dtype)
    grads = local_steps * total / counts[:, None]
    if done.all():  # the common round: nothing to zero
        return grads
    return torch.where(torch.from_numpy(done > 0)[:, None], grads, 0.0)


def worker_grad(total: torch.Tensor, done: int, local_steps: int) -> torch.Tensor:
    """One worker's G_n = H * A_n / C_n (a rank's own, in the runtime): scalar arithmetic,
    no index tensors; A_n itself when H = C_n = 1."""
    if done == 0:
        return torch.zeros_like(total)
    return total if local_steps == done == 1 else local_steps * total / float(done)


class RoundData:
    """Parameters and per-worker data queues of allreduce rounds: every worker's micro-batches
    (re-queued ones first), kept alike by the simulator (``sim.allreduce.learner``) and by
    every rank of the runtime."""

    def __init__(self, task, partition_state, lr: float, seed: int, n_workers: int) -> None:
        self.task = task
        self.partition = partition_state
        self.lr = lr
        self.seed = seed
        self.theta: torch.Tensor = task.init_params(seed)
        self.queues: list[list[np.ndarray]] = [[] for _ in range(n_workers)]
        self.drawn = Draws(partition_state, seed, task.batch_size, n_workers)
        #: a carried cut's micro-batches, dealt first in the next step (``carry_cut``)
        self.carry = CarryOver()

    def batches(self, round_index: int, units: int) -> np.ndarray:
        """Sample indices (N, U, B) of every worker's units: re-queued ones first, then fresh.
        Read-only: with nothing re-queued it is a view of the draws kept for later rounds."""
        drawn = self.drawn.round(round_index, units)
        if not any(self.queues):  # nothing dropped and re-queued: the fresh draws as they are
            return drawn
        out = []
        for worker, queue in enumerate(self.queues):
            fresh = drawn[worker]
            taken, self.queues[worker] = queue[:units], queue[units:]
            queued = np.asarray(taken, dtype=fresh.dtype).reshape(-1, fresh.shape[1])
            out.append(np.concatenate([queued, fresh])[:units])
        return np.stack(out)

    def dealt(
        self,
        round_index: int,
        m: int,
        shares: np.ndarray,
        carries: bool,
        members: Sequence[int] | None = None,
    ) -> np.ndarray:
        """Sync's global batch of round ``round_index`` dealt by ``shares``
        (``tasks.stream.deal``; out (N, max share, B)), the micro-batches the last step's
        threshold cut first when the plan ``carries`` them (``tasks.stream.CarryOver``). Both
        engines deal here, so simulate and train carry alike. ``members``: after a shrink,
        the live ranks whose shards make the global batch (``Rebalance.follow_world``; a
        carried cut refuses shrinking, its cut would have no owner)."""
        if carries:
            if members is not None:
                raise TailtrainError("a carried cut cannot follow a shrinking world")
            return deal(self.carry.global_batch(self.drawn, len(shares), m), shares)
        batches = self.batches(round_index, m)
        return deal(batches if members is None else batches[list(members)], shares)

    def on_demand(self, index: np.ndarray, done: np.ndarray, m: int) -> np.ndarray:
        """A step dealt on demand (``strategies.rebalance.on_demand``): its k-th dealt unit
        takes the k-th micro-batch of the carried ones then the fresh stream
        (``CarryOver.take``), and each rank's dealt units past its ``done`` count are
        carried to the next step. Out (N, most dealt, B), each rank's in its units' order;
        rows past a rank's dealt units repeat its last (or the step's first) micro-batch and
        are never computed. ``index`` and ``done`` are the ranks' that took part (after a
        shrink, the live ones); the stream is the job's N ranks' global batches either way."""
        dealt = np.count_nonzero(index >= 0, axis=1)
        rows = self.carry.take(self.drawn, self.drawn.n, m, int(dealt.sum()))
        width = max(int(dealt.max()), 1)
        unit = np.minimum(np.arange(width)[None, :], np.maximum(dealt, 1)[:, None] - 1)
        at = np.take_along_axis(index, unit, axis=1)
        out = rows[np.maximum(at, 0)]
        units = np.arange(width)[None, :]
        # rank-major, each rank's units in order: what rank n left between done and dealt
        self.carry.keep(out[(units >= done[:, None]) & (units < dealt[:, None])])
        return out

    def carry_cut(self, dealt: np.ndarray, shares: np.ndarray, done: np.ndarray) -> int:
        """Keep what each rank of :meth:`dealt`'s round left undone (``done`` of its
        ``shares``) for the next step's global batch; how many micro-batches."""
        return self.carry.cut(dealt, shares, done)

    def requeue(self, batches: np.ndarray, done: np.ndarray) -> None:
        """Put every dropped micro-batch back at the end of its worker's queue (Sec. 4.5)."""
        for worker in np.flatnonzero(done < batches.shape[1]):
            self.queues[worker].extend(batches[worker, done[worker] :])


def step_row(
    plan: AllreducePlan, stats: StepStats, stops: Stops, used: list[int], m: int, comm: float
) -> dict[str, Any]:
    """A round's record row, both engines' (``sim.allreduce.engine``, ``runtime.allreduce``).
    A plan of per-rank shares (``strategies.rebalance``) adds ``shares``: the micro-batches
    each rank was dealt (``completed``: those it counted; on demand, ``Stops.dealt``).

    A round in which no rank counted a unit (a threshold below every rank's first unit:
    DropCompute's Algorithm 1 may break before the first micro-batch) adds ``empty``: true.
    Every weight C_n/(H M) is 0, so is sum_n w_n G_n, and the parameters stay as they were:
    no update, which is how Theorem 4.1 counts such an iteration (its iterations weigh by
    their total batch size, here 0). Its ``loss`` is NaN (null in ``steps.jsonl``): no
    mini-batch loss was measured, and none is made up."""
    n, units = stops.done.size, plan.local_steps * m
    # a plan of shares deals their sum: N M on demand, whatever the live count (a shrink)
    possible = n * units if plan.shares is None else int(sum(plan.shares))
    share = float(stops.done.sum()) / possible
    compute, sync = float(stops.compute.max()), float(stops.full.max())
    row = {
        "step": stats.step,
        "time": stats.time,
        "k": int(np.count_nonzero(stops.done)),
        "lr": stats.lr,
        "loss": stats.loss,
        "workers": used,
        "staleness": [0] * len(used),
        "threshold": plan.threshold,
        "micro_batches": m,
        "local_steps": plan.local_steps,
        "completed": stops.done.tolist(),
        "drop_rate": 1.0 - share,
        # Algorithm 2's S_i: samples per second relative to sync SGD on the same draws
        "s_eff": share * (sync + comm) / (compute + comm) if compute + comm > 0 else 1.0,
        "compute_time": compute,
        "comm_time": comm,
        "sync_time": sync + comm,
    }
    if n and not stops.done.any():  # nothing ran: no update (docstring)
        row["empty"] = True
    if plan.shares is not None:
        row["shares"] = list(plan.shares) if stops.dealt is None else stops.dealt.tolist()
    if plan.carry_cut:  # cut this step, dealt first in the next (``RoundData.carry_cut``)
        dealt = np.asarray(plan.shares) if stops.dealt is None else stops.dealt
        row["deferred"] = int((dealt - stops.done).sum())
    return row


def summarise(record: RunRecord) -> dict[str, Any]:
    """Run-level DropCompute figures: threshold in force at the end, drop rate and S_eff.

    ``effective_speedup`` is Eq. (6) over the run: the share of micro-batches computed times
    sum_i (T_i + T^c_i) / sum_i (T~_i + T^c_i), the ratio of throughputs with and without the
    threshold on the same draws (as ``theory.dropcompute.evaluate_threshold`` estimates it).
    A carried cut (rows with ``deferred``) adds ``deferred_rate``, the share of the dealt
    micro-batches computed a step later, and ``dropped_micro_batches``, those still carried
    when the run ended: the only ones never computed. Rounds that ran nothing (rows with
    ``empty``: no update) add ``empty_steps``, their count.
    """
    if not record.steps:
        return {"threshold": None, "drop_rate": math.nan, "effective_speedup": math.nan}
    # on demand after a shrink the live ranks complete the whole pool, N M > L M
    possible = np.array(
        [
            max(len(r["completed"]) * r["micro_batches"] * r["local_steps"], sum(r["completed"]))
            for r in record.steps
        ]
    )
    done = np.array([sum(r["completed"]) for r in record.steps])
    used = record.column("compute_time") + record.column("comm_time")
    share = done.sum() / possible.sum()
    out = {
        "threshold": float(record.steps[-1]["threshold"]),
        "drop_rate": float(1.0 - share),
        "effective_speedup": float(share * record.column("sync_time").sum() / used.sum())
        if used.sum() > 0
        else 1.0,
        "mean_completed": float(done.sum() / sum(len(r["completed"]) for r in record.steps)),
    }
    empty = sum(1 for row in record.steps if row.get("empty"))
    if empty:
        out["empty_steps"] = empty
    deferred = [row["deferred"] for row in record.steps if "deferred" in row]
    if deferred:
        out["deferred_rate"] = sum(deferred) / int(possible.sum())
        out["dropped_micro_batches"] = deferred[-1]
    return out
