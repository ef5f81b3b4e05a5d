"""How long a partial collective's rounds wait for a hung process (issue 14's drill).

P local processes (gloo) call one collective round after round, as the eager topology does
(compute ``compute`` seconds, call, adopt the latest result, go on from its round), for
``rounds`` rounds. At its ``at``-th call, rank ``rank``'s main thread hangs for ``seconds``
(a compute that stalls; its progress threads run on). What the semantics allow
(``runtime.partial.collective``):

- solo and quorum (K < P): the others' calls activate every round; the hung rank's reducer
  contributes its send buffer, so nobody waits for it. On return it is late: it adopts the
  latest result and goes on.
- majority: the same, except a round whose designated initiator is the hung rank: it cannot
  activate before that rank calls, so everyone waits up to ``seconds``.
- allreduce (the synchronous collective, and the staleness bound's rounds): everyone waits.

With ``whole`` the whole process stops (SIGSTOP, its progress threads too; a child sends
SIGCONT ``seconds`` later): every round's data phase needs its reducer, so every collective
waits for it. Every wait is bounded by ``timeout``: past it the collective raises
``CollectiveTimeout`` naming the rank, whether a wait for a round or a plan ran out or the
group's own timeout fired in a send, receive or reduction (whichever came first).
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import time
from dataclasses import dataclass

import numpy as np
import torch

from tailtrain.core.machine import max_local_workers
from tailtrain.errors import UsageError
from tailtrain.runtime.launching.local import join_gloo, run_local
from tailtrain.runtime.partial.collective import PartialCollective
from tailtrain.runtime.partial.wire import RoundResult, row
from tailtrain.strategies.eager import Collective, RoundPlan, majority_initiator


@dataclass(frozen=True)
class HangDrill:
    """The setup: which rank hangs, when, how long; quorum's K is P - 1."""

    procs: int = 4
    collective: Collective = Collective.SOLO
    rank: int = 1
    at: int = 5
    seconds: float = 2.0
    rounds: int = 120
    compute: float = 0.01
    whole: bool = False
    seed: int = 0
    timeout: float = 60.0

    def __post_init__(self) -> None:
        if not 2 <= self.procs <= max_local_workers():
            raise UsageError(f"--procs must be between 2 and {max_local_workers()} here")
        if not 0 <= self.rank < self.procs:
            raise UsageError(f"the hung rank {self.rank} must be below --procs {self.procs}")
        if not 0 <= self.at < self.rounds:
            raise UsageError(f"the hang's call {self.at} must be below the {self.rounds} rounds")
        for name, value in (("--seconds", self.seconds), ("--compute", self.compute)):
            if not (math.isfinite(value) and value >= 0):
                raise UsageError(f"{name} must be a finite number of seconds >= 0, got {value}")
        if not (math.isfinite(self.timeout) and self.timeout > 0):
            raise UsageError(f"--timeout must be finite seconds > 0, got {self.timeout}")

    def plan(self, r: int) -> RoundPlan | None:
        c, n = self.collective, self.procs
        if r >= self.rounds:
            return None
        if c is Collective.MAJORITY:
            return RoundPlan(k=1, collective=c, initiator=majority_initiator(self.seed, r, n))
        if c is Collective.QUORUM:
            return RoundPlan(k=n - 1, collective=c)
        return RoundPlan(k=1 if c is Collective.SOLO else n, collective=c)


def hang_rank(drill: HangDrill) -> dict:
    """One process: its calls (round, began, seconds inside, kind, adopted round), its hang,
    and (rank 0) every round's close and initiators."""
    rank, procs = join_gloo(drill.timeout)
    rounds: list[tuple[int, float, list[int]]] = []

    def after_round(result: RoundResult) -> RoundPlan | None:
        rounds.append((result.index, result.closed, result.initiators.tolist()))
        return drill.plan(result.index + 1)

    coll = PartialCollective(rank, procs, 1, drill.plan(0), after_round, timeout=drill.timeout)
    calls, hung, step, n = [], (np.nan, np.nan), 0, 0
    one = torch.ones(1, dtype=torch.float64)
    while coll.plan(step) is not None:
        if rank == drill.rank and n == drill.at:
            began = coll.now()
            hang(drill.seconds, drill.whole)
            hung = (began, coll.now())
        else:
            time.sleep(drill.compute)
        began = coll.now()
        out = coll.call(step, one, row(n, step, began, began, 0.0, 1.0))
        calls.append((step, began, out.latency, out.kind.value, out.result.index))
        step, n = out.result.index + 1, n + 1
    closing = coll.now()
    coll.close()
    return {"calls": calls, "hung": hung, "rounds": rounds, "close": coll.now() - closing}


def hang(seconds: float, whole: bool) -> None:
    """Hang this process's main thread, or (``whole``) the whole process, for ``seconds``."""
    if not whole:
        time.sleep(seconds)
        return
    waker = subprocess.Popen(["sh", "-c", f"sleep {seconds}; kill -CONT {os.getpid()}"])
    os.kill(os.getpid(), signal.SIGSTOP)
    waker.wait()


def summarise_hang(drill: HangDrill, ranks: list[dict]) -> dict:
    """What the others waited and did while ``drill.rank`` hung, and how it came back."""
    start, end = ranks[drill.rank]["hung"]
    others = [d for r, d in enumerate(ranks) if r != drill.rank]
    waits = np.array([c[2] for d in others for c in d["calls"]])
    closed = np.array([c for _, c, _ in ranks[0]["rounds"]])
    back = next(c for c in ranks[drill.rank]["calls"] if c[1] >= end)
    return {
        "collective": drill.collective.value,
        "hung_seconds": end - start,
        "longest_wait": float(waits.max()),
        "mean_wait": float(waits.mean()),
        "rounds_while_hung": int(((closed > start) & (closed < end)).sum()),
        "returned": {"kind": back[3], "called": back[0], "adopted": back[4]},
        "longest_close": max(d["close"] for d in ranks),
    }


def run_hang_drill(drill: HangDrill) -> dict:
    by_rank = run_local(hang_rank, drill, drill.procs, drill.timeout)
    return summarise_hang(drill, [by_rank[r] for r in range(drill.procs)])
