"""Per-process state of the eager-SGD simulator: clocks, model ids and send buffers.

Each process computes one gradient at a time. ``step`` is the round its gradient is meant for
(the rounds it has adopted, plus one); a process whose ``step`` is behind the open round
arrives late (eager-SGD §5, Fig. 7). Send buffers hold gradients that were computed but not
yet delivered. They are kept as descriptors (worker, job, model, step), and the gradient is
computed only when a collective delivers it, so a gradient that never enters an update is
never computed; the buffer's content is the sum of its descriptors' gradients.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from tailtrain.delays.schedule import JobDurations


@dataclass(frozen=True)
class Work:
    """Gradients as columns: who computed each, from which job, at which model and step."""

    worker: np.ndarray
    job: np.ndarray
    model: np.ndarray
    step: np.ndarray
    start: np.ndarray
    finish: np.ndarray

    @classmethod
    def empty(cls) -> Work:
        ints, floats = np.zeros(0, np.int64), np.zeros(0)
        return cls(ints, ints, ints, ints, floats, floats)

    def __len__(self) -> int:
        return int(self.worker.size)

    def take(self, index: np.ndarray) -> Work:
        return Work(*(getattr(self, f.name)[index] for f in fields(self)))

    @staticmethod
    def concat(parts: list[Work]) -> Work:
        return Work(*(np.concatenate([getattr(p, f.name) for p in parts]) for f in fields(Work)))


class Processes:
    """Clocks, jobs, model ids and round indices of P processes (one gradient in flight each)."""

    def __init__(self, durations: JobDurations, n: int) -> None:
        self.durations = durations
        self.n = n
        self.ready = np.zeros(n)  # when the gradient in flight is done: the next call
        self.start = np.zeros(n)
        self.job = np.zeros(n, dtype=np.int64)
        self.step = np.zeros(n, dtype=np.int64)
        self.model = np.zeros(n, dtype=np.int64)

    def next_durations(self, workers: np.ndarray, starts: np.ndarray) -> np.ndarray:
        """Durations of the next job of ``workers`` if started at ``starts``; consumes nothing."""
        return self.durations.peek(workers, starts)

    def launch(
        self, workers: np.ndarray, starts: np.ndarray, took: np.ndarray | None = None
    ) -> None:
        """Start the next gradient of each of ``workers`` (distinct) at ``starts``."""
        if took is None:
            took = self.durations.peek(workers, starts)
        self.job[workers] = self.durations.next_job[workers]
        self.durations.advance(workers)
        self.start[workers] = starts
        self.ready[workers] = starts + took

    def in_flight(self, workers: np.ndarray) -> Work:
        """The gradients the given processes are computing now."""
        return Work(
            workers,
            self.job[workers],
            self.model[workers],
            self.step[workers],
            self.start[workers],
            self.ready[workers],
        )


class SendBuffers:
    """The undelivered gradients of every process, each stamped with when it was buffered."""

    def __init__(self) -> None:
        self.work = Work.empty()
        self.stored = np.zeros(0)

    def put(self, work: Work, stored: np.ndarray) -> None:
        self.work = Work.concat([self.work, work])
        self.stored = np.concatenate([self.stored, stored])

    def pop_until(self, time: float) -> Work:
        """Remove and return what was buffered no later than ``time`` (the collective reads it)."""
        out = self.stored <= time
        taken = self.work.take(np.flatnonzero(out))
        self.work = self.work.take(np.flatnonzero(~out))
        self.stored = self.stored[~out]
        return taken

    def models(self) -> np.ndarray:
        return self.work.model
