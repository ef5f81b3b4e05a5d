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
PROCESS_FAULTS = ("kill", "freeze")
KINDS = (*VALUES, *PROCESS_FAULTS)
USAGE = "nan:worker=W,step=S, inf:..., kill:worker=W,step=S or freeze:worker=W,step=S,seconds=X"


@dataclass(frozen=True)
class Fault:
    """One drill: ``kind`` hits worker ``worker`` at update ``step`` (``seconds``: freeze)."""

    kind: str
    worker: int
    step: int
    seconds: float = 0.0

    @property
    def value(self) -> float:
        """The value a numeric fault puts in the gradient."""
        return VALUES[self.kind]

    @property
    def numeric(self) -> bool:
        return self.kind in VALUES

    def describe(self) -> str:
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
        cls, texts: Sequence[str] | None, workers: int, kinds: Sequence[str] = KINDS
    ) -> FaultPlan:
        """The faults ``texts`` give, each checked against the scenario's ``workers``."""
        faults = tuple(parse_fault(t, kinds) for t in texts or ())
        for fault in faults:
            if fault.worker >= workers:
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

    def process_faults(self, worker: int, first: int, last: int) -> list[Fault]:
        """The kills and freezes of ``worker`` at updates ``first`` to ``last``, in the order
        they hit: by update, and a kill before a freeze of the same update."""
        hits = [f for f in self.faults if not f.numeric and f.worker == worker]
        hits = [f for f in hits if first <= f.step <= last]
        return sorted(hits, key=lambda f: (f.step, f.kind != "kill"))

    def describe(self) -> list[str]:
        return [f.describe() for f in self.faults]
