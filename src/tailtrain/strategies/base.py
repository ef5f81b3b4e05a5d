"""The protocol every straggler strategy follows: small pure decision rules over events.

A strategy never reads a clock, never touches a tensor and never does I/O. Engines (the
virtual-clock simulator, the torch.distributed runtime) feed it arrival records, in which time
is data, and scalar statistics that any rank can obtain with an allreduce. It answers with
numbers: how many arrivals close a step (``plan``), who counts with which weight
(``select``) and how its own parameters evolve (``adapt``). Because the same functions run in
every engine, the simulator and the runtime agree by construction.

The shape follows optax's ``GradientTransformation``: explicit state goes in and comes out.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, ClassVar, overload

import numpy as np

from tailtrain.errors import UsageError
from tailtrain.strategies.state import from_state_dict, to_state_dict


class Topology(StrEnum):
    """How the workers exchange gradients; each engine family maps it to its own engine."""

    #: a server collects arrivals and broadcasts versions (slow-and-stale, DBW, LGC)
    PARAMETER_SERVER = "parameter-server"
    #: every worker joins one allreduce per round (DropCompute, Local-SGD)
    ALLREDUCE = "allreduce"
    #: an allreduce that completes without the late processes (eager-SGD)
    PARTIAL_COLLECTIVE = "partial-collective"


class SyncMode(StrEnum):
    """How a parameter server and its workers synchronise (DBW §2)."""

    #: push & wait: late workers finish their current gradient, then take the newest version
    PSW = "psw"
    #: push & interrupt: a new version interrupts every computation in progress
    PSI = "psi"
    #: pull: an idle worker pulls the newest version at once, even the one it just used; where
    #: stale gradients are dropped this is DBW's PI with its queue of n tokens per update
    #: (DBW §2, footnote 3), else K-batch-async's unlimited pull (slow-and-stale §II-C)
    PULL = "pull"
    #: pull while the version lasts, interrupted by the update (slow-and-stale K-batch-sync)
    PULL_INTERRUPT = "pull-interrupt"

    @property
    def interrupts(self) -> bool:
        return self in (SyncMode.PSI, SyncMode.PULL_INTERRUPT)

    @property
    def refills(self) -> bool:
        """Whether a worker that delivered restarts at once on the newest version it can get."""
        return self in (SyncMode.PULL, SyncMode.PULL_INTERRUPT)


@dataclass(frozen=True)
class Arrival:
    """One delivered piece of work, as the engine observed it.

    ``units`` is the fraction of a full mini-batch the work covers: 1 for a whole gradient,
    r/s for LGC's r of s blocks (LGC Eq. 6), completed/M micro-batches for DropCompute.
    """

    worker: int
    version: int
    start: float
    finish: float
    units: float = 1.0
    partial: bool = False


class ArrivalColumns(Sequence[Arrival]):
    """Arrivals stored as numpy columns; a ``Sequence[Arrival]`` that builds records on demand.

    Engines at thousands of workers hand these to rules so that a rule which only needs a
    count or a column (``.finish``, ``.version``) never pays for per-arrival Python objects.
    """

    __slots__ = ("finish", "partial", "start", "units", "version", "worker")

    def __init__(
        self,
        worker: np.ndarray,
        version: np.ndarray,
        start: np.ndarray,
        finish: np.ndarray,
        units: np.ndarray | None = None,
        partial: np.ndarray | None = None,
    ) -> None:
        n = len(worker)
        self.worker = np.asarray(worker, dtype=np.int64)
        self.version = np.asarray(version, dtype=np.int64)
        self.start = np.asarray(start, dtype=np.float64)
        self.finish = np.asarray(finish, dtype=np.float64)
        self.units = np.ones(n) if units is None else np.asarray(units, dtype=np.float64)
        self.partial = np.zeros(n, bool) if partial is None else np.asarray(partial, dtype=bool)

    def __len__(self) -> int:
        return len(self.worker)

    @overload
    def __getitem__(self, i: int) -> Arrival: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[Arrival]: ...
    def __getitem__(self, i: int | slice) -> Arrival | Sequence[Arrival]:
        if isinstance(i, slice):
            return self.take(np.arange(len(self))[i])
        return Arrival(
            worker=int(self.worker[i]),
            version=int(self.version[i]),
            start=float(self.start[i]),
            finish=float(self.finish[i]),
            units=float(self.units[i]),
            partial=bool(self.partial[i]),
        )

    def take(self, index: np.ndarray) -> ArrivalColumns:
        return ArrivalColumns(
            self.worker[index],
            self.version[index],
            self.start[index],
            self.finish[index],
            self.units[index],
            self.partial[index],
        )

    @staticmethod
    def concat(parts: Sequence[ArrivalColumns]) -> ArrivalColumns:
        cols = ("worker", "version", "start", "finish", "units", "partial")
        return ArrivalColumns(*(np.concatenate([getattr(p, c) for p in parts]) for c in cols))


@dataclass(frozen=True)
class Context:
    """What a strategy may know about the run before it starts."""

    n_workers: int
    lr: float = 0.1
    iterations_per_epoch: int = 1
    seed: int = 0


@dataclass(frozen=True)
class Plan:
    """The engine's instructions for the next step.

    ``k`` usable arrivals close the step. ``accept_stale`` says whether a gradient computed at
    an older version is usable (K-async family) or dropped (K-sync family). ``partial_blocks``
    > 0 asks the engine to collect the stragglers' partial work in that many blocks (LGC).
    """

    k: int
    mode: SyncMode
    accept_stale: bool = False
    lr_scale: float = 1.0
    partial_blocks: int = 0
    complete_stragglers: bool = False
    #: allreduce engine: compute threshold tau, seconds per round (DropCompute Alg. 1); inf: none
    threshold: float = float("inf")
    #: allreduce engine: True stops a worker at tau (Alg. 1), False lets its micro-batch finish
    preempt: bool = True
    #: allreduce engine: micro-batches per local step; None keeps the scenario's M
    micro_batches: int | None = None
    #: allreduce engine: local steps between two model averages (Local-SGD period H)
    local_steps: int = 1
    #: allreduce engine: run this multiple of the scenario's iterations (DropCompute Sec. 4.5)
    iteration_scale: float = 1.0
    #: allreduce engine: dropped micro-batches go back to the worker's queue (Sec. 4.5)
    requeue_dropped: bool = False


@dataclass(frozen=True)
class Selection:
    """Weights over the step's arrivals: ``now`` enters this update, ``later`` the next one.

    The update is ``-lr * (sum_i now[i] g_i + deferred)`` where ``deferred`` is the previous
    step's ``sum_i later[i] g_i``. That expresses mean-of-K, weighted micro-batch averages and
    LGC's one-step-delayed compensation (LGC Eq. 7) without the rule touching a tensor.
    """

    now: dict[int, float]
    later: dict[int, float] = field(default_factory=dict)


@dataclass(frozen=True)
class StepStats:
    """Scalars about a finished step, all obtainable by an allreduce of per-rank scalars.

    ``arrivals`` holds every arrival since the previous update, late and stale ones included
    (DBW's time estimator uses them); ``used`` indexes the ones that entered the update.
    ``grad_sq_sum`` is sum_i ||g_i||^2 and ``mean_grad_sq`` is ||mean_i g_i||^2 over ``used``.
    """

    step: int
    version: int
    time: float
    k: int
    arrivals: tuple[Arrival, ...]
    used: tuple[int, ...]
    loss: float = float("nan")
    grad_sq_sum: float = float("nan")
    mean_grad_sq: float = float("nan")
    lr: float = float("nan")
    #: allreduce engine: (N, U) measured seconds of each worker's units, NaN where not computed
    micro_batch_times: np.ndarray | None = None
    #: allreduce engine: the round's measured communication time T^c
    comm_time: float = float("nan")


class Strategy(ABC):
    """A straggler strategy: ``init`` / ``plan`` / ``select`` / ``adapt`` over explicit state."""

    #: registry name, e.g. ``"k-sync"``
    name: str
    #: how its workers exchange gradients; the engine family picks its engine from it
    topology: ClassVar[Topology] = Topology.PARAMETER_SERVER

    @abstractmethod
    def init(self, ctx: Context) -> Any:
        """Return the initial state."""

    @abstractmethod
    def plan(self, state: Any) -> Plan:
        """How the next step runs: how many arrivals to wait for, and how."""

    def select(self, state: Any, arrivals: Sequence[Arrival]) -> Selection:
        """Who counts: by default every usable arrival with equal weight (mean of K)."""
        del state
        return equal_weights(arrivals)

    def adapt(self, state: Any, stats: StepStats) -> Any:
        """Update the state after a step; static strategies keep it."""
        del stats
        return state

    def state_dict(self, state: Any) -> dict[str, Any]:
        """``state`` as plain tensors, numbers, strings, lists and dicts (no process group, no
        pickle), which ``torch.load(weights_only=True)`` reads back."""
        return {"strategy": self.describe(), "state": to_state_dict(state)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> Any:
        """The state :meth:`state_dict` wrote; refuses a state of another strategy."""
        if state_dict.get("strategy") != self.describe():
            raise UsageError(
                f"the saved strategy state is {state_dict.get('strategy')!r}, not "
                f"{self.describe()!r}; resume with the strategy that wrote it"
            )
        return from_state_dict(state_dict["state"])

    def micro_batch_capacity(self, micro_batches: int | None) -> int | None:
        """The most micro-batches a step may ask for, given the scenario's M; engines size
        their delay draws with it before the first step. Most rules never change M."""
        return micro_batches

    def describe(self) -> str:
        return self.name


def equal_weights(arrivals: Sequence[Arrival]) -> Selection:
    """Mean of the given whole arrivals (DBW Eq. 4; slow-and-stale Eq. 2)."""
    if isinstance(arrivals, ArrivalColumns):
        whole = np.flatnonzero(~arrivals.partial).tolist()
    else:
        whole = [i for i, a in enumerate(arrivals) if not a.partial]
    return Selection(now=dict.fromkeys(whole, 1.0 / len(whole)) if whole else {})
