"""The contract every compute-time model and worker pattern fulfils.

A :class:`DelayModel` describes one unit of work: one micro-batch when the scenario has
micro-batches, otherwise one worker's whole gradient computation including its round trip.
A :class:`WorkerPattern` says which worker is slow when, on top of a model.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

Shape = int | tuple[int, ...]
FloatArray = NDArray[np.float64]


class DelayModel(ABC):
    """Distribution of the duration of one unit of work, in seconds."""

    #: the spec text that built this model, e.g. ``"exp:rate=1"``
    spec: str

    @abstractmethod
    def sample(self, rng: np.random.Generator, shape: Shape) -> NDArray[np.float64]:
        """Draw i.i.d. durations of the given shape, vectorised."""

    @property
    def per_worker(self) -> bool:
        """True when a unit's time depends on its worker and iteration (a trace replayed per
        worker): draws are then not i.i.d. across workers, and ``draw_block`` differs from
        ``sample``, which stays the i.i.d. law of the moments and cdf."""
        return False

    @property
    def cuttable(self) -> bool:
        """Whether a threshold can stop a unit of this law in flight (DropCompute's
        ``stop=preempt``): a simulated or injected delay is a sleep, which it can; a real
        computation's measured seconds (``trace:`` of a run that slept none) are not, and
        its unit in flight at tau runs to its end, uncounted (``sim.allreduce.timing``)."""
        return True

    def draw_block(
        self, rng: np.random.Generator, start: int, shape: tuple[int, int, int]
    ) -> NDArray[np.float64]:
        """Durations (I, N, M) of iterations ``start .. start+I-1`` (default: i.i.d. draws)."""
        return self.sample(rng, shape)

    @property
    @abstractmethod
    def mean(self) -> float: ...

    @property
    @abstractmethod
    def var(self) -> float: ...

    @property
    def exact(self) -> bool:
        """True when cdf/pdf/quantile are exact (closed form or scipy), False if empirical."""
        return True

    @property
    def method(self) -> str:
        """How cdf/pdf/quantile are computed: ``closed-form``, ``numerical`` or ``empirical``."""
        return "closed-form" if self.exact else "empirical"

    @property
    def support(self) -> tuple[float, float]:
        """Lower and upper end of the support (upper may be ``inf``)."""
        return (0.0, float("inf"))

    @property
    def atoms(self) -> tuple[FloatArray, FloatArray]:
        """Point masses as ``(values, probabilities)``; empty for a continuous model.

        ``pdf`` is the density of the continuous part only, so ``∫pdf + Σprobabilities = 1``.
        """
        return np.empty(0), np.empty(0)

    @abstractmethod
    def cdf(self, x: ArrayLike) -> NDArray[np.float64]: ...

    @abstractmethod
    def pdf(self, x: ArrayLike) -> NDArray[np.float64]: ...

    @abstractmethod
    def quantile(self, q: ArrayLike) -> NDArray[np.float64]: ...

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.spec!r})"


class WorkerPattern(ABC):
    """Which worker is slow when: a transform of i.i.d. draws, with explicit state.

    Times flow through as arrays of shape ``(iterations, workers, micro_batches)`` (one
    micro-batch when the scenario has none). ``init`` draws the per-worker constants once;
    ``draw`` and ``apply`` return the new state, so the owner (a
    :class:`~tailtrain.delays.process.DelayProcess`) threads it through consecutive blocks.
    """

    #: the spec text that built this pattern, e.g. ``"subset:s=4,delay=0.46"``
    spec: str

    #: True when the pattern changes speed at virtual times (see :meth:`time_factor`)
    time_scheduled: bool = False

    def init(self, rng: np.random.Generator, workers: int, micro_batches: int) -> Any:
        """Draw whatever stays fixed for the whole run (default: nothing)."""
        return None

    def draw(
        self,
        model: DelayModel,
        state: Any,
        rng: np.random.Generator,
        start: int,
        shape: tuple[int, int, int],
    ) -> tuple[FloatArray, Any]:
        """Base durations for iterations ``start .. start+shape[0]-1`` (default: the model's
        own block, i.i.d. unless it replays a trace per worker)."""
        return model.draw_block(rng, start, shape), state

    def apply(
        self, state: Any, times: FloatArray, start: int, rng: np.random.Generator
    ) -> tuple[FloatArray, Any]:
        """Apply the per-iteration effect to ``times`` (may modify it in place)."""
        return times, state

    def time_factor(
        self, state: Any, start_times: FloatArray, workers: NDArray[np.int64]
    ) -> FloatArray:
        """Multiplicative slowdown of a unit starting at ``start_times`` on ``workers``."""
        return np.ones(np.shape(start_times))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.spec!r})"
