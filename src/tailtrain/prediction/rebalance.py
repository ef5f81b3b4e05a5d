"""``predict``'s row for ``rebalance``: the iteration time under the optimal shares.

Worker n's micro-batch law has mean mu_n. The shares are the makespan-optimal integers for
those means (``strategies.rebalance.optimal_shares``, the rule's own function): T* is the
smallest T with sum_n max(1, floor(T / mu_n)) >= N M and m_n = floor(T* / mu_n), trimmed to
N M. T* itself is the closed form, exact when the times are constant. With random times a
step takes E[max_n S_n(m_n)] + E[T^c], S_n(m) the sum of m of worker n's micro-batch times;
that expectation is a Monte Carlo on ``predict``'s shared sample, which reads each worker's
draws as one stream of micro-batches and cuts it into successive steps of m_n (so a share
above M takes the next iteration's draws, as the simulator does).

The means come from the laws: i.i.d. workers all have the delay's mean, so the shares are
equal and the row is the allreduce sync's; under a worker pattern, mu_n is worker n's mean
in each independent run, the same run replayed over the delay's mean
(``_Context.worker_means``: per-run patterns such as ``heterogeneous`` draw their speeds
once per run); a trace replayed per worker gives each worker's mean over its own draws.
Nothing is dropped, so the effective speedup (samples per second over sync) is the speedup.
Everything is vectorised over workers: a few reshaped sums over the draws per run (one per
distinct share), no gather.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from tailtrain.strategies.rebalance import optimal_shares


def stepped_times(t: NDArray[np.float64], shares: NDArray[np.int64]) -> NDArray[np.float64]:
    """Compute times max_n S_n(m_n) of the successive steps in draws t[i, n, m].

    Worker n's draws, iteration after iteration, are one stream of micro-batches; step j
    takes its micro-batches j m_n .. (j + 1) m_n - 1. As many steps as the busiest worker's
    stream holds. Workers of one share are cut alike: their streams (one slice once the
    workers are sorted by share) reshape to (workers, steps, share) and sum, no gather. A run
    has few distinct shares (they sum to N M: at most sqrt(2 N M), about M times the speed
    spread in practice), so this is a few passes over the draws: at 10^6 workers the row
    takes ~1 s of CPU where a gather of partial sums took ~14 s."""
    iterations, workers, m = t.shape
    steps = iterations * m // int(shares.max())
    order = np.argsort(shares, kind="stable")
    # one copy: worker-major streams, rows sorted by share, so each share's rows are a slice
    streams = t.transpose(1, 0, 2)[order].reshape(workers, iterations * m)
    ranked = shares[order]
    starts = np.flatnonzero(np.diff(ranked, prepend=-1))
    out = np.zeros(steps)
    for lo, hi in zip(starts, [*starts[1:], workers], strict=True):
        share = int(ranked[lo])
        cut = streams[lo:hi, : steps * share]
        sums = cut if share == 1 else cut.reshape(hi - lo, steps, share).sum(axis=2)
        np.maximum(out, sums.max(axis=0), out=out)  # draws are non-negative: 0 is a floor
    return out


def rebalance_times(
    t: NDArray[np.float64], comm: NDArray[np.float64], means: NDArray[np.float64]
) -> tuple[float, float, float, NDArray[np.int64]]:
    """One run's (E[T], its standard error, T* + mean T^c, shares) under the optimal shares
    for the workers' mean micro-batch times ``means``; E[T] is NaN when the busiest worker's
    share exceeds the run's draws (no whole step to measure)."""
    iterations, workers, m = t.shape
    shares = optimal_shares(means, workers * m)
    closed = float((shares * means).max()) + float(comm.mean())
    if shares.max() > iterations * m:
        return np.nan, np.nan, closed, shares
    steps = stepped_times(t, shares) + comm[: iterations * m // int(shares.max())]
    stderr = float(steps.std(ddof=1) / np.sqrt(steps.size)) if steps.size > 1 else 0.0
    return float(steps.mean()), stderr, closed, shares
