"""The contract every compute-time model and worker pattern fulfils.

A :class:`DelayModel` describes one unit of work: one micro-batch when the scenario has
micro-batches, otherwise one worker's whole gradient computation including its round trip.
A :class:`WorkerPattern` says which worker is slow when, on top of a model.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np
from numpy.typing import ArrayLike, NDArray

Shape = int | tuple[int, ...]


class DelayModel(ABC):
    """Distribution of the duration of one unit of work, in seconds."""

    #: the spec text that built this model, e.g. ``"exp:rate=1"``
    spec: str

    @abstractmethod
    def sample(self, rng: np.random.Generator, shape: Shape) -> NDArray[np.float64]:
        """Draw i.i.d. durations of the given shape, vectorised."""

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
    def support(self) -> tuple[float, float]:
        """Lower and upper end of the support (upper may be ``inf``)."""
        return (0.0, float("inf"))

    @abstractmethod
    def cdf(self, x: ArrayLike) -> NDArray[np.float64]: ...

    @abstractmethod
    def pdf(self, x: ArrayLike) -> NDArray[np.float64]: ...

    @abstractmethod
    def quantile(self, q: ArrayLike) -> NDArray[np.float64]: ...

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.spec!r})"
