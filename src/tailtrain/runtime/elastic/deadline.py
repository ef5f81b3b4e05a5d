"""The learned hang deadline of the elastic layer (``runtime.elastic.shrink``, STEPPING).

A shrinking rank waits for each collective up to a deadline learned from the measured round
times, as the parameter server's ``--worker-timeout`` is (``runtime.ps.liveness``): a quantile
of the recent rounds, so a burst of load on a few rounds does not move it, and never more than
``--timeout``. The same seconds give the census window after a failure. The allreduce, the
partial collective and ``integrate.StragglerStep`` all learn it here.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

#: the deadline: DEADLINE_FACTOR times the QUANTILE of the last ROUNDS_SEEN settled rounds
#: (a burst of load on a few rounds does not move it), and at least LONGEST_FACTOR times the
#: longest of them (a round as slow as any recent one never trips it), at least MIN_DEADLINE
#: seconds. Tighter than the parameter server's ``runtime.ps.liveness`` bound (10 x the
#: longest, 2 s): the pauses that are no hang (rank 0's evaluations, its checkpoint writes)
#: are waited for up to --timeout and kept out of the rounds seen, and a false alarm costs a
#: regroup, not a rank
DEADLINE_FACTOR = 5.0
QUANTILE = 0.9
LONGEST_FACTOR = 1.5
MIN_DEADLINE = 1.0
ROUNDS_SEEN = 100
#: the census window after a failure (a peer's socket closed): WINDOW_FACTOR times the
#: longest recent round (a live member may be inside one compute), at least MIN_WINDOW seconds
WINDOW_FACTOR = 1.5
MIN_WINDOW = 0.2


@dataclass
class Deadline:
    """The learned deadline (module docstring) from the ``recent`` settled rounds' seconds."""

    timeout: float
    recent: deque[float] = field(default_factory=lambda: deque(maxlen=ROUNDS_SEEN))
    #: the longest of ``recent`` and their QUANTILE (0: none yet), kept as rounds are seen:
    #: the bound is read at every collective
    longest: float = 0.0
    quantile: float = 0.0

    def seen(self, seconds: float) -> None:
        if seconds == seconds:  # not NaN
            self.recent.append(seconds)
            # sorted() on <= ROUNDS_SEEN floats: a few us once a round, less than np.quantile
            ordered = sorted(self.recent)
            self.longest = ordered[-1]
            self.quantile = ordered[int(QUANTILE * (len(ordered) - 1))]  # nearest rank below

    def adopt(self, recent: list[float]) -> None:
        """The lead's rounds seen (a sync: every member learns from the same rounds)."""
        self.recent.clear()
        for seconds in recent:
            self.seen(float(seconds))

    @property
    def bound(self) -> float:
        if self.longest <= 0.0:
            return self.timeout
        learned = max(DEADLINE_FACTOR * self.quantile, LONGEST_FACTOR * self.longest)
        return min(self.timeout, max(MIN_DEADLINE, learned))

    @property
    def window(self) -> float:
        """The census window after a failure (after a hang: :data:`HANG_WINDOW`)."""
        if self.longest <= 0.0:
            return min(self.timeout, max(MIN_WINDOW, MIN_DEADLINE))
        return min(self.bound, max(MIN_WINDOW, WINDOW_FACTOR * self.longest))

    def describe(self) -> str:
        """How :attr:`bound` was learned, in words (the run's summary)."""
        if self.longest <= 0.0:
            return f"--timeout {self.timeout:g} s: no round had settled"
        return (
            f"{DEADLINE_FACTOR:g} x the {QUANTILE:g} quantile ({self.quantile:.3f} s) and at "
            f"least {LONGEST_FACTOR:g} x the longest ({self.longest:.3f} s) of the last "
            f"{len(self.recent)} settled rounds, at least {MIN_DEADLINE:g} s, at most --timeout "
            f"{self.timeout:g} s; rounds after a checkpoint write left out"
        )
