"""What ``predict`` answers about: the scenario it is asked, the rows and the whole answer."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from tailtrain.delays import DelayModel, WorkerPattern
from tailtrain.delays.groups import check_grouping, time_scheduled_refusal
from tailtrain.errors import UsageError

STRATEGIES = (
    "sync",
    "k-sync",
    "k-batch-sync",
    "k-async",
    "k-batch-async",
    "async",
    "dropcompute",
    "rebalance",
)
K_FAMILY = ("k-sync", "k-batch-sync", "k-async", "k-batch-async")
ALL_K_UP_TO = 32  #: scenarios with at most this many workers get one row per K = 1..N

CRITERION = (
    "best K per strategy: the largest K whose effective speedup (gradients applied per second "
    "relative to sync) is within 2 standard errors of the highest, as Lemma 7 / Theorem 3 order "
    "the error-runtime trade-off by it; DropCompute: tau* maximising S_eff (Eq. 6); Local-SGD: "
    "the smallest period H within 5% of the best rate (fewer local steps, less model drift)"
)


@dataclass(frozen=True)
class DelayScenario:
    """What to predict: N workers, a delay model, optional pattern, micro-batches and T^c."""

    workers: int
    delay: DelayModel
    pattern: WorkerPattern | None = None
    micro_batches: int | None = None
    comm: float | DelayModel = 0.0
    ks: tuple[int, ...] | None = None
    samples: int = 2000
    seed: int = 0
    #: DropCompute's tau in seconds as asked (``dropcompute:threshold=X``); None: its tau*
    threshold: float | None = None
    #: ranks per replica group (hybrid sharding, ``delays.groups``): ``workers`` ranks form
    #: ``groups`` workers, each micro-batch the max over a group's ranks + ``group_cost`` s
    group_size: int = 1
    group_cost: float = 0.0

    def __post_init__(self) -> None:
        if self.threshold is not None and not self.threshold > 0:
            raise UsageError(f"a DropCompute threshold must be > 0 seconds, got {self.threshold}")
        if self.workers < 1:
            raise UsageError(f"--workers must be >= 1, got {self.workers}")
        check_grouping(self.workers, self.group_size, self.group_cost)
        if self.micro_batches is not None and self.micro_batches < 1:
            raise UsageError(f"--micro-batches must be >= 1, got {self.micro_batches}")
        if self.samples < 100:
            raise UsageError(f"--samples must be >= 100, got {self.samples}")
        if isinstance(self.comm, (int, float)) and not (
            self.comm >= 0 and math.isfinite(self.comm)
        ):
            raise UsageError(
                f"--comm-time must be a finite number of seconds >= 0, got {self.comm}"
            )
        bad = [k for k in self.ks or () if not 1 <= k <= self.groups]
        if bad:
            of = " (K of the replica groups)" if self.group_size > 1 else ""
            raise UsageError(f"--k {bad[0]} is out of range: K must lie in 1..{self.groups}{of}")
        if not math.isfinite(self.delay.mean) or not math.isfinite(self.comm_mean):
            raise UsageError(f"delay {self.delay.spec!r} has an infinite mean: E[T] is unbounded")
        if self.pattern is not None and self.pattern.time_scheduled and self.group_size > 1:
            raise UsageError(time_scheduled_refusal(self.pattern.spec))
        if self.pattern is not None and self.pattern.time_scheduled:
            raise UsageError(
                f"pattern {self.pattern.spec!r} changes speed at virtual times, which predict "
                f"cannot model; use 'tailtrain simulate'"
            )
        if not self.delay.mean * (self.micro_batches or 1) + self.comm_mean > 0:
            raise UsageError(f"delay {self.delay.spec!r} and --comm-time are both always 0")

    @property
    def groups(self) -> int:
        """The workers the rules act on: ``workers`` / ``group_size`` replica groups."""
        return self.workers // self.group_size

    @property
    def grouped(self) -> DelayScenario | None:
        """This scenario at group level (``groups`` workers, each micro-batch of the law
        ``theory.group_max.GroupMax``), or None without replica groups."""
        if self.group_size == 1 and self.group_cost == 0:
            return None
        from tailtrain.theory.group_max import GroupMax

        return replace(
            self,
            workers=self.groups,
            delay=GroupMax(self.delay, self.group_size, self.group_cost),
            group_size=1,
            group_cost=0.0,
        )

    @property
    def comm_mean(self) -> float:
        return float(self.comm.mean if isinstance(self.comm, DelayModel) else self.comm)

    @property
    def iid(self) -> bool:
        """i.i.d. jobs: no pattern, and no trace replayed per worker."""
        plain = self.pattern is None or getattr(self.pattern, "spec", "iid") == "iid"
        return plain and not self.delay.per_worker

    def describe(self) -> dict[str, Any]:
        comm = self.comm.spec if isinstance(self.comm, DelayModel) else self.comm
        pattern = "iid" if self.pattern is None else self.pattern.spec
        groups = {}
        if self.group_size != 1 or self.group_cost != 0:
            groups = {"group_size": self.group_size, "group_cost": self.group_cost}
        return {
            "workers": self.workers,
            **groups,
            "delay": self.delay.spec,
            "pattern": pattern,
            "micro_batches": self.micro_batches,
            "comm_time": comm,
            "samples": self.samples,
            "seed": self.seed,
        }


@dataclass(frozen=True)
class Row:
    """One strategy at one setting. ``*_stderr`` are 0 for exact and quadrature numbers."""

    strategy: str
    k: int
    iteration_time: float
    iteration_time_stderr: float
    speedup_vs_sync: float
    effective_speedup: float
    effective_speedup_stderr: float
    method: str
    best: bool = False
    threshold: float | None = None
    drop_rate: float | None = None
    spec: str | None = None  #: the setting as a strategy spec, where K does not say it

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        if self.strategy != "dropcompute":
            del out["threshold"], out["drop_rate"]
        if self.spec is None:
            del out["spec"]
        return out


@dataclass(frozen=True)
class Prediction:
    """All rows of a scenario; ``rows`` holds every K evaluated, see
    [`shown`][tailtrain.Prediction.shown]."""

    scenario: DelayScenario
    rows: tuple[Row, ...]
    criterion: str = CRITERION
    notes: tuple[str, ...] = field(default=())

    def shown(self, ks: Sequence[int]) -> list[Row]:
        """Rows whose K is in ``ks``, plus every best row and the non-K-family rows."""
        keep = set(ks)
        return [r for r in self.rows if r.strategy not in K_FAMILY or r.k in keep or r.best]

    def to_json(self, ks: Sequence[int]) -> dict[str, Any]:
        best = {r.strategy: r.k for r in self.rows if r.best}
        return {
            "scenario": self.scenario.describe(),
            "criterion": self.criterion,
            "best": best,
            "notes": list(self.notes),
            "results": [r.as_dict() for r in self.shown(ks)],
        }


def k_grid(workers: int, *, compact: bool = False) -> list[int]:
    """The K values listed: every K for N <= 32 (<= 8 when ``compact``), else 1, 2, 4, the
    eighths of N (quarters when ``compact``) and N-1, N."""
    if workers <= (8 if compact else ALL_K_UP_TO):
        return list(range(1, workers + 1))
    fractions = (0.25, 0.5, 0.75) if compact else tuple(np.arange(1, 8) / 8)
    ks = {1, workers, workers - 1} | ({1} if compact else {2, 4})
    ks |= {max(1, round(f * workers)) for f in fractions}
    return sorted(k for k in ks if 1 <= k <= workers)
