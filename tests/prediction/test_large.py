"""predict above LARGE_N under a heterogeneous pattern (issue 25: ``predict --workers
1000000`` with a heterogeneous pattern answers in seconds): the rows come from the speeds'
law, not from N workers' draws; they must agree with a Monte Carlo of the pattern where one
is cheap, and with the bounds that hold at any N. No timing is asserted."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tailtrain.delays import DelayProcess, parse_delay, parse_pattern
from tailtrain.prediction import DelayScenario, predict
from tailtrain.prediction.context import LARGE_N

Z = 4.0
SPEEDS = "heterogeneous:low=1,high=1.5"


def by_strategy(prediction):
    out: dict[str, dict[int, object]] = {}
    for row in prediction.rows:
        out.setdefault(row.spec or row.strategy, {})[row.k] = row  # deal=demand apart
    return out


def test_a_million_heterogeneous_workers_get_every_row_from_the_speeds_law():
    n = 10**6
    p = predict(DelayScenario(n, parse_delay("exp:rate=1"), pattern=parse_pattern(SPEEDS)))
    rows = by_strategy(p)
    assert all(math.isfinite(r.iteration_time) and r.iteration_time > 0 for r in p.rows)
    sync = rows["sync"][n]
    # max_n s_n X_n lies between low max_n X_n and high max_n X_n: E[max Exp(1)] = H_N
    harmonic = float(np.sum(1.0 / np.arange(1, n + 1)))
    assert 1.0 * harmonic < sync.iteration_time < 1.5 * harmonic
    assert sync.method == "numerical-integration"
    assert (
        rows["k-sync"][n].iteration_time == rows["k-async"][n].iteration_time == sync.iteration_time
    )
    # with M = 1 every share is one micro-batch: rebalance is sync, here by quadrature per run
    rebalance = rows["rebalance"][n]
    assert rebalance.method.startswith("numerical-integration(16 runs of speeds")
    gap = abs(rebalance.iteration_time - sync.iteration_time)
    assert gap <= Z * rebalance.iteration_time_stderr + 1e-5 * sync.iteration_time
    # deal=demand: N M completions of Exp(1 / s) renewals, as N -> infinity t* E[1/s] = M
    demand = rows["rebalance:deal=demand"][n]
    assert demand.method.startswith("mean-field(n=")
    assert abs(demand.iteration_time - 0.5 / math.log(1.5)) <= Z * demand.iteration_time_stderr
    # async: workers restart at rate 1 / s_n, so updates come every 1 / (N E[1/s])
    each = 1.0 / (n * math.log(1.5) / 0.5)
    assert rows["async"][1].iteration_time == pytest.approx(each, rel=1e-12)
    for k, row in rows["k-batch-async"].items():
        assert row.iteration_time == pytest.approx(k * each, rel=1e-12)
    for k, row in rows["k-async"].items():  # no faster than the renewal-reward rate allows
        assert row.iteration_time >= k * each * (1 - 1e-6)
    fluid = rows["k-async"][n // 2]
    assert fluid.method.startswith("mean-field(speeds=")
    assert n - 1 not in rows["k-async"] and any("K=999999" in note for note in p.notes)
    assert rows["k-batch-sync"][n].method.startswith("mean-field(")
    drop = rows["dropcompute"][n]
    assert drop.iteration_time <= sync.iteration_time and 0 <= drop.drop_rate < 1
    assert any("scaled by U(1.0, 1.5)" in note for note in p.notes)


def test_just_above_large_n_sync_is_the_patterns_monte_carlo():
    """At N = LARGE_N + 1 the mixture's E[max] against a Monte Carlo of the pattern itself
    (fresh runs, one iteration each: a run draws its speeds once); K-async at K = N - 1."""
    n, runs, rng = LARGE_N + 1, 1500, np.random.default_rng(25)
    base, pattern = parse_delay("exp:rate=1"), parse_pattern(SPEEDS)
    draws = [DelayProcess(base, pattern, c, n).next_block(1).max() for c in rng.spawn(runs)]
    p = predict(DelayScenario(n, base, pattern=pattern, ks=(n - 1, n)))
    rows = by_strategy(p)
    sync = rows["sync"][n]
    assert sync.method == "numerical-integration"
    assert abs(sync.iteration_time - np.mean(draws)) <= Z * np.std(draws, ddof=1) / math.sqrt(runs)
    # K-async just below N has no large-N method with kept speeds: left out, with a note
    assert set(rows["k-async"]) == {n} and any(f"k-async K={n - 1}" in x for x in p.notes)


def test_one_speed_for_all_is_the_scaled_delay_itself():
    """heterogeneous:low=high=1.25 scales every time by 1.25: the rows are those of i.i.d.
    Exp(0.8) workers (exact forms there, the speeds' law here)."""
    n = 4096
    one = predict(
        DelayScenario(
            n,
            parse_delay("exp:rate=1"),
            pattern=parse_pattern("heterogeneous:low=1.25,high=1.25"),
            micro_batches=2,
            ks=(n // 2, n),
        )
    )
    iid = predict(DelayScenario(n, parse_delay("exp:rate=0.8"), micro_batches=2, ks=(n // 2, n)))
    a, b = by_strategy(one), by_strategy(iid)
    for strategy, k in [("sync", n), ("k-sync", n // 2), ("async", 1), ("dropcompute", n)]:
        assert a[strategy][k].iteration_time == pytest.approx(
            b[strategy][k].iteration_time, rel=1e-6
        )
    gap = abs(a["rebalance"][n].iteration_time - b["sync"][n].iteration_time)
    assert gap <= 1e-4 * b["sync"][n].iteration_time  # equal speeds: equal shares, sync
