"""Virtual time of synchronous allreduce rounds under a compute threshold (DropCompute Sec. 4.3).

A round starts at the same instant on every worker. Worker n computes up to U units in
sequence (U = M micro-batches; under Local-SGD, H local steps of M micro-batches each), with
sampled durations t_n^(u) and partial sums T_n^(u) = sum_{j<=u} t_n^(j). It stops by the
threshold tau, then everyone joins an allreduce lasting T^c. The round takes
max_n T~_n + T^c; sync SGD on the same draws would take T + T^c with T = max_n T_n^(U).

Two stopping conventions (``Plan.preempt``):

* preempt (default): the worker leaves at T~_n = min(tau, T_n) and a unit counts iff it was
  complete before tau, T_n^(u) < tau. This is Algorithm 1 (its timer thread breaks the loop;
  the accumulation of a unit is atomic) and the model behind Eqs. (5)-(6), Algorithm 2 and
  ``tailtrain.theory.dropcompute``; the reference code's injected delay is also cut at tau.
* between: the check runs only between units, as the reference code's ``ComputeTimeout``
  check does: unit u starts iff T_n^(u-1) <= tau (T_n^(0) = 0), the unit in flight at tau
  finishes and counts, and the worker leaves at T~_n = T_n^(C_n) with C_n units done.
  Then E[C_n] = sum_{u=0}^{U-1} P(T^(u) <= tau), Eq. (5) with its index shifted by one.

Preempting needs a unit that can be stopped: an injected sleep can, a real computation's
measured seconds (a ``trace:`` of one, ``DelayModel.cuttable``) cannot. Then the unit in
flight at tau still counts iff T_n^(u) < tau, but it runs to its end: the worker leaves at
T~_n = T_n^(min(C_n + 1, U)), as ``train`` does on such a unit. (A step dealt on demand still
cuts its units in flight at the pool's end, :func:`demand_rule`, in both engines.)

Everything is vectorised over workers and units (and over leading axes).
"""

from __future__ import annotations

import numpy as np

from tailtrain.strategies.dropcompute import counted
from tailtrain.strategies.rebalance import on_demand
from tailtrain.topology.allreduce import Stops


def stop_rule(times: np.ndarray, tau: float, preempt: bool, cuttable: bool = True) -> Stops:
    """Apply threshold ``tau`` to unit times ``times[..., n, u]`` (DropCompute Alg. 1); a unit
    in flight that cannot be cut runs to its end (module docstring)."""
    cumulative = np.cumsum(times, axis=-1)
    done = counted(cumulative, tau, preempt).sum(axis=-1)
    last = np.full(done.shape, times.shape[-1] - 1)
    leaves = _leaves(cumulative, done, last, tau, preempt, cuttable)
    return Stops(done, leaves, cumulative[..., -1])


def share_rule(
    times: np.ndarray, shares: np.ndarray, m: int, tau: float, preempt: bool, cuttable: bool = True
) -> Stops:
    """:func:`stop_rule` for a round of per-rank shares: rank n computes its first
    ``shares[n]`` units of ``times[n]`` (N, U), as the threshold allows. ``full`` is sync's
    T_n^(M) on the same draws (its first M units), so a row's sync_time and s_eff compare
    the round with the sync round those draws would have made."""
    cumulative = np.cumsum(times, axis=-1)
    own = np.arange(times.shape[-1]) < shares[:, None]
    done = (counted(cumulative, tau, preempt) & own).sum(axis=-1)
    leaves = _leaves(cumulative, done, shares - 1, tau, preempt, cuttable)
    return Stops(done, leaves, cumulative[:, m - 1])


def _leaves(
    cumulative: np.ndarray, done: np.ndarray, last: np.ndarray, tau: float, preempt: bool,
    cuttable: bool,
) -> np.ndarray:  # fmt: skip
    """When each worker leaves, given the ``done`` units it counted of its units up to index
    ``last`` (module docstring): preempting, at tau (or its last unit's end, if sooner), or at
    the end of the unit tau found running when that unit cannot be cut; checking between
    units, at the end of its last counted one."""

    def end_of(unit: np.ndarray) -> np.ndarray:
        return np.take_along_axis(cumulative, unit[..., None], axis=-1)[..., 0]

    if preempt and not cuttable:
        ends = end_of(np.minimum(done, last))  # the unit tau found running runs to its end
        return ends if tau > 0 else np.zeros_like(ends)  # tau <= 0: none ran
    if preempt:
        return np.minimum(end_of(last), tau)
    return np.where(done > 0, end_of(np.maximum(done - 1, 0)), 0.0)


def demand_rule(times: np.ndarray, pool: int, m: int) -> tuple[Stops, np.ndarray]:
    """A step dealt on demand until ``pool`` micro-batches are complete (issue 25,
    ``strategies.rebalance.on_demand``): rank n computes along its draws ``times[n]`` (N, U)
    until the ``pool``-th completion E, when every rank leaves (its unit in flight is cut).
    ``dealt`` counts each rank's units including the cut one; ``full`` is sync's T_n^(M) on
    the same draws, as in :func:`share_rule`. Also the units' dealt indices (N, U)."""
    cumulative = np.cumsum(times, axis=-1)
    index, counted = on_demand(cumulative, pool)
    dealt = np.count_nonzero(index >= 0, axis=-1)
    end = float(cumulative[counted].max()) if pool else 0.0
    compute = np.where(dealt > 0, end, 0.0)
    stops = Stops(np.count_nonzero(counted, axis=-1), compute, cumulative[:, m - 1], dealt)
    return stops, index


def measured(times: np.ndarray, done: np.ndarray) -> np.ndarray:
    """What a worker can report: the times of the units it completed, NaN for the rest."""
    if done.min(initial=times.shape[-1]) == times.shape[-1]:
        return times
    return np.where(np.arange(times.shape[-1]) < done[..., None], times, np.nan)
