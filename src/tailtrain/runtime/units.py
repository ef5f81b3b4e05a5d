"""A rank's units of a round, computed one at a time on the wall clock: DropCompute's
Algorithm 1 with the threshold tau checked *between* units (a device cannot abandon a
micro-batch halfway), each unit followed by the seconds the simulator's delay process
charges it (``runtime.inject``), and Local-SGD's local steps (App. B.3). The stopping
convention is the simulator's, written once in ``strategies.dropcompute``: with
``stop=between`` unit u starts iff T^(u-1) <= tau (``may_start``); with ``stop=preempt`` it
counts iff T^(u) < tau (``finishes``), its injected sleep cut at tau, unless the delay's
units cannot be cut (``DelayModel.cuttable``: a trace of a real computation), when it sleeps
them whole, uncounted, as the simulator charges it (``sim.allreduce.timing``).

Used by the allreduce topology (``runtime.allreduce``); the integration API's rounds
(``integrate.rounds``) use the same ``may_start``.
"""

from __future__ import annotations

import math
import time
from typing import NamedTuple

import numpy as np
import torch

from tailtrain.runtime.grads import ModuleGrads
from tailtrain.runtime.inject import sleep
from tailtrain.strategies.base import AllreducePlan
from tailtrain.strategies.dropcompute import finishes, may_start
from tailtrain.topology.allreduce import worker_grad


class RankWork(NamedTuple):  # a tuple, and lists of floats: made right after the compute
    """This rank's round: units counted, compute seconds, of which injected, unit seconds
    (NaN: not counted), G_n and the sum of the counted units' losses."""

    done: int
    compute: float
    injected: float
    times: list[float]
    grad: torch.Tensor
    loss_sum: float
    #: seconds the unit in flight had run when tau preempted it (a lower bound of its time,
    #: recorded as a censored trace row, ``delays.censored``); NaN: none was cut
    cut: float = math.nan
    #: the cut unit ran to its end all the same (its compute cannot be stopped, and nothing
    #: of it was left to sleep): ``cut`` is its time, not a bound
    cut_whole: bool = False


def compute(
    grads: ModuleGrads,
    theta: torch.Tensor,
    plan: AllreducePlan,
    batches: np.ndarray,
    injected: np.ndarray,
    m: int,
    lr: float,
    out: torch.Tensor | None = None,
    cuttable: bool = True,
) -> RankWork:
    """This rank's units ``batches`` from ``theta`` in order, each then sleeping its
    ``injected`` seconds, the threshold checked between them (module docstring); ``lr`` ends
    a Local-SGD local step every ``m`` units. The first unit's gradient goes into ``out`` when
    given (the reduce buffer's); ``cuttable``: whether tau may cut an injected sleep."""
    tau, preempt = plan.threshold, plan.preempt
    local = theta
    total: torch.Tensor | None = None  # the first unit's gradient, then the sum
    step_sum = torch.zeros_like(local) if plan.local_steps > 1 else None  # Local-SGD only
    # Python floats between the units: numpy scalars there cost ~50 us a round, run cold
    seconds_of, times = injected.tolist(), [math.nan] * len(batches)
    done, loss_sum, slept, start, cut = 0, 0.0, 0.0, time.perf_counter(), math.nan
    whole = False
    for u, batch in enumerate(batches):
        if not may_start(time.perf_counter() - start, tau, preempt):
            break
        began = time.perf_counter()
        loss, grad = grads(local, batch, out if u == 0 else None)
        elapsed = time.perf_counter() - start
        counts, seconds = sleep_injected(elapsed, seconds_of[u], tau, preempt, cuttable)
        slept += seconds
        if not counts:
            cut = time.perf_counter() - began
            whole = seconds >= seconds_of[u]  # its injected seconds all slept: none left
            break
        times[u] = time.perf_counter() - began
        done += 1
        loss_sum += loss
        if step_sum is not None:  # before the sum: the first unit's gradient is the sum
            step_sum += grad
        total = grad if total is None else total.add_(grad)  # ModuleGrads' tensors are ours
        if step_sum is not None and (u + 1) % m == 0 and u + 1 < len(batches):
            local = local - lr * step_sum / m  # a local step ends (Local-SGD)
            step_sum.zero_()
    total = torch.zeros_like(local) if total is None else total
    grad = worker_grad(total, done, plan.local_steps)
    return RankWork(done, time.perf_counter() - start, slept, times, grad, loss_sum, cut, whole)


def sleep_injected(
    elapsed: float, injected: float, tau: float, preempt: bool, cuttable: bool = True
) -> tuple[bool, float]:
    """Sleep a unit's injected seconds: (whether the unit counts, seconds slept). Preempting,
    a unit that would end at tau or later sleeps only up to tau and does not count
    (Algorithm 1); one that cannot be cut sleeps whole and does not count."""
    if not finishes(elapsed + injected, tau, preempt):
        seconds = injected if not cuttable else max(0.0, tau - elapsed)
        sleep(seconds)
        return False, seconds
    sleep(injected)
    return True, injected
