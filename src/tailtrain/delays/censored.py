"""Censored trace rows: what a run that stopped work at a threshold did not see.

A DropCompute round stops a worker when its threshold tau cuts in (DropCompute Alg. 1): the
micro-batch then running is seen only up to that moment, and the later ones not at all. A
trace marks such rows ``censored=1``; their ``seconds`` is a lower bound (the time already
spent when the threshold cut in, 0 for a micro-batch never started). Reading only the
survivors as the law biases every figure low: the slow micro-batches are exactly the ones cut.

:func:`complete` estimates each worker's law from its rows by maximum likelihood with right
censoring (a log-normal, ``scipy.stats.lognorm.fit`` on ``scipy.stats.CensoredData``, with
location 0): the observed rows enter by their density, the censored by their survival
function. Kaplan-Meier is the non-parametric alternative, but a threshold censors the whole
upper tail, past the largest survivor, which Kaplan-Meier cannot see; a parametric law can.
Each censored row is then replaced by a draw from the fitted law conditioned on exceeding its
bound (inverse CDF on U(F(c), 1), from a fixed seed, so reading a trace stays deterministic),
and the replay, the sampler and the moments all use the completed rows. A worker with fewer
than :data:`MIN_OBSERVED` uncensored rows borrows the pooled fit; where the pooled rows cannot
tell the law either, :func:`complete` refuses in one line.
"""

from __future__ import annotations

import numpy as np
from scipy import stats

from tailtrain.errors import UsageError

MIN_OBSERVED = 5  #: uncensored rows a worker needs for its own fit
SEED = 0  #: the draws that complete censored rows


def fit_lognormal(seconds: np.ndarray, censored: np.ndarray) -> stats.rv_continuous | None:
    """The censored-MLE log-normal of ``seconds`` (lower bounds where ``censored``), or None
    when fewer than :data:`MIN_OBSERVED` rows are observed (censored rows at 0 say nothing)."""
    observed = seconds[~censored]
    if np.count_nonzero(observed > 0) < MIN_OBSERVED:
        return None
    bounds = seconds[censored & (seconds > 0)]
    data = stats.CensoredData(uncensored=observed[observed > 0], right=bounds)
    shape, _, scale = stats.lognorm.fit(data, floc=0)
    return stats.lognorm(shape, 0, scale)


def complete(
    spec: str, worker: np.ndarray, seconds: np.ndarray, censored: np.ndarray
) -> tuple[np.ndarray, str | None]:
    """``seconds`` with each censored row replaced by a draw of its worker's fitted law beyond
    its bound, and a one-line note (None when nothing is censored)."""
    if not censored.any():
        return seconds, None
    pooled = fit_lognormal(seconds, censored)
    if pooled is None:
        raise UsageError(
            f"trace {spec!r}: {np.count_nonzero(~censored)} uncensored rows cannot tell the law "
            f"of {np.count_nonzero(censored)} censored ones; record with a higher threshold"
        )
    rng = np.random.default_rng(SEED)
    out = seconds.copy()
    borrowed = []
    for w in np.unique(worker[censored]):
        mine = worker == w
        law = fit_lognormal(seconds[mine], censored[mine])
        if law is None:
            law, _ = pooled, borrowed.append(int(w))
        rows = np.flatnonzero(mine & censored)
        low = law.cdf(seconds[rows])
        out[rows] = law.ppf(low + (1 - low) * rng.random(rows.size))
    share = np.count_nonzero(censored) / censored.size
    note = (
        f"trace {spec!r}: {share:.0%} of its rows are censored (cut by a threshold); their law "
        "is a log-normal fitted per worker with censoring, the survivors alone would read low"
    )
    if borrowed:
        note += f" (workers {borrowed} too few survivors: the pooled fit)"
    return out, note
