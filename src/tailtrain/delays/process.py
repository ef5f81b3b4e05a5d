"""The sampler the engines use: a model plus a worker pattern, drawn block by block.

``DelayProcess.next_block(I)`` returns durations of shape (I, N) — or (I, N, M) with
micro-batches — in seconds, continuing the previous block (a persistent draw carries across
the boundary; a trace replayed per worker goes on with each worker's next recorded times).
Time-scheduled effects (``slowdown``) are not in the block: the engine asks
``time_factor(start_times, workers)`` at each unit's virtual start and multiplies.

Randomness: the seed (or Generator) spawns two independent streams, one for the model's
draws and one for the pattern's, so changing the pattern leaves the base draws unchanged
(common random numbers). The same seed and the same sequence of calls give identical arrays.
"""

from __future__ import annotations

import logging

import numpy as np
from numpy.typing import ArrayLike

from tailtrain.delays.base import DelayModel, FloatArray, WorkerPattern
from tailtrain.delays.parse import parse_delay
from tailtrain.delays.patterns import IID, parse_pattern
from tailtrain.delays.sum import SumDelay
from tailtrain.delays.trace import TraceDelay
from tailtrain.errors import UsageError

log = logging.getLogger(__name__)

SeedLike = int | np.random.Generator | np.random.SeedSequence


def _streams(seed_or_rng: SeedLike) -> list[np.random.Generator]:
    if isinstance(seed_or_rng, np.random.Generator):
        return seed_or_rng.spawn(2)
    sequence = (
        seed_or_rng
        if isinstance(seed_or_rng, np.random.SeedSequence)
        else np.random.SeedSequence(seed_or_rng)
    )
    return [np.random.default_rng(child) for child in sequence.spawn(2)]


def trace_terms(model: DelayModel) -> list[TraceDelay]:
    """The trace terms of ``model`` (itself, or terms of a sum)."""
    terms = model.terms if isinstance(model, SumDelay) else (model,)
    return [term for term in terms if isinstance(term, TraceDelay)]


def trace_notes(model: DelayModel, workers: int) -> dict[str, str]:
    """One-line notes on the traces in ``model`` for ``workers`` workers: ``trace_mapping``
    (how workers map onto a per-worker trace's, when the counts differ) and ``trace_warning``
    (pooled sampling of a trace with persistent per-worker differences) and ``trace_censoring``
    (rows cut by a threshold, completed from a fitted law); absent when moot."""
    mapping = [term.mapping(workers) for term in trace_terms(model) if term.per_worker]
    warning = [term.persistent_differences for term in trace_terms(model) if not term.per_worker]
    censoring = [term.censoring for term in trace_terms(model)]
    notes = {"trace_mapping": mapping, "trace_warning": warning, "trace_censoring": censoring}
    return {key: "; ".join(filter(None, found)) for key, found in notes.items() if any(found)}


def _check_trace_units(model: DelayModel, micro_batches: int | None) -> None:
    """A trace row is one micro-batch or one worker-iteration; it must match the scenario."""
    for term in trace_terms(model):
        if term.per_micro_batch != (micro_batches is not None):
            has = "has" if term.per_micro_batch else "has no"
            wants = "has no" if micro_batches is None else f"has {micro_batches}"
            raise UsageError(
                f"trace {term.spec!r} {has} micro_batch column but the scenario "
                f"{wants} micro-batches; record the trace at the same granularity"
            )


def _as_model(model: DelayModel | str) -> DelayModel:
    return model if isinstance(model, DelayModel) else parse_delay(model)


def _as_pattern(pattern: WorkerPattern | str | None) -> WorkerPattern:
    if pattern is None:
        return IID()
    return pattern if isinstance(pattern, WorkerPattern) else parse_pattern(pattern)


class DelayProcess:
    """Stateful, seeded sampler of unit durations for N workers (and M micro-batches)."""

    def __init__(
        self,
        model: DelayModel | str,
        pattern: WorkerPattern | str | None = None,
        seed_or_rng: SeedLike = 0,
        workers: int = 1,
        micro_batches: int | None = None,
        *,
        start: int = 0,
    ) -> None:
        if workers < 1 or (micro_batches is not None and micro_batches < 1):
            raise UsageError(
                f"need workers >= 1 and micro_batches >= 1 "
                f"(got workers={workers}, micro_batches={micro_batches})"
            )
        self.model, self.pattern = _as_model(model), _as_pattern(pattern)
        _check_trace_units(self.model, micro_batches)
        self.workers, self.micro_batches = workers, micro_batches
        self._model_rng, self._pattern_rng = _streams(seed_or_rng)
        self._state = self.pattern.init(self._pattern_rng, workers, micro_batches or 1)
        self.iteration = start  #: index of the next iteration (``start``: a later segment)
        #: one-line notes on trace replay (see :func:`trace_notes`), for the caller to show
        self.notes = trace_notes(self.model, workers)
        self._clip = self.model.support[0] < 0
        if self._clip:
            log.warning(
                "delay %r is negative with probability %.3g; durations are clipped at 0",
                self.model.spec,
                float(self.model.cdf(0.0)),
            )

    @property
    def cuttable(self) -> bool:
        """Whether a threshold can stop a unit in flight (``DelayModel.cuttable``)."""
        return self.model.cuttable

    def next_block(self, iterations: int) -> FloatArray:
        """Durations of the next ``iterations`` iterations: (I, N) or (I, N, M) seconds."""
        if iterations < 0:
            raise UsageError(f"iterations must be >= 0, got {iterations}")
        shape = (iterations, self.workers, self.micro_batches or 1)
        if iterations == 0:
            return np.empty(shape if self.micro_batches else shape[:2])
        times, state = self.pattern.draw(
            self.model, self._state, self._model_rng, self.iteration, shape
        )
        times, self._state = self.pattern.apply(state, times, self.iteration, self._pattern_rng)
        self.iteration += iterations
        if self._clip:
            np.maximum(times, 0.0, out=times)
        return times if self.micro_batches else times[:, :, 0]

    def time_factor(self, start_times: ArrayLike, workers: ArrayLike) -> FloatArray:
        """Slowdown factor (1 where none) of units starting at ``start_times`` on ``workers``."""
        start_times = np.asarray(start_times, dtype=np.float64)
        workers = np.asarray(workers, dtype=np.int64)
        return self.pattern.time_factor(self._state, start_times, workers)


def sample_times(
    model: DelayModel | str,
    pattern: WorkerPattern | str | None,
    rng: SeedLike,
    iterations: int,
    workers: int,
    micro_batches: int | None = None,
) -> FloatArray:
    """One block of durations for theory and Monte Carlo (no virtual clock).

    A time-scheduled pattern (``slowdown``) needs the engine's clock, so it is refused here.
    """
    process = DelayProcess(model, pattern, rng, workers, micro_batches)
    if process.pattern.time_scheduled:
        raise UsageError(
            f"pattern {process.pattern.spec!r} changes speed at virtual times; "
            f"sample_times has no clock, so simulate it instead"
        )
    return process.next_block(iterations)
