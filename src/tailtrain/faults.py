"""Fault drills: faults injected on purpose, to check that a run survives them.

``--inject-fault`` takes, repeatably:

* ``nan:worker=W,step=S`` (``inf:`` gives +infinity): worker W's gradient becomes NaN at
  update S. The value enters through the shared update path (``tailtrain.core.update``), where the
  non-finite screening drops it, so the simulator and the runtime exercise the same code. A
  fault whose worker contributes no gradient to update S injects nothing.
* ``kill:worker=W,step=S`` (``train`` only): worker W's process is killed (SIGKILL, no
  clean-up) when it starts work for update S.
* ``freeze:worker=W,step=S,seconds=X`` (``train`` only): worker W's process hangs for X
  seconds when it starts work for update S, then goes on.
* ``raise:rank=R,step=S`` (``train`` only): rank R raises ``InjectedFault`` when it starts
  work for update S (torchft's ``fail_at(rank, step)``), as a bug in it would. It names a
  rank, not a worker, so it can hit a parameter server (rank 0; worker W is rank W + 1
  there). Every topology meets it where it meets a kill (``runtime.inject.FaultDrill``).

"Update S" is the step the worker's work is for: the round of an allreduce or a partial
collective, the model version of a parameter-server job.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tailtrain.errors import UsageError
from tailtrain.spec import parse_spec

#: fault name -> the value it puts in the gradient
VALUES = {"nan": math.nan, "inf": math.inf}
#: faults of a worker's process: they need real processes (`tailtrain train`)
PROCESS_FAULTS = ("kill", "freeze", "raise")
KINDS = (*VALUES, *PROCESS_FAULTS)
USAGE = (
    "nan:worker=W,step=S, inf:..., kill:worker=W,step=S, freeze:worker=W,step=S,seconds=X "
    "or raise:rank=R,step=S"
)
#: the order in which process faults of one update hit
ORDER = {"kill": 0, "raise": 1, "freeze": 2}


@dataclass(frozen=True)
class Fault:
    """One drill: ``kind`` hits worker ``worker`` at update ``step`` (``seconds``: freeze);
    a ``raise`` hits rank ``rank`` (its ``worker`` is -1)."""

    kind: str
    worker: int
    step: int
    seconds: float = 0.0
    rank: int = -1

    @property
    def value(self) -> float:
        """The value a numeric fault puts in the gradient."""
        return VALUES[self.kind]

    @property
    def numeric(self) -> bool:
        return self.kind in VALUES

    def describe(self) -> str:
        if self.kind == "raise":
            return f"raise:rank={self.rank},step={self.step}"
        text = f"{self.kind}:worker={self.worker},step={self.step}"
        return text + (f",seconds={self.seconds:g}" if self.kind == "freeze" else "")


def parse_fault(text: str, kinds: Sequence[str] = KINDS) -> Fault:
    """One ``--inject-fault`` value; ``kinds`` are the faults the command can drill."""
    spec = parse_spec(text, what="fault")
    if spec.name not in KINDS:
        raise UsageError(f"unknown fault {spec.name!r} in {text!r}; give {USAGE}")
    if spec.name not in kinds:
        raise UsageError(
            f"--inject-fault {text}: {spec.name} needs real processes; drill it with "
            f"`tailtrain train` (here: {', '.join(kinds)})"
        )
    if spec.name == "raise":
        spec.require_known(("rank", "step"))
        rank, step = spec.get_int("rank", minimum=0), spec.get_int("step", minimum=0)
        return Fault("raise", -1, step, rank=rank)
    freeze = spec.name == "freeze"
    spec.require_known(("worker", "step", "seconds") if freeze else ("worker", "step"))
    seconds = 0.0
    if freeze:
        seconds = spec.get_float("seconds", positive=True)  # missing: says "add seconds=..."
        if not seconds < math.inf:
            raise UsageError(f"--inject-fault {text}: seconds must be finite and > 0")
    worker, step = spec.get_int("worker", minimum=0), spec.get_int("step", minimum=0)
    return Fault(spec.name, worker, step, seconds)


@dataclass(frozen=True)
class FaultPlan:
    """The faults of a run, by update."""

    faults: tuple[Fault, ...] = ()

    @classmethod
    def parse(
        cls,
        texts: Sequence[str] | None,
        workers: int,
        kinds: Sequence[str] = KINDS,
        ranks: int | None = None,
    ) -> FaultPlan:
        """The faults ``texts`` give, each checked against the scenario's ``workers`` and the
        job's ``ranks`` (default: one per worker; a parameter server adds rank 0)."""
        faults = tuple(parse_fault(t, kinds) for t in texts or ())
        ranks = workers if ranks is None else ranks
        for fault in faults:
            if fault.kind == "raise" and fault.rank >= ranks:
                server = " (rank 0 is the parameter server)" if ranks > workers else ""
                raise UsageError(
                    f"--inject-fault {fault.describe()}: rank {fault.rank} does not exist; "
                    f"ranks are 0..{ranks - 1}{server}"
                )
            if fault.kind != "raise" and fault.worker >= workers:
                raise UsageError(
                    f"--inject-fault {fault.describe()}: worker {fault.worker} does not exist; "
                    f"workers are 0..{workers - 1}"
                )
        return cls(faults)

    def at(self, step: int) -> tuple[np.ndarray, np.ndarray] | None:
        """(workers, values) of the numeric faults at update ``step``, or None; a worker named
        twice gets the last value given."""
        here = {f.worker: f.value for f in self.faults if f.numeric and f.step == step}
        if not here:
            return None
        workers = np.array(sorted(here), dtype=np.int64)
        return workers, np.array([here[w] for w in workers.tolist()])

    def value(self, worker: int, step: int) -> float | None:
        """The value worker ``worker``'s gradient of update ``step`` becomes, or None."""
        hit = self.at(step)
        if hit is None or worker not in hit[0]:
            return None
        return float(hit[1][np.searchsorted(hit[0], worker)])

    def process_faults(
        self, worker: int | None, first: int, last: int, rank: int | None = None
    ) -> list[Fault]:
        """The kills and freezes of ``worker`` and the raises of ``rank`` (None: none) at
        updates ``first`` to ``last``, in the order they hit: by update, and a kill before a
        raise before a freeze of the same update."""
        hits = [
            f
            for f in self.faults
            if (f.rank == rank if f.kind == "raise" else f.worker == worker and not f.numeric)
        ]
        hits = [f for f in hits if first <= f.step <= last]
        return sorted(hits, key=lambda f: (f.step, ORDER[f.kind]))

    def describe(self) -> list[str]:
        return [f.describe() for f in self.faults]
