"""The scenario context of one prediction: the laws and seeded samplers that every strategy's
estimate in ``prediction.estimates`` (and at large N, ``prediction.large``) draws on.

Above :data:`LARGE_N` workers under a ``heterogeneous`` pattern (speeds s_n ~ U(low, high)
drawn once per run), a Monte Carlo of N workers per iteration is too costly (N = 10^4
already needed over 13 GB), so the context carries the speeds' law instead
(``_Context.speeds``): within one iteration the workers' times are N i.i.d. draws of the
scale mixture (``theory.scale_mixture``), which becomes the job law and the partial-sum
laws, and the rows that span iterations (where a worker keeps its speed) use it through
``prediction.large``."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from tailtrain.core.capacity import check_memory
from tailtrain.delays import DelayModel, DelayProcess, parse_delay
from tailtrain.delays.groups import group_unit_times, groups_note
from tailtrain.delays.patterns import Heterogeneous
from tailtrain.delays.process import trace_notes, trace_terms
from tailtrain.errors import UsageError
from tailtrain.prediction.scenario import DelayScenario, k_grid
from tailtrain.theory.estimate import monte_carlo
from tailtrain.theory.families import NonNegative, nonnegative
from tailtrain.theory.group_max import GroupMax
from tailtrain.theory.scale_mixture import ScaleMixture
from tailtrain.theory.sums import partial_sum_laws

log = logging.getLogger(__name__)

_RUNS = 16  # independent runs under a worker pattern (their spread gives the standard error)
LARGE_N = 2048  #: above this many workers, the large-N methods (``prediction.large``)


@dataclass
class _Context:
    """Derived laws and samplers shared by the strategies of one prediction."""

    scenario: DelayScenario
    exact_delay: DelayModel  # law used by formulas (negatives clipped when they matter)
    sampled_delay: DelayModel  # law the samplers draw (negatives always clipped)
    sampled_comm: DelayModel | None
    job_law: DelayModel | None  # exact law of one job (sum of M micro-batches), if known
    partial_sums: list[DelayModel] | None  # laws of the sums of 1..M micro-batches, if known
    ks: list[int] | NDArray[np.int64]  # every K evaluated where all are (1..N without --k)
    listed: NDArray[np.int64]  # the K that become rows (every K is still evaluated)
    notes: list[str]
    sync_time: float = math.nan  # E[T_sync], set by the sync rows (needed to pick best K)
    k_sync: tuple[Any, ...] = ()  # (K, E[T], stderr, method) of K-sync, set by the sync rows
    #: (low, high) of the workers' speeds, when their laws stand in for a Monte Carlo of N
    speeds: tuple[float, float] | None = None
    _sync_sample: list[tuple[NDArray[np.float64], NDArray[np.float64]]] | None = None
    _sums: list[DelayModel] = field(default_factory=list)  # laws of sums, see sum_law
    #: the scenario as asked, of ranks (``scenario`` is its groups' when it has groups)
    ranks: DelayScenario | None = None
    #: the law each rank's micro-batch is drawn from (negatives clipped)
    rank_delay: DelayModel | None = None

    @classmethod
    def build(cls, ranks: DelayScenario) -> _Context:
        """The context of ``ranks``; with replica groups, that of its groups (``scenario``
        is :attr:`DelayScenario.grouped`: the laws are the groups' micro-batch law F^G, and
        :meth:`run` draws the ranks through the pattern and groups them)."""
        s = ranks.grouped or ranks
        exact_delay = nonnegative(ranks.delay)
        sampled = NonNegative(ranks.delay) if ranks.delay.support[0] < 0 else ranks.delay
        comm = s.comm if isinstance(s.comm, DelayModel) else None
        # validates
        DelayProcess(sampled, ranks.pattern, ranks.seed, ranks.workers, ranks.micro_batches)
        notes = []
        if exact_delay is not ranks.delay:
            notes.append(f"{ranks.delay.spec!r} is negative with some probability; clipped at 0")
        for note in trace_notes(ranks.delay, ranks.workers).values():
            log.warning("%s", note)
            notes.append(note)
        rank_delay = sampled
        if s is not ranks:
            size, cost = ranks.group_size, ranks.group_cost
            exact_delay = GroupMax(exact_delay, size, cost)
            sampled = GroupMax(sampled, size, cost)
            how = (
                "E[T] from the law of a group's micro-batch, F^G shifted by the cost"
                if s.iid
                else "the ranks drawn through the pattern (or trace) and grouped, by Monte Carlo"
            )
            notes.append(f"{groups_note(ranks.workers, size, cost)}; {how}")
        speeds = _heterogeneous_speeds(s) if s is ranks else None
        log.info("predict: exact job law %s", "known" if s.iid or speeds else "unused (pattern)")
        sums = partial_sum_laws(exact_delay, s.micro_batches or 1) if s.iid or speeds else None
        if speeds is not None and sums is not None:
            sums = [ScaleMixture(law, *speeds) for law in sums]
            notes.append(
                f"N > {LARGE_N} under {s.pattern.spec!r}: a worker's time in one iteration is "
                f"its micro-batch law scaled by U{speeds}, i.i.d. across workers (numerical "
                f"mixture law); rows spanning iterations keep each worker's speed"
            )
        return cls(
            scenario=s,
            exact_delay=exact_delay,
            sampled_delay=sampled,
            sampled_comm=None if comm is None else nonnegative(comm),
            job_law=None if sums is None else sums[-1],
            partial_sums=sums,
            ks=sorted(s.ks) if s.ks else np.arange(1, s.workers + 1),
            listed=np.asarray(s.ks or k_grid(s.workers), dtype=np.int64),
            notes=notes,
            speeds=speeds if sums is not None else None,
            ranks=ranks,
            rank_delay=rank_delay,
        )

    @property
    def grouping(self) -> tuple[int, float] | None:
        """(G, cost) of the replica groups, or None when every rank is a worker."""
        r = self.ranks
        if r is None or (r.group_size == 1 and r.group_cost == 0):
            return None
        return r.group_size, r.group_cost

    @property
    def m(self) -> int:
        return self.scenario.micro_batches or 1

    def rng(self, *stream: int) -> np.random.Generator:
        """Independent seeded stream per (component, K): same seed, same numbers."""
        return np.random.default_rng([self.scenario.seed, *stream])

    def method(self, n: int) -> str:
        return monte_carlo(n, self.scenario.seed)

    @property
    def runs(self) -> int:
        """Independent runs to sample. A pattern's per-run draws (e.g. heterogeneous speeds)
        and persistence make the iterations of one run dependent, so under a pattern the
        standard errors come from the spread of run means."""
        return 1 if self.scenario.iid else _RUNS

    def run(self, rng: np.random.Generator, iterations: int, part: int = 0) -> NDArray[np.float64]:
        """t[i, n, m] of one run through the worker pattern (i.i.d. when there is none). A
        trace replay is deterministic, so run ``part`` replays the part-th segment of it."""
        s = self.scenario
        start = part * iterations if s.delay.per_worker else 0
        if self.grouping is not None:  # the ranks' draws, grouped (``delays.groups``)
            r = self.ranks
            process = DelayProcess(
                self.rank_delay, r.pattern, rng, r.workers, r.micro_batches, start=start
            )
            t = group_unit_times(process.next_block(iterations), *self.grouping)
            return t if t.ndim == 3 else t[:, :, None]
        process = DelayProcess(
            self.sampled_delay, s.pattern, rng, s.workers, s.micro_batches, start=start
        )
        t = process.next_block(iterations)
        return t if t.ndim == 3 else t[:, :, None]

    def blocks(self, rng: np.random.Generator, iterations: int) -> list[NDArray[np.float64]]:
        """t[i, n, m] of ``iterations`` in total, one block per independent run."""
        per_run = max(1, iterations // self.runs)
        return [self.run(child, per_run, part) for part, child in enumerate(rng.spawn(self.runs))]

    def comm_times(self, rng: np.random.Generator, shape: tuple[int, ...]) -> NDArray[np.float64]:
        if self.sampled_comm is None:
            return np.full(shape, float(self.scenario.comm))
        return self.sampled_comm.sample(rng, shape)

    def iid_jobs(self, rng: np.random.Generator, shape: tuple[int, ...]) -> NDArray[np.float64]:
        """i.i.d. job times (sum of M micro-batches plus T^c) of the given shape."""
        jobs = self.sampled_delay.sample(rng, (*shape, self.m)).sum(axis=-1)
        return jobs + self.comm_times(rng, shape)

    def worker_jobs(self, rng: np.random.Generator, shape: tuple[int, int]) -> NDArray[np.float64]:
        """Job times (jobs of M micro-batches plus T^c) of shape (workers, jobs): row w is one
        worker's successive jobs, under :attr:`speeds` all at the row's own speed."""
        if self.speeds is None:
            return self.iid_jobs(rng, shape)
        speed = rng.uniform(*self.speeds, size=(shape[0], 1))
        jobs = self.sampled_delay.sample(rng, (*shape, self.m)).sum(axis=-1) * speed
        return jobs + self.comm_times(rng, shape)

    def sync_sample(self) -> list[tuple[NDArray[np.float64], NDArray[np.float64]]]:
        """Shared Monte Carlo sample: per run, micro-batch times t[i, n, m] and T^c[i]."""
        if self._sync_sample is None:
            rng = self.rng(0)
            iterations = self.iterations_for(self.scenario.samples)
            need = 8 * iterations * self.rank_count * self.m * 4
            check_memory(need, f"--workers {self.scenario.workers}", "Monte Carlo draws")
            blocks = self.blocks(rng, iterations)
            self._sync_sample = [(t, self.comm_times(rng, (t.shape[0],))) for t in blocks]
        return self._sync_sample

    def worker_means(self) -> list[NDArray[np.float64]]:
        """Per run of :meth:`sync_sample`, each worker's mean micro-batch time: the same runs
        (same seeds, so the same pattern state: a heterogeneous speed, a subset's picks) over
        the delay's mean instead of its draws, so a worker's law is known, not estimated from
        a few draws. A trace replayed per worker has no one mean: its own draws are averaged."""
        if self.speeds is not None:  # a worker's speed is its whole state: one draw each
            s = self.scenario
            mean = parse_delay(f"const:value={float(self.sampled_delay.mean)!r}")
            return [
                DelayProcess(mean, s.pattern, child, s.workers).next_block(1)[0]
                for child in self.rng(0).spawn(self.runs)
            ]
        sample = self.sync_sample()
        # groups under a pattern: a group's mean is that of the max, not of one rank's law
        if self.scenario.delay.per_worker or (self.grouping and not self.scenario.iid):
            return [t.mean(axis=(0, 2)) for t, _ in sample]
        s, iterations = self.scenario, sample[0][0].shape[0]
        mean = parse_delay(f"const:value={float(self.sampled_delay.mean)!r}")
        out = []
        for child in self.rng(0).spawn(self.runs):  # the children sync_sample's runs used
            process = DelayProcess(mean, s.pattern, child, s.workers, s.micro_batches)
            t = process.next_block(iterations)
            out.append(t.reshape(iterations, s.workers, -1).mean(axis=(0, 2)))
        return out

    @property
    def rank_count(self) -> int:
        """The ranks drawn per iteration (the workers, or the groups' ranks)."""
        return self.scenario.workers if self.ranks is None else self.ranks.workers

    def sum_law(self, m: int) -> DelayModel:
        """The law of the sum of m micro-batch times (unscaled), for any m >= 1."""
        if len(self._sums) < m:
            laws = partial_sum_laws(self.exact_delay, max(m, 2 * len(self._sums)))
            if laws is None:
                raise UsageError(f"no law for sums of {self.scenario.delay.spec!r}")
            self._sums = laws
        return self._sums[m - 1]

    def iterations_for(self, wanted: int) -> int:
        """At most ``wanted`` iterations (or all of a replayed trace) and ~8M micro-batch
        draws, at least 100."""
        per_iteration = self.rank_count * self.m
        delay = self.scenario.delay if self.ranks is None else self.ranks.delay
        replayed = [t.replay.lengths.max() for t in trace_terms(delay)]
        wanted = max(wanted, *replayed) if self.scenario.delay.per_worker else wanted
        return int(max(100, min(wanted, 8_000_000 // per_iteration)))


def _heterogeneous_speeds(s: DelayScenario) -> tuple[float, float] | None:
    """(low, high) when the speeds' law replaces the Monte Carlo: above :data:`LARGE_N`
    workers, a lone ``heterogeneous`` pattern, a delay that is not a replay."""
    p = s.pattern
    if s.workers <= LARGE_N or not isinstance(p, Heterogeneous) or s.delay.per_worker:
        return None
    return (p.low, p.high)
