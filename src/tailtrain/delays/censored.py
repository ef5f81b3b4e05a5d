"""Censored trace rows: what a run that stopped work at a threshold did not see.

A DropCompute round stops a worker when its threshold tau cuts in (DropCompute Alg. 1): the
micro-batch then running is seen only up to that moment, and the later ones not at all. A
trace marks such rows ``censored=1``; their ``seconds`` is a lower bound (the time already
spent when the threshold cut in, 0 for a micro-batch never started). Reading only the
survivors as the law biases every figure low: the slow micro-batches are exactly the ones cut.

:func:`estimate` reads a unit's law from such rows in two parts (issue 36):

* **the body, non-parametric**: the Kaplan-Meier estimate (``scipy.stats.ecdf`` on
  ``scipy.stats.CensoredData``). A micro-batch's bound is tau minus the time its worker had
  already spent in the step, which does not depend on the micro-batch's own time, so the
  censoring is non-informative and Kaplan-Meier is consistent wherever some unit was seen.
  A fitted family is not: the log-normal fitted to all the units before read a real
  trace's sync step 8-20% high, because real units are not log-normal.
* **the tail beyond the largest unit seen** (``edge``), which Kaplan-Meier cannot see: a
  threshold censors everything past tau. The excess over the upper quarter of the seen
  units is fitted by censored maximum likelihood in each of :data:`FAMILIES` (the
  generalized Pareto of extreme-value theory, Pickands-Balkema-de Haan, and three simpler
  ones), and the family with the least AIC is kept; its survival, scaled to meet
  Kaplan-Meier's at the edge, is the law beyond it. The choice and its fit (the largest gap
  between the family's and Kaplan-Meier's conditional survival where both see) are in the
  note :func:`complete` returns.

:func:`complete` replaces each censored row by a draw of its worker's law conditioned on
exceeding its bound (inverse survival on U(0, S(bound)), from a fixed seed, so reading a
trace stays deterministic), and the replay, the sampler and the moments all use the
completed rows: every reader of a trace (``advise``, ``--delay trace:``, the probe's verdicts
through ``advise``) meets the same estimate. A worker with fewer than :data:`MIN_OBSERVED`
units seen borrows the pooled law; where the pooled rows cannot tell the law either,
:func:`complete` refuses in one line.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import stats

from tailtrain.errors import UsageError

MIN_OBSERVED = 5  #: uncensored rows a worker needs for its own law
SEED = 0  #: the draws that complete censored rows
#: the tail's candidate families, for the excess over the threshold (location 0)
FAMILIES = {
    "genpareto": stats.genpareto,
    "expon": stats.expon,
    "lognorm": stats.lognorm,
    "weibull_min": stats.weibull_min,
}
TAIL_SHARE = 0.25  #: the seen units above the tail's threshold: the upper quarter
MIN_TAIL = 10  #: seen excesses a two-parameter family needs (fewer: the exponential)


@dataclass(frozen=True)
class Tail:
    """The law beyond Kaplan-Meier's reach: the excess over ``threshold`` follows ``law``."""

    family: str
    law: Any  #: a frozen ``scipy.stats`` law of the excess
    threshold: float
    #: the largest gap between the family's conditional survival and Kaplan-Meier's where
    #: both see (the fit's quality), and the AIC lead over the runner-up family
    gap: float
    lead: float


@dataclass(frozen=True)
class UnitLaw:
    """A unit's law from censored rows: Kaplan-Meier up to ``edge``, :class:`Tail` beyond."""

    times: np.ndarray  #: Kaplan-Meier's distinct seen times, ascending
    survival_after: np.ndarray  #: its survival just after each of them
    tail: Tail

    @property
    def edge(self) -> float:
        """The largest unit seen: Kaplan-Meier's reach."""
        return float(self.times[-1])

    @property
    def beyond_edge(self) -> float:
        """The mass Kaplan-Meier leaves past its reach (the censored top)."""
        return float(self.survival_after[-1])

    def sf(self, t: np.ndarray | float) -> np.ndarray:
        """S(t) = P(unit > t)."""
        t = np.asarray(t, dtype=float)
        i = np.searchsorted(self.times, t, side="right")
        body = np.where(i > 0, self.survival_after[np.maximum(i - 1, 0)], 1.0)
        u = self.tail.threshold
        scale = self.beyond_edge / self.tail.law.sf(self.edge - u)
        tail = scale * self.tail.law.sf(np.maximum(t, self.edge) - u)
        return np.where(t < self.edge, body, tail)

    def isf(self, q: np.ndarray) -> np.ndarray:
        """The t with S(t) = q, q in (0, 1] (the body's smallest t with S(t) <= q)."""
        q = np.asarray(q, dtype=float)
        # survival_after falls: the first index where it is <= q
        i = np.searchsorted(-self.survival_after, -q, side="left")
        body = self.times[np.minimum(i, self.times.size - 1)]
        u = self.tail.threshold
        inner = q / self.beyond_edge * self.tail.law.sf(self.edge - u) if self.beyond_edge else q
        with np.errstate(divide="ignore", invalid="ignore"):
            tail = u + self.tail.law.isf(np.clip(inner, 0.0, 1.0))
        return np.where(q >= self.beyond_edge, body, tail)

    def quantile(self, p: float) -> float:
        return float(self.isf(np.array(1.0 - p)))

    def mean(self) -> float:
        """The integral of S: Kaplan-Meier's steps, then the tail past the edge."""
        widths = np.diff(np.concatenate([[0.0], self.times]))
        before = np.concatenate([[1.0], self.survival_after[:-1]])
        body = float(np.dot(widths, before))
        if not self.beyond_edge:
            return body
        a = self.edge - self.tail.threshold
        # E[(X - a)+] of the excess law, over its survival at a: the mean residual life at a
        excess = self.tail.law.expect(lambda s: s - a, lb=a) / self.tail.law.sf(a)
        return body + self.beyond_edge * float(excess)

    def beyond(self, bound: np.ndarray, uniform: np.ndarray) -> np.ndarray:
        """Draws conditioned on exceeding ``bound`` (one per uniform in [0, 1))."""
        bound = np.asarray(bound, dtype=float)
        return np.maximum(self.isf(self.sf(bound) * (1.0 - uniform)), bound)


def _censored_data(seconds: np.ndarray, censored: np.ndarray) -> stats.CensoredData:
    # a bound of 0 (a micro-batch never started) says nothing: it is left out of the fit
    return stats.CensoredData(
        uncensored=seconds[~censored], right=seconds[censored & (seconds > 0)]
    )


def _fit(name: str, seen: np.ndarray, cut: np.ndarray) -> tuple[Any, float]:
    """``name``'s censored MLE of the excesses (location 0), and its AIC."""
    family = FAMILIES[name]
    params = family.fit(stats.CensoredData(uncensored=seen, right=cut), floc=0)
    law = family(*params)
    with np.errstate(divide="ignore"):
        loglik = float(np.sum(law.logpdf(seen)) + np.sum(law.logsf(cut)))
    free = len(params) - 1  # the location is fixed at 0
    return law, 2 * free - 2 * loglik


def fit_tail(seconds: np.ndarray, censored: np.ndarray, families: tuple[str, ...]) -> Tail:
    """The tail (module docstring) of rows with at least one seen unit above 0."""
    seen = np.sort(seconds[~censored])
    u = float(np.quantile(seen, 1.0 - TAIL_SHARE)) if seen.size >= MIN_TAIL else 0.0
    over = seen[seen > u] - u
    cut = seconds[censored & (seconds > u)] - u
    if over.size < MIN_TAIL:
        families = ("expon",)
    fits = {}
    for name in families:
        try:
            fits[name] = _fit(name, over, cut)
        except (ValueError, RuntimeError, FloatingPointError):  # a family that cannot fit
            continue
    # a unit's time has a finite mean: a family fitted with an infinite one is no candidate
    fits = {k: v for k, v in fits.items() if np.isfinite(v[1]) and np.isfinite(v[0].mean())}
    if not fits:
        fits = {"expon": _fit("expon", over, cut)}
    ranked = sorted(fits, key=lambda k: fits[k][1])
    law = fits[ranked[0]][0]
    lead = fits[ranked[1]][1] - fits[ranked[0]][1] if len(ranked) > 1 else float("inf")
    km = stats.ecdf(stats.CensoredData(uncensored=over, right=cut)).sf
    gap = float(np.max(np.abs(law.sf(over) - km.evaluate(over)))) if over.size else 0.0
    return Tail(ranked[0], law, u, gap, lead)


def estimate(
    seconds: np.ndarray, censored: np.ndarray, families: tuple[str, ...] | None = None
) -> UnitLaw | None:
    """The unit law of ``seconds`` (lower bounds where ``censored``; module docstring), or
    None when fewer than :data:`MIN_OBSERVED` rows are seen (censored rows at 0 say
    nothing). ``families``: the tail's candidates (default all of :data:`FAMILIES`)."""
    seconds, censored = np.asarray(seconds, dtype=float), np.asarray(censored, dtype=bool)
    if np.count_nonzero(seconds[~censored] > 0) < MIN_OBSERVED:
        return None
    km = stats.ecdf(_censored_data(seconds, censored)).sf
    times, after = np.asarray(km.quantiles, float), np.asarray(km.probabilities, float)
    tail = fit_tail(seconds, censored, families or tuple(FAMILIES))
    return UnitLaw(times, after, tail)


def complete(
    spec: str, worker: np.ndarray, seconds: np.ndarray, censored: np.ndarray
) -> tuple[np.ndarray, str | None]:
    """``seconds`` with each censored row replaced by a draw of its worker's law beyond its
    bound, and a one-line note (None when nothing is censored)."""
    if not censored.any():
        return seconds, None
    digest = hashlib.blake2b(digest_size=16)
    for part in (spec.encode(), worker, seconds, censored):
        digest.update(
            np.ascontiguousarray(part).tobytes() if isinstance(part, np.ndarray) else part
        )
    key = digest.hexdigest()
    # advise reads one trace once per candidate it prices: the fits are done once per trace
    if key not in _COMPLETED:
        if len(_COMPLETED) >= 8:
            _COMPLETED.pop(next(iter(_COMPLETED)))
        _COMPLETED[key] = _complete(spec, worker, seconds, censored)
    out, note = _COMPLETED[key]
    return out.copy(), note


_COMPLETED: dict[str, tuple[np.ndarray, str]] = {}  #: the last few traces completed


def _complete(
    spec: str, worker: np.ndarray, seconds: np.ndarray, censored: np.ndarray
) -> tuple[np.ndarray, str]:
    pooled = estimate(seconds, censored)
    if pooled is None:
        raise UsageError(
            f"trace {spec!r}: {np.count_nonzero(~censored)} uncensored rows cannot tell the law "
            f"of {np.count_nonzero(censored)} censored ones; record with a higher threshold"
        )
    rng = np.random.default_rng(SEED)
    out = seconds.copy()
    borrowed = []
    # the pooled rows choose the tail's family; each worker fits that family to its own
    family = (pooled.tail.family,)
    for w in np.unique(worker[censored]):
        mine = worker == w
        law = estimate(seconds[mine], censored[mine], family)
        if law is None:
            law, _ = pooled, borrowed.append(int(w))
        rows = np.flatnonzero(mine & censored)
        out[rows] = law.beyond(seconds[rows], rng.random(rows.size))
    share = np.count_nonzero(censored) / censored.size
    tail = pooled.tail
    note = (
        f"trace {spec!r}: {share:.0%} of its rows are censored (cut by a threshold); their law "
        f"is Kaplan-Meier per worker up to the largest unit seen, and past it a {tail.family} "
        f"tail chosen by censored likelihood (AIC lead {tail.lead:.1f}, largest gap to "
        f"Kaplan-Meier {tail.gap:.3f}); the survivors alone would read low"
    )
    if borrowed:
        note += f" (workers {borrowed} too few survivors: the pooled law)"
    return out, note
