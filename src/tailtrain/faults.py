"""Fault drills: bad numbers injected on purpose, to check that a run survives them.

``--inject-fault nan:worker=W,step=S`` makes worker W's gradient NaN at update S (``inf``
gives +infinity). The value enters through the shared update path
(``tailtrain.update.WeightedUpdate.inject``), where the non-finite screening drops it, so the
simulator and the runtime exercise the same code. A fault whose worker contributes no
gradient to update S injects nothing.
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


@dataclass(frozen=True)
class Fault:
    """Worker ``worker``'s gradient becomes ``value`` at update ``step``."""

    kind: str
    worker: int
    step: int

    @property
    def value(self) -> float:
        return VALUES[self.kind]

    def describe(self) -> str:
        return f"{self.kind}:worker={self.worker},step={self.step}"


def parse_fault(text: str) -> Fault:
    """``nan:worker=W,step=S`` or ``inf:worker=W,step=S``."""
    spec = parse_spec(text, what="fault")
    if spec.name not in VALUES:
        raise UsageError(
            f"unknown fault {spec.name!r} in {text!r}; give nan:worker=W,step=S or inf:..."
        )
    spec.require_known(("worker", "step"))
    return Fault(spec.name, spec.get_int("worker", minimum=0), spec.get_int("step", minimum=0))


@dataclass(frozen=True)
class FaultPlan:
    """The faults of a run, by update."""

    faults: tuple[Fault, ...] = ()

    @classmethod
    def parse(cls, texts: Sequence[str] | None, workers: int) -> FaultPlan:
        """The faults ``texts`` give, each checked against the scenario's ``workers``."""
        faults = tuple(parse_fault(t) for t in texts or ())
        for fault in faults:
            if fault.worker >= workers:
                raise UsageError(
                    f"--inject-fault {fault.describe()}: worker {fault.worker} does not exist; "
                    f"workers are 0..{workers - 1}"
                )
        return cls(faults)

    def at(self, step: int) -> tuple[np.ndarray, np.ndarray] | None:
        """(workers, values) to inject at update ``step``, or None; a worker named twice
        gets the last value given."""
        here = {f.worker: f.value for f in self.faults if f.step == step}
        if not here:
            return None
        workers = np.array(sorted(here), dtype=np.int64)
        return workers, np.array([here[w] for w in workers.tolist()])

    def describe(self) -> list[str]:
        return [f.describe() for f in self.faults]
