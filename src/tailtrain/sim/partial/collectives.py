"""Virtual-time model of one synchronous or partial allreduce (eager-SGD §4, Fig. 6).

Given when each process calls the collective, it answers when the collective is activated,
who is active and when it completes:

- ``allreduce``: activation is the last call; everybody is active.
- partial collectives: the initiator (first call for solo, the designated rank for majority)
  activates at its call; a quorum round's initiator is the round's counter
  (``runtime.partial.collective``: no caller knows it is the K-th), which activates at the
  K-th arrival of the calls' messages
  (``send + hop`` each; the counter's own call needs none), tree or direct alike; the
  activation reaches every other process
  after ⌈log2 P⌉ message hops (§4.1.1: a recursive-doubling broadcast, the union of P binomial
  trees). A process whose call came no later than that is active and contributes fresh data;
  the others are activated externally and contribute their send buffer.
- direct activation (``Network.direct``: P <= direct, the runtime's ``DIRECT_ACTIVATION``):
  the initiator (quorum: the counter) sends the activation to every other process itself, one
  message after another in ascending rank order; the m-th arrives ``m * send + hop`` after the
  activation, and each process is active if its call came no later than its own arrival.
  Solo's later callers that call before the
  message reaches them initiate too in the runtime; the model keeps the first caller's messages
  only (the others' matter only when calls are less than a hop apart).
- the allreduce itself runs once every process is activated and takes ``allreduce`` seconds.

Arrays carry any leading batch shape (the microbenchmark resolves all its iterations at once);
the last axis is the process. ``inf`` marks a process that does not call in this round.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from tailtrain.delays.base import FloatArray
from tailtrain.errors import UsageError
from tailtrain.strategies.eager import Collective
from tailtrain.topology.partial import activation_hops, counter_of


@dataclass(frozen=True)
class Network:
    """Latency of one activation message hop and duration of one allreduce, in seconds; up to
    ``direct`` processes the initiator activates everyone itself, ``send`` seconds a message."""

    hop: float
    allreduce: ArrayLike = 0.0
    direct: int = 0
    send: float = 0.0

    def __post_init__(self) -> None:
        if not self.hop >= 0 or not np.all(np.asarray(self.allreduce) >= 0):
            raise UsageError("hop latency and allreduce time must be >= 0 seconds")
        if not self.send >= 0 or self.direct < 0:
            raise UsageError("send cost must be >= 0 seconds and direct >= 0 processes")

    def is_direct(self, processes: int) -> bool:
        """Whether P processes are activated in one hop from the initiator."""
        return processes <= self.direct


@dataclass(frozen=True)
class RoundTiming:
    """Outcome of one round: activation time, the activation's reach, completion, actives."""

    initiator: NDArray[np.int64]  # the process whose call activated the round
    activation: FloatArray  # the initiator's call (quorum: the counter's count of K calls)
    reach: FloatArray  # when the activation has reached every process
    complete: FloatArray  # when the result is in every receive buffer
    active: NDArray[np.bool_]  # (..., P): called no later than the activation reached it

    @property
    def nap(self) -> NDArray[np.int64]:
        """Number of active processes (eager-SGD §7.1)."""
        return self.active.sum(axis=-1)


def resolve_round(
    calls: ArrayLike,
    collective: Collective,
    network: Network,
    *,
    k: int = 1,
    initiator: ArrayLike | None = None,
    counter: ArrayLike = 0,
) -> RoundTiming:
    """When the round of a ``collective`` activates and completes, given the ``calls``;
    ``counter`` is the rank that counts a quorum round's calls (``counter_of``)."""
    calls = np.asarray(calls, dtype=np.float64)
    who, start = _initiation(calls, collective, network, k, initiator, counter)
    if collective is not Collective.ALLREDUCE and network.is_direct(calls.shape[-1]):
        arrival = _direct_arrival(calls.shape[-1], who, start, network)
        reach, active = arrival.max(axis=-1), calls <= arrival
    else:
        hops = 0 if collective is Collective.ALLREDUCE else activation_hops(calls.shape[-1])
        reach = start + hops * network.hop
        active = calls <= reach[..., None]
    complete = reach + np.asarray(network.allreduce, dtype=np.float64)
    return RoundTiming(who, start, reach, complete, active)


def _direct_arrival(
    processes: int, who: NDArray[np.int64], start: FloatArray, network: Network
) -> FloatArray:
    """When a partial round's activation reaches each process, its initiator sending it to
    everyone in turn (module docstring)."""
    ranks = np.arange(processes)
    nth = ranks + (ranks < who[..., None])  # 1-based place in the ascending sends, self skipped
    arrival = start[..., None] + network.hop + nth * network.send
    return np.where(ranks == who[..., None], start[..., None], arrival)


def _initiation(
    calls: FloatArray,
    collective: Collective,
    network: Network,
    k: int,
    initiator: ArrayLike | None,
    counter: ArrayLike,
) -> tuple[NDArray[np.int64], FloatArray]:
    """The initiator and its activation time, tree or direct alike: a quorum round's counter
    activates at the K-th arrival of the calls' messages (its own call needs none), as the
    runtime's counter does (``runtime.partial.collective``); any other initiator at its own call."""
    if collective is Collective.QUORUM:
        _check_quorum(k, calls.shape[-1])
        ranks = np.arange(calls.shape[-1])
        rank = counter_of(np.asarray(counter, dtype=np.int64), calls.shape[-1])
        who = np.broadcast_to(rank, calls.shape[:-1]).copy()
        told = np.where(ranks == who[..., None], calls, calls + network.send + network.hop)
        start = np.sort(told, axis=-1)[..., k - 1]
    else:
        who = initiator_of(calls, collective, k, initiator)
        start = np.take_along_axis(calls, who[..., None], axis=-1)[..., 0]
    if not np.all(np.isfinite(start)):
        raise UsageError(f"the {collective.value} collective's initiator never calls")
    return who, start


def initiator_of(
    calls: FloatArray, collective: Collective, k: int, initiator: ArrayLike | None
) -> NDArray[np.int64]:
    """The process whose call activates the round; ties go to the lowest rank."""
    order = np.argsort(calls, axis=-1, kind="stable")
    if collective is Collective.SOLO:
        return order[..., 0]
    if collective is Collective.QUORUM:
        _check_quorum(k, calls.shape[-1])
        return order[..., k - 1]
    if collective is Collective.MAJORITY:
        if initiator is None:
            raise UsageError("the majority collective needs its designated initiator")
        return np.broadcast_to(np.asarray(initiator, dtype=np.int64), calls.shape[:-1]).copy()
    return order[..., -1]


def _check_quorum(k: int, processes: int) -> None:
    if not 1 <= k <= processes:
        raise UsageError(f"quorum k={k} must be between 1 and P={processes}")


def latencies(calls: ArrayLike, timing: RoundTiming, overhead: float = 0.0) -> FloatArray:
    """Time each process spends inside the call (Fig. 8's ``latency_pid``).

    A process that calls after the result is in its receive buffer returns at once; every call
    also pays ``overhead``, the library's own software cost.
    """
    calls = np.asarray(calls, dtype=np.float64)
    return np.maximum(timing.complete[..., None] - calls, 0.0) + overhead
