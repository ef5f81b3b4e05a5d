"""The seeded samplers of a run's delays: when each job or round computes and communicates.

Samplers shared by the simulator and the runtime (which injects what they draw):

- :class:`JobDurations`: per-worker job durations (parameter server, partial collectives);
- :class:`RoundClock`: unit times and T^c of successive synchronous allreduce rounds;
- :class:`CommStream`: the one seeded communication-time stream; both classes above draw
  their T^c from one, and the partial collectives use one directly for each round's T^c.

Job durations are drawn in bulk from a delay process.

Worker w's j-th job always takes the same time for a given seed, whatever the strategy does
with it. That gives every strategy the same sampled delay paths (common random numbers), so a
comparison between strategies is not blurred by different luck.

With a communication model, a job is a parameter-server round trip: pull the model, compute,
push the gradient, so it lasts compute + T^c. T^c is drawn per job from its own seeded stream
(as :class:`RoundClock` does per round), so adding ``--comm-time`` leaves the
compute draws unchanged, and a worker pattern's slowdown scales the compute only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from tailtrain.delays.base import DelayModel
from tailtrain.delays.comm import parse_comm_time
from tailtrain.errors import UsageError


class DelaySource(Protocol):
    """What durations need from ``tailtrain.delays.DelayProcess``."""

    def next_block(self, iterations: int) -> np.ndarray: ...

    def time_factor(self, starts: np.ndarray, workers: np.ndarray) -> np.ndarray: ...

    @property
    def cuttable(self) -> bool: ...


BLOCK = 256
#: rounds a RoundClock samples per block
ROUND_BLOCK = 64

# Each consumer keeps the stream key (and draw size) it had before the three samplers became
# one CommStream: a different key, or a different buffer for a model whose block draws differ
# from one-at-a-time draws (a sum of terms, a trace), changes every record made with
# --comm-time. So three keys remain, one per consumer, on purpose.
#: key of the per-job T^c of JobDurations (parameter server, partial-collective jobs)
JOB_COMM_KEY = (12,)
#: key of the per-round T^c of RoundClock (synchronous allreduce)
ROUND_COMM_KEY = (11,)
#: key of the per-collective T^c of the partial collectives ("comm" in ASCII)
COLLECTIVE_COMM_KEY = (0x636F6D6D,)


class CommStream:
    """Seeded draws of T^c from one communication model (``--comm-time``), clipped at 0.

    ``key`` picks the stream: the generator is ``default_rng((seed, *key))``, apart from the
    delay process's, so adding ``--comm-time`` leaves the compute draws unchanged.
    :meth:`next` draws ``buffer`` values at a time and hands them out in order, so its
    sequence is the one that :meth:`block` of ``buffer`` values gives, call after call. For
    most models the draws do not depend on how many are drawn at once; for a sum of terms
    (each term is drawn as a whole block before the next) or a trace (numpy draws bounded
    integers in pairs) they do, hence ``buffer`` is part of a stream's identity.
    """

    def __init__(
        self, model: DelayModel | None, seed: int, key: Sequence[int], buffer: int = 1
    ) -> None:
        if buffer < 1:
            raise ValueError(f"CommStream buffer must be >= 1, got {buffer}")
        self.model = model
        self.buffer = buffer
        self._rng = np.random.default_rng((seed, *key))
        self._left: np.ndarray = np.empty(0)

    @classmethod
    def from_spec(
        cls, spec: str | None, seed: int, key: Sequence[int], buffer: int = 1
    ) -> CommStream:
        """A stream of ``Scenario.comm_time``: seconds (``"0.05"``) or a delay spec."""
        return cls(parse_comm_time(spec), seed, key, buffer)

    def block(self, shape: int | tuple[int, ...]) -> np.ndarray:
        """The next draws, as an array of ``shape`` (zeros without a model)."""
        if self.model is None:
            return np.zeros(shape)
        return np.maximum(self.model.sample(self._rng, shape), 0.0)

    def next(self) -> float:
        """T^c of the next job or round (0 without a model)."""
        if self.model is None:
            return 0.0
        if self._left.size == 0:
            self._left = self.block(self.buffer)
        value, self._left = float(self._left[0]), self._left[1:]
        return value


class JobDurations:
    """Durations of each worker's successive jobs, sampled ``BLOCK`` iterations at a time.

    ``comm`` (with ``seed``) adds a round trip T^c to every job, from its own stream.
    """

    def __init__(
        self,
        process: DelaySource,
        n_workers: int,
        comm: DelayModel | None = None,
        seed: int = 0,
    ) -> None:
        self._process = process
        self.comm = CommStream(comm, seed, JOB_COMM_KEY)
        self._table = np.empty((0, n_workers))
        self._comm_table = np.zeros((0, n_workers))
        self._offset = 0  # rows below this were used by every worker and are dropped
        # for jobs made of micro-batches: share of the job's work done after each of them
        self._progress: np.ndarray | None = None
        self.next_job = np.zeros(n_workers, dtype=np.int64)

    def _ensure(self, rows: int) -> None:
        if rows <= self._offset + self._table.shape[0]:
            return
        low = int(self.next_job.min())
        blocks = [self._table[low - self._offset :]]
        comms = [self._comm_table[low - self._offset :]]
        shares = [] if self._progress is None else [self._progress[low - self._offset :]]
        have = self._offset + self._table.shape[0]
        while have < rows:
            block = self._process.next_block(BLOCK)
            # a job made of micro-batches lasts their sum
            blocks.append(block if block.ndim == 2 else block.sum(axis=2))
            comms.append(self.comm.block(blocks[-1].shape))
            if block.ndim == 3:
                total = np.maximum(blocks[-1][..., None], np.finfo(float).tiny)
                shares.append(np.cumsum(block, axis=2) / total)
            have += BLOCK
        self._table = np.concatenate(blocks, axis=0)
        self._comm_table = np.concatenate(comms, axis=0)
        self._progress = np.concatenate(shares, axis=0) if shares else None
        self._offset = low

    def peek(self, workers: np.ndarray, starts: np.ndarray) -> np.ndarray:
        """Durations of the next job of each worker if it starts at ``starts``; consumes nothing."""
        if workers.size == 0:
            return np.empty(0)
        idx = self.next_job[workers]
        self._ensure(int(idx.max()) + 1)
        rows = idx - self._offset
        compute = self._table[rows, workers]
        # a pattern with no schedule slows nothing down (x * 1.0 is x: skipped); a source
        # without a pattern says its own factor
        if getattr(getattr(self._process, "pattern", None), "time_scheduled", True):
            compute = compute * self._process.time_factor(starts, workers)
        if self.comm.model is None:  # its T^c table holds zeros: nothing to gather and add
            return compute
        return compute + self._comm_table[rows, workers]

    def peek_progress(self, workers: np.ndarray) -> np.ndarray | None:
        """(W, M) share of each worker's next job done after each of its M micro-batches
        (cumulative micro-batch time over the job's time); None if jobs have no micro-batches."""
        if self._progress is None and self._table.shape[0]:
            return None  # drawn jobs have no micro-batches, so no later draw has any
        if workers.size:
            self._ensure(int(self.next_job[workers].max()) + 1)
        if self._progress is None:
            return None
        return self._progress[self.next_job[workers] - self._offset, workers]

    def advance(self, workers: np.ndarray) -> None:
        """Mark the next job of each worker (distinct) as started."""
        self.next_job[workers] += 1


class RoundClock:
    """Unit durations and communication times of successive rounds, sampled in blocks.

    One delay-process iteration is one local step: a round of H local steps takes H rows
    (N, M_cap), of which the first M columns are used. Communication times come from their
    own seeded stream, so adding ``--comm-time`` leaves the compute draws unchanged.
    """

    def __init__(self, process: DelaySource, comm: DelayModel | None, seed: int) -> None:
        self.process = process
        self.comm = CommStream(comm, seed, ROUND_COMM_KEY, buffer=ROUND_BLOCK)
        self._rows: np.ndarray | None = None
        #: whether a threshold can stop a unit in flight (``DelayModel.cuttable``)
        self.cuttable: bool = getattr(process, "cuttable", True)  # a source that predates it

    def _block(self) -> np.ndarray:
        block = self.process.next_block(ROUND_BLOCK)
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
        return self.comm.next()
