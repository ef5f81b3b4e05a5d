"""Censored trace rows (a threshold cut the slow micro-batches): the law and sync E[T] are
recovered from a trace generated from a known law and a known threshold, where reading the
survivors alone misses them."""

from __future__ import annotations

import numpy as np
import pytest

from tailtrain.advice import advise
from tailtrain.delays.parse import parse_delay
from tailtrain.delays.trace import write_trace_rows
from tailtrain.errors import UsageError

MU, SIGMA, TAU = -3.0, 0.5, 0.2  # seconds per micro-batch ~ LogNormal(MU, SIGMA); tau in s
ITERATIONS, N, M = 300, 4, 4


def cut_by_threshold(seed=0):
    """Rows [iteration, worker, micro_batch, censored, seconds] of a DropCompute-like run:
    micro-batches run in turn until tau; the one running then is seen up to tau, the rest
    not at all (0 s)."""
    x = np.random.default_rng(seed).lognormal(MU, SIGMA, (ITERATIONS, N, M))
    start = np.cumsum(x, axis=2) - x
    cut = start + x > TAU
    seen = np.where(cut, np.clip(TAU - start, 0, None), x)
    i, w, m = np.meshgrid(np.arange(ITERATIONS), np.arange(N), np.arange(M), indexing="ij")
    return np.column_stack([a.ravel() for a in (i, w, m, cut, seen)])


def truth(samples=400_000, seed=1):
    x = np.random.default_rng(seed).lognormal(MU, SIGMA, (samples, N, M))
    return np.exp(MU + SIGMA**2 / 2), float(x.sum(axis=2).max(axis=1).mean())


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    folder = tmp_path_factory.mktemp("censored")
    rows = cut_by_threshold()
    write_trace_rows(folder / "censored.csv", rows, per_micro_batch=True, censored=True)
    survivors = rows[rows[:, 3] == 0][:, [0, 1, 2, 4]]
    write_trace_rows(folder / "survivors.csv", survivors, per_micro_batch=True)
    assert 0.2 < rows[:, 3].mean() < 0.5  # a real share of the work was cut
    return folder / "censored.csv", folder / "survivors.csv"


@pytest.mark.timeout(300)
def test_the_law_and_sync_time_are_recovered_where_survivors_miss(traces):
    mean, sync = truth()
    censored, survivors = (parse_delay(f"trace:path={p}") for p in traces)
    assert censored.mean == pytest.approx(mean, rel=0.05)
    assert abs(survivors.mean / mean - 1) > 0.05
    assert "censored" in censored.censoring
    found = {p.stem: advise(p, samples=2000) for p in traces}
    sync_row = {
        k: next(r.row for r in a.ranked if r.row.strategy == "sync") for k, a in found.items()
    }
    assert sync_row["censored"].iteration_time == pytest.approx(sync, rel=0.05)
    assert abs(sync_row["survivors"].iteration_time / sync - 1) > 0.05
    assert found["censored"].cost.iteration_time == sync_row["censored"].iteration_time
    assert any("censored" in note for note in found["censored"].notes)


def test_a_trace_that_cannot_tell_the_law_says_so_in_one_line(tmp_path):
    rows = np.array([[0, 0, 0, 1, 0.1], [1, 0, 0, 1, 0.2], [2, 0, 0, 0, 0.05]])
    write_trace_rows(tmp_path / "t.csv", rows, per_micro_batch=True, censored=True)
    with pytest.raises(UsageError, match="cannot tell the law"):
        parse_delay(f"trace:path={tmp_path / 't.csv'}")
