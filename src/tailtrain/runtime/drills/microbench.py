"""eager-SGD's collective microbenchmark (§7.1, Fig. 8) on real processes, and what it measures
of the network.

P local processes (gloo) run the four collectives in turn through one
:class:`~tailtrain.runtime.partial.collective.PartialCollective`, ``iterations`` rounds each: every
iteration they meet at a barrier, process p sleeps its skew (the worker pattern's delay, drawn
as ``sim.partial.microbench`` draws it: the same seconds), calls the collective with
``sendbuff = {1}`` and records the seconds inside the call. NAP is the number of processes that
contributed a gradient of the round's own step. Majority's initiators and quorum's K are the
simulator's.

It also measures the numbers of ``tailtrain.network.NetworkModel``, and writes ``direct`` as
the runtime's ``DIRECT_ACTIVATION`` (up to that many processes an initiator activates everyone
itself, one message after another in ``partners`` order; beyond, ⌈log2 P⌉ hops):

- ``hop`` and ``send``: from the activation times every process writes into its slot (one
  clock origin on one machine: ``runtime.partial.wire.shared_origin``), over the partial
  rounds with one initiator. Under direct activation a least-squares line through (m,
  activation of the initiator's m-th addressee - the initiator's activation): ``hop`` is its
  intercept, a one-way message latency (with the receiver's wake-up), ``send`` its slope, the
  cost of one more send; beyond, ``hop`` is the activation's reach / ⌈log2 P⌉ and ``send`` 0;
- ``overhead``: the mean seconds of a call whose round had already completed (it returns at
  once: the library's own per-call cost);
- ``allreduce``: the mean over rounds of the seconds from the simulator's reach to the return
  of the calls that waited for the round (the allreduce, the round's bookkeeping and the
  hand-off to the caller: what the simulator's one completion per round stands for). The
  simulator's reach is the last call in a synchronous round and, in a partial round, the
  activation + ``hop`` + (P - 1) ``send`` (beyond ``direct``: ⌈log2 P⌉ ``hop``): the latest of
  P - 1 noisy arrivals comes later than the fitted line's last point, and what the line
  leaves out is charged here, so the simulated completion is the measured one on average.

A first block of ``WARMUP`` synchronous rounds without skew is not counted (connections, caches).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist

from tailtrain.core.machine import max_local_workers
from tailtrain.delays import DelayProcess
from tailtrain.errors import UsageError
from tailtrain.network import NetworkModel
from tailtrain.runtime.launching.local import join_gloo, run_local
from tailtrain.runtime.partial.collective import (
    DIRECT_ACTIVATION,
    PartialCollective,
    partners,
)
from tailtrain.runtime.partial.wire import RoundResult, row
from tailtrain.strategies.eager import Collective, RoundPlan, majority_initiator
from tailtrain.topology.partial import BENCHMARKED, CollectiveStats, activation_hops

WARMUP = 4


@dataclass(frozen=True)
class RealBench:
    """The setup; ``quorum`` None means ⌈P/2⌉ (as the simulator's)."""

    procs: int = 8
    skew: str = "linear:step=0.005"
    iterations: int = 64
    quorum: int | None = None
    delay: str = "const:value=0"
    seed: int = 0
    timeout: float = 120.0

    def __post_init__(self) -> None:
        if not 2 <= self.procs <= max_local_workers():
            raise UsageError(f"--procs must be between 2 and {max_local_workers()} here")
        if self.iterations < 1:
            raise UsageError(f"--iterations must be >= 1, got {self.iterations}")
        if not 1 <= self.quorum_size <= self.procs:
            raise UsageError(f"--quorum {self.quorum} must be between 1 and --procs {self.procs}")

    @property
    def quorum_size(self) -> int:
        return -(-self.procs // 2) if self.quorum is None else self.quorum

    def plan(self, r: int) -> RoundPlan | None:
        """Round r: WARMUP synchronous rounds, then ``iterations`` of each collective."""
        if r < WARMUP:
            return RoundPlan(k=self.procs)
        phase, i = divmod(r - WARMUP, self.iterations)
        if phase >= len(BENCHMARKED):
            return None
        c = BENCHMARKED[phase]
        if c is Collective.ALLREDUCE:
            return RoundPlan(k=self.procs)
        if c is Collective.MAJORITY:
            return RoundPlan(
                k=1, collective=c, initiator=majority_initiator(self.seed, i, self.procs)
            )
        return RoundPlan(k=self.quorum_size if c is Collective.QUORUM else 1, collective=c)

    def skews(self) -> np.ndarray:
        """(iterations, P) seconds each process sleeps before its call, as simulated."""
        process = DelayProcess(self.delay, self.skew, self.seed, self.procs)
        return process.next_block(self.iterations)


@dataclass(frozen=True)
class RealResults:
    stats: dict[str, CollectiveStats]
    network: NetworkModel


def run_real_microbenchmark(bench: RealBench) -> RealResults:
    """Launch ``bench.procs`` local processes, run the benchmark, summarise rank 0's view."""
    by_rank = run_local(bench_rank, bench, bench.procs, bench.timeout)
    return summarise_bench(bench, [by_rank[r] for r in range(bench.procs)])


def bench_rank(bench: RealBench) -> dict:
    """One process of the benchmark: its latencies and outcomes, and its rounds' timings."""
    rank, procs = join_gloo(bench.timeout)
    rounds: list[tuple] = []

    def after_round(result: RoundResult) -> RoundPlan | None:
        rounds.append(round_summary(result))
        return bench.plan(result.index + 1)

    coll = PartialCollective(rank, procs, 1, bench.plan(0), after_round, timeout=bench.timeout)
    skews = np.vstack([np.zeros((WARMUP, procs)), np.tile(bench.skews(), (len(BENCHMARKED), 1))])
    calls: list[tuple[int, float, str, float]] = []
    one = torch.ones(1, dtype=torch.float64)
    r = 0
    while coll.plan(r) is not None:
        dist.barrier()
        time.sleep(float(skews[r, rank]))
        out = coll.call(r, one, row(r, r, coll.now(), coll.now(), 0.0, 1.0))
        calls.append((r, out.latency, out.kind.value, coll.now()))
        r += 1
    coll.close()
    dist.destroy_process_group()
    return {"calls": calls, "rounds": rounds}


def round_summary(result: RoundResult) -> tuple:
    """(round, NAP, activation, reach, this rank's allreduce done, then per rank: initiated
    (P), activated (P))."""
    nap = len(result.active)
    head = (result.index, nap, result.activation, result.reach, result.done)
    return head + tuple(result.slots[:, 0]) + tuple(result.slots[:, 1])


def summarise_bench(bench: RealBench, ranks: list[dict]) -> RealResults:
    """Mean latency per process and call and mean NAP of each collective; the network."""
    calls = np.array(
        [(r, lat, kind == "late", back) for d in ranks for r, lat, kind, back in d["calls"]]
    )
    rounds = np.array(ranks[0]["rounds"])  # identical on every rank but ``done``
    stats = {}
    for phase, c in enumerate(BENCHMARKED):
        low = WARMUP + phase * bench.iterations
        mine = (calls[:, 0] >= low) & (calls[:, 0] < low + bench.iterations)
        sel = slice(low, low + bench.iterations)
        stats[c.value] = CollectiveStats(float(calls[mine, 1].mean()), float(rounds[sel, 1].mean()))
    partial = slice(WARMUP + bench.iterations, WARMUP + len(BENCHMARKED) * bench.iterations)
    hop, send = activation_latency(rounds[partial], bench.procs)
    counted = calls[:, 0] >= WARMUP
    late = calls[counted & (calls[:, 2] > 0), 1]
    waited = calls[counted & (calls[:, 2] == 0)]
    reduce = completion_after_reach(bench, rounds, waited, hop, send)
    network = NetworkModel(
        hop=hop,
        overhead=float(late.mean()) if late.size else 0.0,
        allreduce=reduce,
        direct=DIRECT_ACTIVATION,
        send=send,
    )
    return RealResults(stats, network)


def completion_after_reach(
    bench: RealBench, rounds: np.ndarray, waited: np.ndarray, hop: float, send: float
) -> float:
    """Mean seconds from the simulator's reach to the waiting calls' return (module
    docstring), each round once."""
    index = waited[:, 0].astype(int)
    back = np.bincount(index, waited[:, 3]) / np.maximum(np.bincount(index), 1)
    held = np.unique(index)
    if bench.procs <= DIRECT_ACTIVATION:
        spread = hop + (bench.procs - 1) * send
    else:
        spread = hop * activation_hops(bench.procs)
    messages = held >= WARMUP + bench.iterations  # partial rounds; synchronous: the last call
    reach = np.where(messages, rounds[held, 2] + spread, rounds[held, 3])
    return float((back[held] - reach).mean())


def activation_latency(rounds: np.ndarray, procs: int) -> tuple[float, float]:
    """(hop, send) of the partial ``rounds`` (``round_summary`` rows; module docstring)."""
    if procs > DIRECT_ACTIVATION:
        spread = rounds[:, 3] - rounds[:, 2]
        return float(spread.mean() / activation_hops(procs)), 0.0
    initiated, activated = rounds[:, 5 : 5 + procs] > 0, rounds[:, 5 + procs :]
    one = initiated.sum(axis=1) == 1  # several solo initiators: whose message came first?
    places, delays = [], []
    for flags, times in zip(initiated[one], activated[one], strict=True):
        source = int(np.flatnonzero(flags)[0])
        for m, q in enumerate(partners(source, procs), start=1):
            places.append(m)
            delays.append(times[q] - times[source])
    return fit_line(np.array(places, dtype=np.float64), np.array(delays))


def fit_line(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """(intercept, slope) >= 0 of the least-squares line through (x, y); (0, 0) without data."""
    if y.size == 0:
        return 0.0, 0.0
    slope = float(np.polyfit(x, y, 1)[0]) if np.ptp(x) > 0 else 0.0
    slope = max(slope, 0.0)
    intercept = float(np.mean(y - slope * x))
    if intercept < 0:  # through the origin instead
        return 0.0, max(0.0, float(x @ y / (x @ x)))
    return intercept, slope
