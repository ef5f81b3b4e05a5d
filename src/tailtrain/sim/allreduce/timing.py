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

Everything is vectorised over workers and units (and over leading axes).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tailtrain.delays import DelayModel
from tailtrain.errors import UsageError
from tailtrain.sim.durations import DelaySource
from tailtrain.strategies.dropcompute import counted

#: rounds sampled per block
BLOCK = 64


@dataclass(frozen=True)
class Stops:
    """Per worker: units done ``done``, compute seconds ``compute`` and ``full`` = T_n^(U)."""

    done: np.ndarray
    compute: np.ndarray
    full: np.ndarray


def stop_rule(times: np.ndarray, tau: float, preempt: bool) -> Stops:
    """Apply threshold ``tau`` to unit times ``times[..., n, u]`` (DropCompute Alg. 1)."""
    cumulative = np.cumsum(times, axis=-1)
    full = cumulative[..., -1]
    done = counted(cumulative, tau, preempt).sum(axis=-1)
    if preempt:
        return Stops(done, np.minimum(full, tau), full)
    last = np.take_along_axis(cumulative, np.maximum(done - 1, 0)[..., None], axis=-1)[..., 0]
    return Stops(done, np.where(done > 0, last, 0.0), full)


def measured(times: np.ndarray, done: np.ndarray) -> np.ndarray:
    """What a worker can report: the times of the units it completed, NaN for the rest."""
    if done.min(initial=times.shape[-1]) == times.shape[-1]:
        return times
    return np.where(np.arange(times.shape[-1]) < done[..., None], times, np.nan)


class RoundClock:
    """Unit durations and communication times of successive rounds, sampled in blocks.

    One delay-process iteration is one local step: a round of H local steps takes H rows
    (N, M_cap), of which the first M columns are used. Communication times come from their
    own seeded stream, so adding ``--comm-time`` leaves the compute draws unchanged.
    """

    def __init__(self, process: DelaySource, comm: DelayModel | None, seed: int) -> None:
        self.process = process
        self.comm = comm
        self._comm_rng = np.random.default_rng((seed, 11))
        self._rows: np.ndarray | None = None
        self._comm: np.ndarray = np.empty(0)

    def _block(self) -> np.ndarray:
        block = self.process.next_block(BLOCK)
        return block if block.ndim == 3 else block[:, :, None]

    def take(self, local_steps: int, micro_batches: int, start: float) -> np.ndarray:
        """Unit times (N, H*M) of the next round, which starts at virtual time ``start``."""
        while self._rows is None or self._rows.shape[0] < local_steps:
            fresh = self._block()
            left = self._rows is not None and self._rows.shape[0] > 0
            self._rows = np.concatenate([self._rows, fresh]) if left else fresh
        if micro_batches > self._rows.shape[2]:
            raise UsageError(
                f"a round needs {micro_batches} micro-batches but only "
                f"{self._rows.shape[2]} were sampled per iteration"
            )
        rows, self._rows = self._rows[:local_steps], self._rows[local_steps:]
        times = rows[:, :, :micro_batches].transpose(1, 0, 2).reshape(rows.shape[1], -1)
        if getattr(getattr(self.process, "pattern", None), "time_scheduled", False):
            times = self._scheduled(times, start)
        return times

    def _scheduled(self, times: np.ndarray, start: float) -> np.ndarray:
        """Scale each unit by the slowdown in force at its own virtual start time."""
        times = times.copy()
        workers = np.arange(times.shape[0])
        elapsed = np.zeros(times.shape[0])
        for u in range(times.shape[1]):  # a unit's start depends on the scaled ones before it
            times[:, u] *= self.process.time_factor(start + elapsed, workers)
            elapsed += times[:, u]
        return times

    def next_comm(self) -> float:
        """T^c of the next round (0 without a communication model)."""
        if self.comm is None:
            return 0.0
        if self._comm.size == 0:
            self._comm = np.maximum(self.comm.sample(self._comm_rng, BLOCK), 0.0)
        value, self._comm = float(self._comm[0]), self._comm[1:]
        return value
