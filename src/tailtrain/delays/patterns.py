"""Worker patterns: which worker is slow when, on top of a delay model.

Spec names (``parse_pattern``); patterns joined by ``+`` apply left to right:

* ``iid`` (default): every unit is an independent draw.
* ``heterogeneous:low=,high=``: worker w's times are multiplied by a scale s_w ~ U(low, high),
  drawn once per run (per-worker heterogeneity).
* ``persistent:h=``: each worker keeps its draw for h iterations (blocks 0..h−1, h..2h−1, …),
  then draws afresh (LGC §III-A, following its ref. [21]; h = 1 is i.i.d.).
* ``subset:s=,delay=``: at every iteration s workers chosen uniformly at random get +delay
  seconds (eager-SGD §7.2.1: 1 of 8 with 200–400 ms; §7.2.2: 4 of 64 with 300/460 ms).
* ``linear:step=[,offset=0]``: worker rank r gets +(offset + r·step) seconds at every iteration
  (eager-SGD Fig. 8, ``usleep(pid * 1000)``: step=0.001).
* ``rotating:low=0.05,high=0.4``: the N workers get +linspace(low, high, N) seconds, and the
  assignment shifts by one rank every iteration, so worker r at iteration t gets entry
  (r + t) mod N (eager-SGD §7.2.3: 8 processes, 50–400 ms, "shifted after each step").
* ``slowdown:at=,fraction=,factor=[,until=]``: from virtual time ``at`` (until ``until``),
  a fixed, seeded set of round(fraction·N) workers is ``factor`` times slower (DBW §4.3: at
  160 s, half of 16 workers slow down by 5). Applied by the engine through ``time_factor`` at
  each unit's virtual start time, because the sampler does not know virtual time.

Additive skews (subset, linear, rotating) model an injected sleep before the computation, so
with micro-batches they apply once per worker-iteration, to its first micro-batch, not to every
micro-batch. Multiplicative ones (heterogeneous, slowdown) scale every unit.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from tailtrain.delays.base import DelayModel, FloatArray, WorkerPattern
from tailtrain.delays.params import duration, number, positive
from tailtrain.delays.parse import split_terms
from tailtrain.errors import UsageError
from tailtrain.spec import Spec, parse_spec

Step = tuple[FloatArray, Any]  #: (times, new pattern state)


@dataclass(frozen=True, repr=False)
class IID(WorkerPattern):
    """Every unit an independent draw from the model."""

    spec: str = "iid"


@dataclass(frozen=True, repr=False)
class Heterogeneous(WorkerPattern):
    """Per-worker speed: worker w's times scaled by s_w ~ U(low, high), drawn once."""

    spec: str
    low: float
    high: float

    def init(self, rng: np.random.Generator, workers: int, micro_batches: int) -> FloatArray:
        return rng.uniform(self.low, self.high, size=workers)

    def apply(
        self, state: FloatArray, times: FloatArray, start: int, rng: np.random.Generator
    ) -> Step:
        times *= state[None, :, None]
        return times, state


@dataclass(frozen=True, repr=False)
class Persistent(WorkerPattern):
    """Each worker's draw is held for h iterations (LGC §III-A)."""

    spec: str
    h: int

    def init(self, rng: np.random.Generator, workers: int, micro_batches: int) -> Any:
        return None  # (index of the held block, its draws) once the first block is drawn

    def draw(
        self,
        model: DelayModel,
        state: Any,
        rng: np.random.Generator,
        start: int,
        shape: tuple[int, int, int],
    ) -> Step:
        blocks = np.arange(start, start + shape[0]) // self.h
        first, last = int(blocks[0]), int(blocks[-1])
        held = [state[1][None]] if state is not None and state[0] == first else []
        fresh = last - first + 1 - len(held)
        # the fresh blocks are last-fresh+1 .. last: a replayed trace gives those iterations
        drawn = [model.draw_block(rng, last - fresh + 1, (fresh, *shape[1:]))] if fresh else []
        table = np.concatenate([*held, *drawn])
        return table[blocks - first], (last, table[-1])


def _first_micro_batch(times: FloatArray) -> FloatArray:
    """The slot an additive per-iteration delay goes to: the first micro-batch."""
    return times[:, :, 0]


@dataclass(frozen=True, repr=False)
class Subset(WorkerPattern):
    """s workers chosen uniformly at random each iteration get +delay (eager-SGD §7.2)."""

    spec: str
    s: int
    delay: float

    def init(self, rng: np.random.Generator, workers: int, micro_batches: int) -> None:
        if self.s > workers:
            raise UsageError(
                f"pattern {self.spec!r} delays s={self.s} workers but there are "
                f"only {workers}; use s <= {workers}"
            )

    def apply(self, state: None, times: FloatArray, start: int, rng: np.random.Generator) -> Step:
        iterations, workers = times.shape[:2]
        if self.s == 0:
            return times, state
        # the s smallest of i.i.d. uniform keys are a uniformly random s-subset
        keys = rng.random((iterations, workers))
        chosen = np.argpartition(keys, self.s - 1, axis=1)[:, : self.s]
        _first_micro_batch(times)[np.arange(iterations)[:, None], chosen] += self.delay
        return times, state


@dataclass(frozen=True, repr=False)
class Linear(WorkerPattern):
    """Rank r gets +(offset + r·step) seconds every iteration (eager-SGD Fig. 8)."""

    spec: str
    step: float
    offset: float = 0.0

    def apply(self, state: None, times: FloatArray, start: int, rng: np.random.Generator) -> Step:
        _first_micro_batch(times)[:] += self.offset + self.step * np.arange(times.shape[1])
        return times, state


@dataclass(frozen=True, repr=False)
class Rotating(WorkerPattern):
    """linspace(low, high, N) seconds, shifted by one rank per iteration (eager-SGD §7.2.3)."""

    spec: str
    low: float = 0.05
    high: float = 0.4

    def apply(self, state: None, times: FloatArray, start: int, rng: np.random.Generator) -> Step:
        iterations, workers = times.shape[:2]
        skew = np.linspace(self.low, self.high, workers)
        slot = np.arange(workers)[None, :] + np.arange(start, start + iterations)[:, None]
        _first_micro_batch(times)[:] += skew[slot % workers]
        return times, state


@dataclass(frozen=True, repr=False)
class Slowdown(WorkerPattern):
    """From virtual time ``at``, a fixed fraction of workers is ``factor``× slower (DBW §4.3)."""

    spec: str
    at: float
    fraction: float
    factor: float
    until: float = math.inf
    time_scheduled: ClassVar[bool] = True

    def init(self, rng: np.random.Generator, workers: int, micro_batches: int) -> np.ndarray:
        count = math.floor(self.fraction * workers + 0.5)  # round half up: half of 16 is 8
        slow = np.zeros(workers, dtype=bool)
        slow[rng.choice(workers, size=count, replace=False)] = True
        return slow

    def time_factor(
        self, state: np.ndarray, start_times: FloatArray, workers: np.ndarray
    ) -> FloatArray:
        active = (start_times >= self.at) & (start_times < self.until) & state[workers]
        return np.where(active, self.factor, 1.0)


@dataclass(frozen=True, repr=False)
class Composite(WorkerPattern):
    """Several patterns applied left to right; time factors multiply."""

    spec: str
    parts: tuple[WorkerPattern, ...]

    def __post_init__(self) -> None:
        for part in self.parts[1:]:
            if type(part).draw is not WorkerPattern.draw:
                raise UsageError(
                    f"pattern {part.spec!r} must come first in {self.spec!r}: "
                    f"it decides the base draws"
                )
        object.__setattr__(self, "time_scheduled", any(p.time_scheduled for p in self.parts))

    def init(self, rng: np.random.Generator, workers: int, micro_batches: int) -> list[Any]:
        return [part.init(rng, workers, micro_batches) for part in self.parts]

    def draw(
        self,
        model: DelayModel,
        state: list[Any],
        rng: np.random.Generator,
        start: int,
        shape: tuple[int, int, int],
    ) -> Step:
        times, first = self.parts[0].draw(model, state[0], rng, start, shape)
        return times, [first, *state[1:]]

    def apply(
        self, state: list[Any], times: FloatArray, start: int, rng: np.random.Generator
    ) -> Step:
        new_state = []
        for part, part_state in zip(self.parts, state, strict=True):
            times, part_state = part.apply(part_state, times, start, rng)
            new_state.append(part_state)
        return times, new_state

    def time_factor(
        self, state: list[Any], start_times: FloatArray, workers: np.ndarray
    ) -> FloatArray:
        factor = np.ones(np.shape(start_times))
        for part, part_state in zip(self.parts, state, strict=True):
            factor = factor * part.time_factor(part_state, start_times, workers)
        return factor


def _iid(spec: Spec) -> IID:
    spec.require_known(())
    return IID(spec.text)


def _heterogeneous(spec: Spec) -> Heterogeneous:
    spec.require_known(("low", "high"))
    low, high = positive(spec, "low"), positive(spec, "high")
    if high < low:
        raise UsageError(f"{spec.text!r} needs high >= low (got low={low:g}, high={high:g})")
    return Heterogeneous(spec.text, low, high)


def _persistent(spec: Spec) -> Persistent:
    spec.require_known(("h",))
    return Persistent(spec.text, spec.get_int("h", minimum=1))


def _subset(spec: Spec) -> Subset:
    spec.require_known(("s", "delay"))
    return Subset(spec.text, spec.get_int("s", minimum=0), duration(spec, "delay"))


def _linear(spec: Spec) -> Linear:
    spec.require_known(("step", "offset"))
    return Linear(spec.text, duration(spec, "step"), duration(spec, "offset", 0.0))


def _rotating(spec: Spec) -> Rotating:
    spec.require_known(("low", "high"))
    low, high = duration(spec, "low", 0.05), duration(spec, "high", 0.4)
    if high < low:
        raise UsageError(f"{spec.text!r} needs high >= low (got low={low:g}, high={high:g})")
    return Rotating(spec.text, low, high)


def _slowdown(spec: Spec) -> Slowdown:
    spec.require_known(("at", "fraction", "factor", "until"))
    at = duration(spec, "at")
    until = number(spec, "until") if spec.has("until") else math.inf
    if not until > at:
        raise UsageError(f"{spec.text!r} needs until > at (got at={at:g}, until={until:g})")
    fraction = number(spec, "fraction", minimum=0.0, maximum=1.0)
    return Slowdown(spec.text, at, fraction, positive(spec, "factor"), until)


PATTERNS: dict[str, Callable[[Spec], WorkerPattern]] = {
    "iid": _iid,
    "heterogeneous": _heterogeneous,
    "persistent": _persistent,
    "subset": _subset,
    "linear": _linear,
    "rotating": _rotating,
    "slowdown": _slowdown,
}


def _parse_one(text: str) -> WorkerPattern:
    spec = parse_spec(text, what="worker pattern")
    build = PATTERNS.get(spec.name)
    if build is None:
        raise UsageError(
            f"unknown worker pattern {spec.name!r} in {text!r}; known: {', '.join(PATTERNS)}"
        )
    return build(spec)


def parse_pattern(text: str) -> WorkerPattern:
    """A worker pattern from its spec (see the module docstring for the names)."""
    parts: Sequence[WorkerPattern] = [_parse_one(t) for t in split_terms(text, what="pattern")]
    if len(parts) == 1:
        return parts[0]
    return Composite("+".join(p.spec for p in parts), tuple(parts))
