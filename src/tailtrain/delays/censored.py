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
  threshold censors everything past tau. (scipy's Kaplan-Meier lists the bounds among its
  times and stays flat from the largest unit to the largest bound; it is cut at the unit, so
  a row cut in between is drawn from the tail beyond its own bound, not past the largest.)
  The excess over the top tenth of the seen units is fitted by censored maximum likelihood
  in each of :data:`FAMILIES` (the generalized Pareto of extreme-value theory,
  Pickands-Balkema-de Haan, and three simpler ones). A bound past every unit seen enters
  the fit at the largest one (a heuristic: a threshold censors exactly the slow units, and
  such bounds alone once set a heavy shape where no unit was seen). A family other than the
  exponential must leave mass past the largest bound; the exponential's draws there are
  exact in closed form (it is memoryless). The
  exponential is kept unless another family leads it by :data:`SUPPORT` in AIC, and then
  the least AIC wins; its survival, scaled to meet Kaplan-Meier's at the edge, is the law
  beyond it. The choice and its fit (the largest gap between the family's and
  Kaplan-Meier's conditional survival where both see) are in the note :func:`complete`
  returns.

:func:`complete` replaces each censored row by a draw conditioned on exceeding its bound,
and the replay, the sampler and the moments all use the completed rows: every reader of a
trace (``advise``, ``--delay trace:``, the probe's verdicts through ``advise``) meets the
same estimate. A trace recorded on a real machine is not i.i.d. units, and three of its
structures would bias a plain draw from the pooled law (each was measured on two sync traces
of ``tailtrain train``, censored offline; docs/loop.md has the figures):

* **the load drifts** (:func:`local_scale`): the units are divided by the Kaplan-Meier median
  of the steps within :data:`DRIFT_REACH` of theirs, so a cut in a slow stretch is completed
  as slow (an accelerated-failure-time model whose scale moves with the load);
* **a worker has its own pace** (:func:`worker_scale`): each worker's median divides its
  units too, so a persistent straggler's cut units are completed at its pace. The law of the
  scaled units is pooled: one worker's few hundred units cannot fit a heavy tail's shape
  (a per-worker generalized Pareto read one digits-cnn worker's mean 40% high);
* **ranks share cores** (``cores``, ``delays.contention``): when the trace's ranks
  outnumbered the cores they ran on, a rank that runs on after the others finished has a
  core to itself, so its late units ran faster than the ones the law was seen on. The units
  are completed in work (seconds with a core each) and the steps timed again under processor
  sharing. Completed as durations, the two traces read sync's step 6-30% high.

The draws are inverse survival on stratified uniforms (each 1/n of the conditional law used
once, McKay, Beckman and Conover 1979) from a fixed seed, so reading a trace stays
deterministic and one trace's completion varies little with the seed. Where the rows cannot
tell the law, :func:`complete` refuses in one line.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import stats

from tailtrain.delays.contention import shared_durations, unshared_work
from tailtrain.errors import UsageError

MIN_OBSERVED = 5  #: uncensored rows a law (or a worker's own pace) needs
SEED = 0  #: the draws that complete censored rows
#: the tail's candidate families, for the excess over the threshold (location 0)
FAMILIES = {
    "genpareto": stats.genpareto,
    "expon": stats.expon,
    "lognorm": stats.lognorm,
    "weibull_min": stats.weibull_min,
}
TAIL_SHARE = 0.1  #: the seen units above the tail's threshold: the top tenth
MIN_TAIL = 10  #: seen excesses a two-parameter family needs (fewer: the exponential)
#: the AIC lead a family needs over the exponential (Burnham and Anderson, *Model Selection
#: and Multimodel Inference*, 2002, Sec. 2.6: past 10, the other has essentially no support)
SUPPORT = 10.0
DRIFT_REACH = 20  #: steps either side of a unit's own that set its local scale
#: the log-survival a family other than the exponential (memoryless, drawn in closed form)
#: must keep at the largest bound: its draws past that bound stay representable
LOG_FLOOR = -700.0


@dataclass(frozen=True)
class Tail:
    """The law beyond Kaplan-Meier's reach: the excess over ``threshold`` follows ``law``."""

    family: str
    law: Any  #: a frozen ``scipy.stats`` law of the excess
    threshold: float
    #: the largest gap between the family's conditional survival and Kaplan-Meier's where
    #: both see (the fit's quality), and the AIC lead over the runner-up family (negative:
    #: the exponential kept by parsimony against a lead under :data:`SUPPORT`)
    gap: float
    lead: float


@dataclass(frozen=True)
class UnitLaw:
    """A unit's law from censored rows: Kaplan-Meier up to ``edge``, :class:`Tail` beyond."""

    times: np.ndarray  #: Kaplan-Meier's distinct times up to the largest unit seen, ascending
    survival_after: np.ndarray  #: its survival just after each of them
    tail: Tail

    @property
    def edge(self) -> float:
        """The largest unit seen: Kaplan-Meier's reach (past it only bounds, no unit)."""
        return float(self.times[-1])

    @property
    def beyond_edge(self) -> float:
        """The mass Kaplan-Meier leaves past its reach (the censored top)."""
        return float(self.survival_after[-1])

    def _log_tail(self, t: np.ndarray) -> np.ndarray:
        """log P(unit > t | unit > edge) for t >= edge, from the tail's law: in logs, so a
        bound far past the edge (a hung unit) neither underflows nor divides by 0."""
        u = self.tail.threshold
        with np.errstate(divide="ignore"):
            return self.tail.law.logsf(t - u) - self.tail.law.logsf(self.edge - u)

    def _tail_at(self, log_q: np.ndarray) -> np.ndarray:
        """The t >= edge with log P(unit > t | unit > edge) = ``log_q`` (<= 0)."""
        u, law = self.tail.threshold, self.tail.law
        target = log_q + law.logsf(self.edge - u)
        if self.tail.family == "expon":  # memoryless: exact however far out
            return u - float(law.mean()) * target  # the scale (its location is 0)
        with np.errstate(divide="ignore", invalid="ignore"):
            return u + law.isf(np.exp(target))

    def sf(self, t: np.ndarray | float) -> np.ndarray:
        """S(t) = P(unit > t)."""
        t = np.asarray(t, dtype=float)
        i = np.searchsorted(self.times, t, side="right")
        body = np.where(i > 0, self.survival_after[np.maximum(i - 1, 0)], 1.0)
        tail = self.beyond_edge * np.exp(self._log_tail(np.maximum(t, self.edge)))
        return np.where(t < self.edge, body, tail)

    def isf(self, q: np.ndarray) -> np.ndarray:
        """The t with S(t) = q, q in (0, 1] (the body's smallest t with S(t) <= q)."""
        q = np.asarray(q, dtype=float)
        # survival_after falls: the first index where it is <= q
        i = np.searchsorted(-self.survival_after, -q, side="left")
        body = self.times[np.minimum(i, self.times.size - 1)]
        if not self.beyond_edge:
            return body
        with np.errstate(divide="ignore"):
            log_q = np.log(np.minimum(q / self.beyond_edge, 1.0))
        return np.where(q >= self.beyond_edge, body, self._tail_at(log_q))

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
        law = self.tail.law
        if self.tail.family == "expon":  # memoryless: its scale at any a
            excess = float(law.mean())
        else:  # E[(X - a)+] of the excess law over its survival at a: mean residual life at a
            excess = float(law.expect(lambda s: s - a, lb=a) / law.sf(a))
        return body + self.beyond_edge * excess

    def beyond(self, bound: np.ndarray, uniform: np.ndarray) -> np.ndarray:
        """Draws conditioned on exceeding ``bound`` (one per uniform in [0, 1)): in the body
        by inverting S, past the edge in the tail's own conditional law (in logs)."""
        bound = np.asarray(bound, dtype=float)
        uniform = np.asarray(uniform, dtype=float)
        inside = self.isf(self.sf(np.minimum(bound, self.edge)) * (1.0 - uniform))
        with np.errstate(divide="ignore"):
            log_q = self._log_tail(np.maximum(bound, self.edge)) + np.log1p(-uniform)
        past = self._tail_at(log_q)
        return np.maximum(np.where(bound < self.edge, inside, past), bound)


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
    # the largest bound: the tail must leave mass past it, where Kaplan-Meier leaves some
    reach = float(max(cut.max(initial=0.0), over.max(initial=0.0)))
    # a heuristic, not the MLE: a bound past every seen unit enters at the largest one, a
    # true but weaker statement. A threshold censors exactly the slow units, and such bounds
    # alone then set how the tail decays where no unit was seen (a 2-rank digits-cnn trace
    # cut at 30%: four of them gave a generalized Pareto of shape 0.77 and sync's step read
    # 31% high; their units had ended 1.5-2.5 ms past them). The draws are still
    # conditioned on each row's own bound
    if over.size:
        cut = np.minimum(cut, over.max())
    if over.size < MIN_TAIL:
        families = ("expon",)
    fits = {}
    for name in families:
        try:
            fits[name] = _fit(name, over, cut)
        except (ValueError, RuntimeError, FloatingPointError):  # a family that cannot fit
            continue
    # a unit's time has a finite mean, and some units outlast the largest bound: a family
    # fitted with an infinite mean, or with no mass past that bound, is no candidate
    fits = {
        k: v
        for k, v in fits.items()
        if np.isfinite(v[1])
        and np.isfinite(v[0].mean())
        and (k == "expon" or v[0].logsf(reach) > LOG_FLOOR)
    }
    if not fits:
        fits = {"expon": _fit("expon", over, cut)}
    ranked = sorted(fits, key=lambda k: fits[k][1])
    # parsimony: the exponential stands unless a family beats it by SUPPORT (a heavier tail
    # fitted on a few dozen excesses reads the mass past the edge far out)
    if "expon" in fits and fits["expon"][1] - fits[ranked[0]][1] <= SUPPORT:
        ranked.remove("expon")
        ranked.insert(0, "expon")
    law = fits[ranked[0]][0]
    lead = fits[ranked[1]][1] - fits[ranked[0]][1] if len(ranked) > 1 else float("inf")
    km = stats.ecdf(stats.CensoredData(uncensored=over, right=cut)).sf
    gap = float(np.max(np.abs(law.sf(over) - km.evaluate(over)))) if over.size else 0.0
    return Tail(ranked[0], law, u, gap, lead)


def estimate(seconds: np.ndarray, censored: np.ndarray) -> UnitLaw | None:
    """The unit law of ``seconds`` (lower bounds where ``censored``; module docstring), or
    None when fewer than :data:`MIN_OBSERVED` rows are seen (censored rows at 0 say
    nothing)."""
    seconds, censored = np.asarray(seconds, dtype=float), np.asarray(censored, dtype=bool)
    if np.count_nonzero(seconds[~censored] > 0) < MIN_OBSERVED:
        return None
    km = stats.ecdf(_censored_data(seconds, censored)).sf
    times, after = np.asarray(km.quantiles, float), np.asarray(km.probabilities, float)
    # scipy lists the bounds among its times: past the largest unit seen it is flat, and the
    # tail, not a step at the largest bound, carries the mass there
    keep = times <= seconds[~censored].max()
    tail = fit_tail(seconds, censored, tuple(FAMILIES))
    return UnitLaw(times[keep], after[keep], tail)


def complete(
    spec: str,
    worker: np.ndarray,
    seconds: np.ndarray,
    censored: np.ndarray,
    *,
    iteration: np.ndarray | None = None,
    micro_batch: np.ndarray | None = None,
    cores: int | None = None,
) -> tuple[np.ndarray, str | None]:
    """``seconds`` with each censored row replaced by a draw beyond its bound (module
    docstring), and a one-line note (None when nothing is censored). ``iteration`` (and
    ``micro_batch``, else the rows' order in the file) lay the rows out in steps, which the
    load's drift and the contention need; ``cores``: the cores the trace's ranks shared,
    when fewer than its workers."""
    if not censored.any():
        return seconds, None
    digest = hashlib.blake2b(digest_size=16)
    for part in (spec.encode(), worker, seconds, censored, iteration, micro_batch, cores):
        if part is None:
            part = b"-"
        elif isinstance(part, int):
            part = str(part).encode()
        data = np.ascontiguousarray(part).tobytes() if isinstance(part, np.ndarray) else part
        digest.update(len(data).to_bytes(8, "little") + data)  # sized: parts cannot run together
    key = digest.hexdigest()
    # advise reads one trace once per candidate it prices: the fits are done once per trace
    if key not in _COMPLETED:
        if len(_COMPLETED) >= 8:
            _COMPLETED.pop(next(iter(_COMPLETED)))
        steps = None if iteration is None else Steps.of(iteration, worker, micro_batch)
        if steps is not None and not steps.distinct:  # rows repeat a unit: no step layout
            steps = None
        _COMPLETED[key] = _complete(spec, worker, seconds, censored, steps, cores)
    out, note = _COMPLETED[key]
    return out.copy(), note


_COMPLETED: dict[str, tuple[np.ndarray, str]] = {}  #: the last few traces completed


@dataclass(frozen=True)
class Steps:
    """Where each row sits in a dense (steps, workers, units) layout: its step, its worker's
    column and its unit's place in the worker's order; the unset places are 0 s."""

    step: np.ndarray
    column: np.ndarray
    unit: np.ndarray
    shape: tuple[int, int, int]

    @classmethod
    def of(cls, iteration: np.ndarray, worker: np.ndarray, micro_batch: np.ndarray | None) -> Steps:
        step = np.unique(iteration, return_inverse=True)[1]
        column = np.unique(worker, return_inverse=True)[1]
        if micro_batch is not None:
            unit = np.unique(micro_batch, return_inverse=True)[1]
        else:  # one row per unit in the file's order: count the rows before it in its cell
            cell = step * (column.max() + 1) + column
            order = np.argsort(cell, kind="stable")
            first = np.searchsorted(cell[order], cell[order], side="left")
            unit = np.empty_like(cell)
            unit[order] = np.arange(cell.size) - first
        shape = (int(step.max()) + 1, int(column.max()) + 1, int(unit.max()) + 1)
        return cls(step, column, unit, shape)

    @property
    def distinct(self) -> bool:
        """Whether every row has a place of its own (no two rows name the same unit)."""
        places = np.ravel_multi_index((self.step, self.column, self.unit), self.shape)
        return np.unique(places).size == places.size

    def dense(self, values: np.ndarray, fill: Any = 0) -> np.ndarray:
        out = np.full(self.shape, fill, dtype=np.asarray(values).dtype)
        out[self.step, self.column, self.unit] = values
        return out

    def rows(self, dense: np.ndarray) -> np.ndarray:
        return dense[self.step, self.column, self.unit]


def local_scale(
    seconds: np.ndarray, censored: np.ndarray, step: np.ndarray, steps: int
) -> np.ndarray:
    """Each row's scale: the Kaplan-Meier median of the units within :data:`DRIFT_REACH`
    steps of its own, over the whole trace's (1 where the trace is too short to move).

    A job on a shared machine speeds up and slows down with its neighbours' load (seq-lstm's
    units went from 13 to 30 ms over 120 steps), and a threshold cuts mostly in the slow
    stretches: read against the law of the whole trace, the units it hid would be completed
    from the fast stretches too. Units are completed in the scaled time u / s(step), which
    the load no longer moves (an accelerated-failure-time model with a scale that drifts)."""
    whole = _km_median(seconds, censored)
    if steps < 2 * DRIFT_REACH + 1 or not whole > 0:
        return np.ones(seconds.size)
    order = np.argsort(step, kind="stable")
    first = np.searchsorted(step[order], np.arange(steps + 1))  # each step's rows in order
    medians = np.empty(steps)
    for i in range(steps):  # one Kaplan-Meier per step: 2.5 s for 5,000 steps of 32 units
        near = order[first[max(i - DRIFT_REACH, 0)] : first[min(i + DRIFT_REACH + 1, steps)]]
        medians[i] = _km_median(seconds[near], censored[near])
    # a window with too few units seen (or a median of 0 s) keeps the trace's scale
    return np.where(medians > 0, medians, whole)[step] / whole


def worker_scale(seconds: np.ndarray, censored: np.ndarray, worker: np.ndarray) -> np.ndarray:
    """Each row's worker's Kaplan-Meier median over all the rows' (1 for a worker with too
    few rows seen to tell)."""
    whole = _km_median(seconds, censored)
    scale = np.ones(seconds.size)
    if not whole > 0:
        return scale
    for w in np.unique(worker):
        mine = worker == w
        median = _km_median(seconds[mine], censored[mine])
        if median > 0:
            scale[mine] = median / whole
    return scale


def _km_median(seconds: np.ndarray, censored: np.ndarray) -> float:
    """Kaplan-Meier's median of the rows (the largest unit seen where it stays above 1/2),
    or NaN when fewer than :data:`MIN_OBSERVED` of them are seen."""
    if np.count_nonzero(seconds[~censored] > 0) < MIN_OBSERVED:
        return float("nan")
    km = stats.ecdf(_censored_data(seconds, censored)).sf
    times, after = np.asarray(km.quantiles, float), np.asarray(km.probabilities, float)
    return float(times[min(np.searchsorted(-after, -0.5, side="left"), times.size - 1)])


def _complete(
    spec: str,
    worker: np.ndarray,
    seconds: np.ndarray,
    censored: np.ndarray,
    steps: Steps | None,
    cores: int | None,
) -> tuple[np.ndarray, str]:
    if np.count_nonzero(seconds[~censored] > 0) < MIN_OBSERVED:
        raise UsageError(
            f"trace {spec!r}: {np.count_nonzero(~censored)} uncensored rows cannot tell the law "
            f"of {np.count_nonzero(censored)} censored ones; record with a higher threshold"
        )
    shared = steps is not None and cores is not None and cores < steps.shape[1]
    # under shared cores the units are completed in work (a core each), then timed again
    units = steps.rows(unshared_work(steps.dense(seconds), cores)) if shared else seconds
    if steps is not None:
        scale = local_scale(units, censored, steps.step, steps.shape[0])
    else:
        scale = np.ones(seconds.size)
    # a worker's own pace (a persistent straggler's): its units are completed at it
    scale *= worker_scale(units / scale, censored, worker)
    scaled = units / scale
    pooled = estimate(scaled, censored)
    if pooled is None:  # cannot happen: positive finite scales keep the rows seen above 0
        raise UsageError(f"trace {spec!r}: its scaled rows cannot tell the law")
    rng = np.random.default_rng(SEED)
    out = units.copy()
    rows = np.flatnonzero(censored)
    # stratified uniforms (Latin hypercube, McKay et al. 1979): each 1/n of the law once
    uniform = (rng.permutation(rows.size) + rng.random(rows.size)) / rows.size
    out[rows] = scale[rows] * pooled.beyond(scaled[rows], uniform)
    if shared:
        timed = steps.rows(shared_durations(steps.dense(out), cores))
        out = np.where(censored, timed, seconds)
    share = np.count_nonzero(censored) / censored.size
    tail = pooled.tail
    note = (
        f"trace {spec!r}: {share:.0%} of its rows are censored (cut by a threshold); their law "
        f"is Kaplan-Meier up to the largest unit seen, and past it the {tail.family} tail "
        f"chosen by censored likelihood ({_lead(tail)}, largest gap to Kaplan-Meier "
        f"{tail.gap:.3f}), each unit scaled by its worker's pace"
    )
    if steps is not None and steps.shape[0] >= 2 * DRIFT_REACH + 1:
        note += f" and the load's drift over {2 * DRIFT_REACH + 1}-step windows"
    if shared:
        note += (
            f"; its {steps.shape[1]} ranks shared {cores} cores, so the completed steps are "
            "timed again under processor sharing"
        )
    note += "; the survivors alone would read low"
    return out, note


def _lead(tail: Tail) -> str:
    """How the tail's family was chosen, for the note."""
    if tail.lead >= 0:
        return f"AIC lead {tail.lead:.1f}"
    return f"kept: another family led it by {-tail.lead:.1f} AIC, at most {SUPPORT:g}"
