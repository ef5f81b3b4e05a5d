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
from typing import Any, ClassVar

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


class WeightContract(StrEnum):
    """What a rule's weight of an arrival in ``select`` may depend on. A topology can apply
    only weights it can know when it sums (``TOPOLOGY_APPLIES``), so a rule declares its
    contract and every entry checks it before any process starts. Each contract includes the
    ones above it."""

    #: every whole arrival weighs the same (partial arrivals: none); a partial collective
    #: sums its contributions before it knows who arrived
    EQUAL = "equal"
    #: an arrival's weight depends on its own counted units only (DropCompute Eq. 1: C_n/M);
    #: an allreduce carries w_n G_n, so a rank must know w_n before the others' arrivals
    OWN_COUNTS = "own-counts"
    #: any function of the step's arrivals; a parameter server holds them all before it sums
    ANY = "any"

    def within(self, limit: WeightContract) -> bool:
        """Whether weights of this contract also keep ``limit``'s."""
        order = list(WeightContract)
        return order.index(self) <= order.index(limit)


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


#: a job index must stay below 2^JOB_BITS for an arrival key to be unique
JOB_BITS = 40


class ArrivalColumns:
    """Arrivals as numpy columns: the one arrival type that reaches rules.

    An arrival is a delivered piece of work, keyed by ``(worker, job)``: worker w's j-th job
    (its j-th gradient, or its j-th round's work). ``version`` is the model step the work
    started from: the number of updates its model had seen (a parameter-server version, an
    allreduce round, a partial collective's step). ``units`` is the fraction of a full
    mini-batch the work covers: 1 for a whole gradient, r/s for LGC's r of s blocks (LGC
    Eq. 6), completed/M micro-batches for DropCompute; ``partial`` marks a straggler's
    unfinished work.
    """

    __slots__ = ("finish", "job", "partial", "start", "units", "version", "worker")

    def __init__(
        self,
        worker: np.ndarray,
        job: np.ndarray,
        version: np.ndarray,
        start: np.ndarray,
        finish: np.ndarray,
        units: np.ndarray | None = None,
        partial: np.ndarray | None = None,
    ) -> None:
        n = len(worker)
        self.worker = np.asarray(worker, dtype=np.int64)
        self.job = np.asarray(job, dtype=np.int64)
        self.version = np.asarray(version, dtype=np.int64)
        self.start = np.asarray(start, dtype=np.float64)
        self.finish = np.asarray(finish, dtype=np.float64)
        self.units = np.ones(n) if units is None else np.asarray(units, dtype=np.float64)
        self.partial = np.zeros(n, bool) if partial is None else np.asarray(partial, dtype=bool)

    @classmethod
    def of(
        cls,
        worker: Any,
        version: Any,
        start: Any,
        finish: Any,
        *,
        job: Any = None,
        units: Any = None,
        partial: Any = None,
    ) -> ArrivalColumns:
        """Arrivals from sequences; without ``job``, each arrival is its worker's job number
        ``position`` (distinct keys for hand-made arrivals)."""
        job = np.arange(len(worker)) if job is None else job
        return cls(worker, job, version, start, finish, units, partial)

    @classmethod
    def trusted(
        cls,
        worker: np.ndarray,
        job: np.ndarray,
        version: np.ndarray,
        start: np.ndarray,
        finish: np.ndarray,
        units: np.ndarray,
        partial: np.ndarray,
    ) -> ArrivalColumns:
        """Arrivals from columns already of the right dtypes (int64, float64, bool), taken as
        they are: an engine building them every round skips seven conversions that would
        each copy nothing."""
        self = cls.__new__(cls)
        self.worker, self.job, self.version = worker, job, version
        self.start, self.finish, self.units, self.partial = start, finish, units, partial
        return self

    @classmethod
    def empty(cls) -> ArrivalColumns:
        ints, floats = np.zeros(0, np.int64), np.zeros(0)
        return cls(ints, ints, ints, floats, floats)

    def __len__(self) -> int:
        return len(self.worker)

    @property
    def keys(self) -> np.ndarray:
        """One int64 per arrival, unique per ``(worker, job)``."""
        return arrival_keys(self.worker, self.job)

    def take(self, index: np.ndarray) -> ArrivalColumns:
        # the columns keep their dtypes: nothing to convert
        return ArrivalColumns.trusted(
            self.worker[index],
            self.job[index],
            self.version[index],
            self.start[index],
            self.finish[index],
            self.units[index],
            self.partial[index],
        )

    @staticmethod
    def concat(parts: Sequence[ArrivalColumns]) -> ArrivalColumns:
        columns = (np.concatenate([getattr(p, c) for p in parts]) for c in COLUMNS)
        return ArrivalColumns.trusted(*columns)


#: the columns of ``ArrivalColumns``, in constructor order
COLUMNS = ("worker", "job", "version", "start", "finish", "units", "partial")


def arrival_keys(worker: np.ndarray, job: np.ndarray) -> np.ndarray:
    """The key of ``(worker, job)`` pairs as one int64 each (jobs below 2^JOB_BITS)."""
    return (np.asarray(worker, dtype=np.int64) << JOB_BITS) | np.asarray(job, dtype=np.int64)


@dataclass(frozen=True)
class Context:
    """What a strategy may know about the run before it starts."""

    n_workers: int
    lr: float = 0.1
    iterations_per_epoch: int = 1
    seed: int = 0
    #: M, the micro-batches each rank computes per step (1 without micro-batches)
    micro_batches: int = 1
    #: the original ranks of a live world smaller or other than the job's, in order (a
    #: shrink: ``Strategy.follow_world``); None: every rank 0..n_workers-1
    live: tuple[int, ...] | None = None

    @property
    def ranks(self) -> tuple[int, ...]:
        """The original ranks of this world, in order (``live``, or 0..n_workers-1)."""
        return tuple(range(self.n_workers)) if self.live is None else tuple(self.live)


@dataclass(frozen=True)
class Plan:
    """The core of the engine's instructions for the next step, whatever the topology.

    ``k`` arrivals close the step (parameter server), or K is the quorum of a partial
    collective; an allreduce has every worker join (k = n). ``lr_scale`` multiplies the
    learning rate of the step's update (DBW §4's proportional rule).
    """

    k: int
    lr_scale: float = 1.0


@dataclass(frozen=True)
class ServerPlan(Plan):
    """A parameter-server step: ``k`` usable arrivals close it.

    ``accept_stale`` says whether a gradient computed at an older version is usable (K-async
    family) or dropped (K-sync family). ``partial_blocks`` > 0 asks the engine to collect the
    stragglers' partial work in that many blocks (LGC Alg. 1).
    """

    mode: SyncMode = SyncMode.PSI
    accept_stale: bool = False
    partial_blocks: int = 0
    #: stragglers finish their whole gradient (push & wait) and the next update waits for
    #: them too (LGC §III.B's assumption, charged its real time)
    complete_stragglers: bool = False


def usable(version: Any, current: Any, accept_stale: bool) -> Any:
    """Whether an arrival computed at model ``version`` can enter the step of model
    ``current``: a fresh one always, a stale one if the plan accepts it (K-async family,
    slow-and-stale Sec. 3; K-sync drops it). Scalars or arrays; one rule for both engines."""
    return accept_stale | (version == current)


def step_closes(count: int, k: int, waits_for_older: bool) -> bool:
    """A parameter-server step closes once ``count`` usable arrivals reach ``k`` (DBW Sec. 2),
    and not while it still waits for an older job (``waits_for_older``: the plan drains, as
    ``ServerPlan.complete_stragglers`` does, and a job of an older version is running)."""
    return count >= k and not waits_for_older


def uses_tokens(mode: SyncMode, accept_stale: bool) -> bool:
    """Pull with stale gradients dropped is DBW Sec. 2's PI, which runs on a token queue."""
    return mode is SyncMode.PULL and not accept_stale


@dataclass(frozen=True)
class AllreducePlan(Plan):
    """An allreduce round (DropCompute Alg. 1; Local-SGD, DropCompute App. B.3)."""

    #: compute threshold tau, seconds per round; inf: none
    threshold: float = float("inf")
    #: True stops a worker at tau (Alg. 1), False lets its unit in flight finish
    preempt: bool = True
    #: micro-batches per local step; None keeps the scenario's M
    micro_batches: int | None = None
    #: local steps between two model averages (Local-SGD period H)
    local_steps: int = 1
    #: run this multiple of the scenario's iterations (DropCompute Sec. 4.5)
    iteration_scale: float = 1.0
    #: dropped micro-batches go back to the worker's queue (Sec. 4.5)
    requeue_dropped: bool = False
    #: micro-batches of each rank, summing to N M: the global batch dealt by shares
    #: (``strategies.rebalance``); None: every rank computes ``micro_batches``
    shares: tuple[int, ...] | None = None
    #: micro-batches the threshold cut are dealt first in the next step's global batch
    #: (``tasks.stream.CarryOver``), so none is lost; needs ``shares``
    carry_cut: bool = False
    #: the stream's micro-batches go to whichever rank asks next until sum(shares) of them
    #: are complete (``strategies.rebalance.on_demand``); needs ``carry_cut``
    on_demand: bool = False


@dataclass(frozen=True, eq=False)
class Weighting:
    """Unnormalised weights of arrivals, by ``(worker, job)`` key, and their divisor.

    The weighted gradient is ``sum_i weight_i g_i / total``, with ``total`` the sum of the
    weights unless the rule fixes it (DropCompute's divide-by-M has total N, eager-SGD's Alg. 2
    total P). A runtime thus reduces ``[sum_i w_i g_i, sum_i w_i]`` in one allreduce.
    """

    keys: np.ndarray
    weight: np.ndarray
    total: float | None = None

    @classmethod
    def of(
        cls, arrivals: ArrivalColumns, index: np.ndarray, weight: Any, total: float | None = None
    ) -> Weighting:
        """Weights ``weight`` (a scalar or one per index) of ``arrivals[index]``."""
        index = np.asarray(index, dtype=np.int64)
        values = np.asarray(weight, dtype=np.float64)
        # np.full for the usual scalar: broadcast_to costs a rule's select ~8 us of ~25
        values = (
            np.full(index.shape, values)
            if values.ndim == 0
            else np.broadcast_to(values, index.shape).copy()
        )
        return cls(arrivals.keys[index], values, total)

    @classmethod
    def none(cls) -> Weighting:
        return cls(np.zeros(0, np.int64), np.zeros(0))

    def __len__(self) -> int:
        return len(self.keys)

    @property
    def divisor(self) -> float:
        return float(self.weight.sum()) if self.total is None else self.total

    def normalised(self) -> np.ndarray:
        """weight_i / total, the coefficient of g_i in the update."""
        return self.weight / (self.weight.sum() if self.total is None else self.total)

    def over(self, keys: np.ndarray) -> np.ndarray:
        """The normalised weights laid out along ``keys`` (0 where a key has none)."""
        if len(keys) == len(self.keys) and (keys == self.keys).all():
            return self.normalised()  # already laid along ``keys``: a step's usual case
        out = np.zeros(len(keys))
        if len(self.keys):
            order = np.argsort(keys, kind="stable")
            where = order[np.minimum(np.searchsorted(keys, self.keys, sorter=order), len(keys) - 1)]
            if not np.array_equal(keys[where], self.keys):
                raise ValueError("a selection weighs an arrival the engine did not offer")
            out[where] = self.normalised()
        return out


#: the empty weighting, shared: a selection with nothing deferred is most selections, and a
#: rule's select runs on every step of every engine (its arrays are never written)
NO_WEIGHTS = Weighting.none()
NO_WEIGHTS.keys.flags.writeable = NO_WEIGHTS.weight.flags.writeable = False


@dataclass(frozen=True)
class Selection:
    """Who counts: ``now`` enters this update, ``later`` the next one. A selection weighs only
    arrivals it was offered (engines read a rank's or worker's weight off the key).

    The update is ``-lr * (sum_i now_i g_i / now.total + deferred)`` where ``deferred`` is the
    previous step's ``sum_i later_i g_i / later.total``. That expresses mean-of-K, weighted
    micro-batch averages and LGC's one-step-delayed compensation (LGC Eq. 7) without the rule
    touching a tensor.
    """

    now: Weighting
    later: Weighting = NO_WEIGHTS

    def used(self) -> np.ndarray:
        """Keys of the arrivals with a non-zero weight in this update."""
        return self.now.keys[self.now.weight != 0]


@dataclass(frozen=True)
class StepStats:
    """What a rule learns after a step, in two kinds a runtime can supply.

    Allreduce scalars (``SCALARS``: each rank contributes a number, the engine reduces them):
    ``loss`` (mean mini-batch loss of the whole fresh gradients used), ``grad_sq_sum``
    (sum_i ||g_i||^2 over them), ``mean_grad_sq`` (||mean_i g_i||^2) and ``comm_time`` (the
    round's measured T^c). Per-worker vectors (``GATHERED``: an all-gather, or what a server
    already holds): ``arrivals`` (every arrival since the previous update, late and stale ones
    included: DBW's time estimator uses them), ``used`` (keys of the arrivals that entered the
    update) and ``micro_batch_times`` ((N, U) measured seconds of each worker's units, NaN
    where not computed). The rest is the engine's own bookkeeping.
    """

    SCALARS: ClassVar[tuple[str, ...]] = ("loss", "grad_sq_sum", "mean_grad_sq", "comm_time")
    GATHERED: ClassVar[tuple[str, ...]] = ("arrivals", "used", "micro_batch_times")

    step: int
    version: int
    time: float
    k: int
    arrivals: ArrivalColumns = field(default_factory=ArrivalColumns.empty)
    used: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    loss: float = float("nan")
    grad_sq_sum: float = float("nan")
    mean_grad_sq: float = float("nan")
    lr: float = float("nan")
    micro_batch_times: np.ndarray | None = None
    comm_time: float = float("nan")

    def used_mask(self) -> np.ndarray:
        """Which of ``arrivals`` entered the update."""
        keys = self.arrivals.keys
        if len(keys) == len(self.used) and bool((keys == self.used).all()):
            return np.ones(len(keys), dtype=bool)  # every arrival, in order (sync): no search
        return np.isin(keys, self.used)


class Strategy(ABC):
    """A straggler strategy: ``init`` / ``plan`` / ``select`` / ``adapt`` over explicit state."""

    #: registry name, e.g. ``"k-sync"``
    name: str
    #: how its workers exchange gradients; the engine family picks its engine from it
    topology: ClassVar[Topology] = Topology.PARAMETER_SERVER
    #: what ``select``'s ``now`` weights depend on (``WeightContract``)
    weights: ClassVar[WeightContract] = WeightContract.EQUAL
    #: whether ``select`` may return ``later`` weights, applied with a later update (LGC's
    #: e_t); a rule that does keeps its ``now`` weights independent of the late work
    defers: ClassVar[bool] = False
    #: what an engine must do beyond its topology's protocol (``"shares"``: deal the global
    #: batch by ``AllreducePlan.shares``); an engine names what it does to ``check_contract``
    needs: ClassVar[frozenset[str]] = frozenset()

    @abstractmethod
    def init(self, ctx: Context) -> Any:
        """Return the initial state."""

    @abstractmethod
    def plan(self, state: Any) -> Plan:
        """How the next step runs: how many arrivals to wait for, and how."""

    def select(self, state: Any, arrivals: ArrivalColumns) -> Selection:
        """Who counts: by default every usable arrival with equal weight (mean of K)."""
        del state
        return equal_weights(arrivals)

    def adapt(self, state: Any, stats: StepStats) -> Any:
        """Update the state after a step; static strategies keep it."""
        del stats
        return state

    def follow_world(self, state: Any, ctx: Context) -> Any | None:
        """The state for a live world of ``ctx.n_workers`` ranks after some were lost or came
        back (``train --on-rank-loss shrink``, ``runtime.elastic.shrink``), or None where
        the rule cannot follow it. A rule that never changes its state starts again."""
        return self.init(ctx) if self.keeps_state else None

    def follow_refusal(self) -> str:
        """Why ``follow_world`` answers None for this rule (``--on-rank-loss shrink``
        refuses it at start with this reason)."""
        return "it adapts its state to the world it measured"

    @property
    def averages_models(self) -> bool:
        """Whether its rounds take local steps and then average the models (Local-SGD)
        instead of reducing gradients every step: a DDP comm hook, which reduces gradients,
        cannot run it (``strategies.entries``)."""
        return False

    @property
    def keeps_state(self) -> bool:
        """Whether the rule never changes its state: it keeps ``adapt`` as it is here. The
        next step's plan then owes nothing to this step's statistics, so an engine may gather
        them after it has started the next step (``runtime.allreduce`` does)."""
        return type(self).adapt is Strategy.adapt

    def state_dict(self, state: Any) -> dict[str, Any]:
        """``state`` as plain tensors, numbers, strings, lists and dicts (no process group, no
        pickle), which ``torch.load(weights_only=True)`` reads back."""
        return {"strategy": self.describe(), "state": to_state_dict(state)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> Any:
        """The state [`state_dict`][tailtrain.Strategy.state_dict] wrote; refuses a state of another
        strategy."""
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


#: the most each topology can apply: (weights, deferred weights); the simulator's engines and
#: the runtime's protocols alike (runtime.control, runtime.partial.rule's uniform_weight,
#: runtime.ps)
TOPOLOGY_APPLIES: dict[Topology, tuple[WeightContract, bool]] = {
    Topology.ALLREDUCE: (WeightContract.OWN_COUNTS, False),
    Topology.PARTIAL_COLLECTIVE: (WeightContract.EQUAL, False),
    Topology.PARAMETER_SERVER: (WeightContract.ANY, True),
}


def contract_refusal(strategy: Strategy, topology: Topology) -> str | None:
    """Why ``topology`` cannot apply ``strategy``'s weights, in one line; None if it can."""
    weights, defers = TOPOLOGY_APPLIES[topology]
    if not strategy.weights.within(weights):
        return (
            f"strategy {strategy.describe()!r} weighs arrivals by {strategy.weights} but the "
            f"{topology} topology applies {weights} weights at most; run it on a topology "
            "that holds every arrival before it sums (parameter-server)"
        )
    if strategy.defers and not defers:
        return (
            f"strategy {strategy.describe()!r} defers weights to a later update, which the "
            f"{topology} topology cannot apply; run it on the parameter-server topology"
        )
    return None


def engine_refusal(strategy: Strategy, does: frozenset[str]) -> str | None:
    """Why an engine that ``does`` only these extras cannot run ``strategy``'s plans, in
    one line (``Strategy.needs``); None if it can."""
    missing = sorted(strategy.needs - does)
    if not missing:
        return None
    # who deals what: StragglerStep shares, ShardedStep shares and stream positions on
    # demand; predict forecasts rebalance's shares and deal=demand, not a carried cut
    if "demand" in missing:
        where = "`simulate`, `predict`, `train` or ShardedStep"
    elif "carry" in missing:
        where = "`simulate` or `train`"
    else:
        where = "`simulate`, `predict`, `train`, StragglerStep or ShardedStep"
    return (
        f"strategy {strategy.describe()!r} needs {', '.join(missing)}, which this entry's "
        f"{strategy.topology} topology does not deal; run it with {where}"
    )


def check_contract(
    strategy: Strategy, topology: Topology, does: frozenset[str] = frozenset()
) -> None:
    """A one-line ``UsageError`` when ``topology`` cannot apply ``strategy``'s weights
    or an engine that ``does`` these extras cannot run its plans (``Strategy.needs``)."""
    refusal = contract_refusal(strategy, topology) or engine_refusal(strategy, does)
    if refusal is not None:
        raise UsageError(refusal)


def equal_weights(arrivals: ArrivalColumns) -> Selection:
    """Mean of the given whole arrivals (DBW Eq. 4; slow-and-stale Eq. 2)."""
    if not arrivals.partial.any():  # the usual step: every arrival, no index to gather by
        return Selection(now=Weighting(arrivals.keys, np.ones(len(arrivals))))
    return Selection(now=Weighting.of(arrivals, np.flatnonzero(~arrivals.partial), 1.0))
