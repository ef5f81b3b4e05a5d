"""Censored trace rows (a threshold cut the slow micro-batches): the law and sync E[T] are
recovered from a trace generated from a known law and a known threshold, where reading the
survivors alone misses them."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tailtrain.advice import advise
from tailtrain.advice.cost import sync_cost
from tailtrain.advice.stragglers import iteration_times
from tailtrain.delays.censored import estimate
from tailtrain.delays.parse import parse_delay
from tailtrain.delays.trace import read_trace, write_trace_rows
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


def threshold_cut(x, share):
    """DropCompute's cut of unit times ``x`` (I, N, M), its tau set by bisection so that
    ``share`` of the rows are censored: (seen seconds, censored)."""

    def cut(tau):
        start = np.cumsum(x, axis=2) - x
        censored = start + x > tau
        return np.where(censored, np.clip(tau - start, 0, None), x), censored

    low, high = 0.0, float(x.sum(axis=2).max())
    for _ in range(60):
        tau = (low + high) / 2
        low, high = (tau, high) if cut(tau)[1].mean() > share else (low, tau)
    return cut(high)


def two_point(size, rng):
    """A two-point mixture (80% fast, 20% three times slower), each point smeared by 10%: the
    slow point is below tau, so a step's first micro-batch shows it."""
    return np.where(rng.random(size) < 0.8, 0.01, 0.03) * (1 + 0.1 * rng.random(size))


LAWS = {
    "exponential": lambda size, rng: rng.exponential(0.01, size),
    "log-normal": lambda size, rng: rng.lognormal(np.log(0.01), 0.5, size),
    "pareto": lambda size, rng: 0.01 * (1 + rng.pareto(3.5, size)),
    "two-point": two_point,
}


@pytest.mark.parametrize("name", LAWS)
def test_the_estimator_recovers_a_known_law_s_mean_and_99th_percentile_at_30_percent_cut(name):
    """Kaplan-Meier below the largest unit seen, a family chosen by censored likelihood past
    it: the mean and the 99th percentile within 3% of the law's, whatever its family (the
    log-normal fitted to every unit read the exponential's mean 5% high and its p99 12%)."""
    law = LAWS[name]
    truth = law(2_000_000, np.random.default_rng(1))
    seen, censored = threshold_cut(law((4000, 4, 4), np.random.default_rng(0)), 0.3)
    assert censored.mean() == pytest.approx(0.3, abs=0.01)
    found = estimate(seen.ravel(), censored.ravel())
    assert found.mean() == pytest.approx(truth.mean(), rel=0.03)
    assert found.quantile(0.99) == pytest.approx(np.quantile(truth, 0.99), rel=0.03)


@given(st.floats(0.0, 0.2), st.floats(0.0, 0.999))
@settings(max_examples=50, deadline=None)
def test_a_completed_row_exceeds_its_bound_and_inverts_the_survival(bound, uniform):
    """Each censored row's draw lies beyond its bound, and ``isf`` inverts ``sf`` where the
    survival moves (the body's steps and the tail)."""
    seen, censored = threshold_cut(LAWS["exponential"]((300, 4, 4), np.random.default_rng(2)), 0.3)
    found = _law(seen, censored)
    draw = found.beyond(np.array([bound]), np.array([uniform]))[0]
    assert draw >= bound
    q = float(found.sf(draw))
    assert found.sf(found.isf(np.array(q))) == pytest.approx(q, abs=1e-9)


@functools.cache
def _cached(key):
    seen, censored = key
    return estimate(np.array(seen), np.array(censored))


def _law(seen, censored):
    return _cached((tuple(seen.ravel()), tuple(censored.ravel())))


@pytest.mark.parametrize("share", [0.1, 0.3, 0.45])
def test_sync_time_of_a_censored_trace_is_the_uncensored_trace_s(tmp_path, share):
    """A sync trace of DropCompute-style noise (a shifted exponential, DropCompute Sec. 4.1),
    censored offline as a threshold would cut it: advise's sync E[T] (its ``sync_cost`` of the
    replayed trace, the figure its table's sync row and its cost show) within 3% of what it
    reads from the same trace uncensored (the log-normal fit read it 8-20% high)."""
    rng = np.random.default_rng(3)
    x = 0.004 + rng.exponential(0.003, (ITERATIONS, N, M))
    seen, censored = threshold_cut(x, share)
    i, w, m = np.meshgrid(np.arange(ITERATIONS), np.arange(N), np.arange(M), indexing="ij")
    index = [a.ravel() for a in (i, w, m)]
    write_trace_rows(tmp_path / "full.csv", np.column_stack([*index, x.ravel()]), True)
    rows = np.column_stack([*index, censored.ravel(), seen.ravel()])
    write_trace_rows(tmp_path / "cut.csv", rows, per_micro_batch=True, censored=True)
    sync = {}
    for name in ("full", "cut"):
        replay = parse_delay(f"trace:path={tmp_path / name}.csv").replay
        sync[name] = sync_cost(iteration_times(replay)[0], replay.ids, N).iteration_time
    assert sync["cut"] == pytest.approx(sync["full"], rel=0.03)


DATA = Path(__file__).parent / "data"


#: where the estimator misses on these traces (issue 36, open): 4 ranks on 2 shared cores
#: compute a step's first micro-batches slower than its last (digits-cnn 8.4 ms at position 1,
#: 5.9 ms at 3; the ranks start each step together and contend), and a cut hides the late,
#: fast ones, which the estimator then completes from the law of all positions: read high
MISSED = pytest.mark.xfail(
    strict=True, reason="a step's late micro-batches are faster under shared cores (issue 36)"
)


@pytest.mark.parametrize(
    ("task", "share"),
    [
        ("digits_cnn", 0.1),
        pytest.param("digits_cnn", 0.3, marks=MISSED),  # +6.8%
        pytest.param("digits_cnn", 0.45, marks=MISSED),  # +5.9%
        pytest.param("seq_lstm", 0.1, marks=MISSED),  # +9.5%
        pytest.param("seq_lstm", 0.3, marks=MISSED),  # +9.3%
        pytest.param("seq_lstm", 0.45, marks=MISSED),  # +79%
    ],
)
def test_a_train_trace_censored_offline_keeps_advise_s_sync_time(tmp_path, task, share):
    """The issue's own check on traces ``tailtrain train`` recorded (tests/delays/data): a
    sync trace censored offline as DropCompute's threshold would cut it (the crossing
    micro-batch keeps tau - its start, later ones 0 s, all marked; ``noncompute`` as it was)
    gives advise's sync E[T] within 3% of the same trace uncensored."""
    whole = read_trace(DATA / f"train_sync_{task}.csv")
    shape = (int(whole.iteration.max()) + 1, int(whole.worker.max()) + 1, -1)
    order = np.lexsort((whole.micro_batch, whole.worker, whole.iteration))
    x = whole.seconds[order].reshape(shape)
    seen, censored = threshold_cut(x, share)
    assert abs(censored.mean() - share) < 0.03  # tau found for this share
    columns = [a[order] for a in (whole.iteration, whole.worker, whole.micro_batch)]
    noncompute = whole.noncompute[order]
    write_trace_rows(
        tmp_path / "cut.csv",
        np.column_stack([*columns, censored.ravel(), seen.ravel(), noncompute]),
        per_micro_batch=True, censored=True, noncompute=True,
    )  # fmt: skip
    sync = {}
    for name, path in (("full", DATA / f"train_sync_{task}.csv"), ("cut", tmp_path / "cut.csv")):
        replay = parse_delay(f"trace:path={path}").replay
        sync[name] = sync_cost(iteration_times(replay)[0], replay.ids, N).iteration_time
    assert sync["cut"] == pytest.approx(sync["full"], rel=0.03)
