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
Everything is vectorised over workers: one gather of N x steps values per run.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from tailtrain.strategies.rebalance import optimal_shares


def stepped_times(t: NDArray[np.float64], shares: NDArray[np.int64]) -> NDArray[np.float64]:
    """Compute times max_n S_n(m_n) of the successive steps in draws t[i, n, m].

    Worker n's draws, iteration after iteration, are one stream of micro-batches; step j
    takes its micro-batches j m_n .. (j + 1) m_n - 1. As many steps as the busiest worker's
    stream holds. The stream's partial sums stay in t's own layout (no transposed copy):
    the sum up to unit (i, m) is the iterations before i plus the units up to m of i."""
    iterations, workers, m = t.shape
    within = np.cumsum(t, axis=2)
    before = np.cumsum(within[:, :, -1], axis=0) - within[:, :, -1]
    within += before[:, :, None]
    flat = within.reshape(-1)
    steps = iterations * m // int(shares.max())
    ends = np.arange(1, steps + 1)[:, None] * shares[None, :]  # units done by step j's end

    def reached(count: NDArray[np.int64]) -> NDArray[np.float64]:
        """Partial sum of each worker's first ``count`` units (0 for none)."""
        unit = np.maximum(count - 1, 0)
        index = (unit // m * workers + np.arange(workers)) * m + unit % m
        return np.where(count > 0, np.take(flat, index), 0.0)

    return (reached(ends) - reached(ends - shares[None, :])).max(axis=1)


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
