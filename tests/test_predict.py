"""`tailtrain.prediction`: exact rows where closed forms are exact, Monte Carlo elsewhere."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from tailtrain.delays import parse_delay, parse_pattern
from tailtrain.errors import UsageError
from tailtrain.prediction import K_FAMILY, DelayScenario, k_grid, predict
from tailtrain.theory.dropcompute import evaluate_threshold
from tailtrain.theory.kfamily import k_async_shifted_exp_bound

Z = 4.0


def harmonic(n: int) -> float:
    return float(sum(Fraction(1, i) for i in range(1, n + 1)))


def rows_of(prediction, strategy):
    return {r.k: r for r in prediction.rows if r.strategy == strategy}


def test_exponential_scenario_is_exact_everywhere():
    n, rate = 16, 2.0
    p = predict(DelayScenario(workers=n, delay=parse_delay(f"exp:rate={rate}")))
    sync = rows_of(p, "sync")[n]
    assert sync.iteration_time == pytest.approx(harmonic(n) / rate, rel=1e-13)
    for k in range(1, n + 1):
        order_stat = (harmonic(n) - harmonic(n - k)) / rate
        assert rows_of(p, "k-sync")[k].iteration_time == pytest.approx(order_stat, rel=1e-12)
        assert rows_of(p, "k-async")[k].iteration_time == pytest.approx(order_stat, rel=1e-12)
        assert rows_of(p, "k-batch-sync")[k].iteration_time == pytest.approx(k / (n * rate))
        assert rows_of(p, "k-batch-async")[k].iteration_time == k / rate / n
    assert rows_of(p, "async")[1].iteration_time == 1 / rate / n
    # rebalance:deal=demand: n superposed Poisson processes, the n-th arrival at rate n rate
    (demand,) = [r for r in p.rows if r.spec == "rebalance:deal=demand"]
    assert demand.iteration_time == pytest.approx(1 / rate, rel=1e-12)
    assert {r.method for r in p.rows} <= {"exact", "numerical-integration"}
    for r in p.rows:
        assert r.speedup_vs_sync == pytest.approx(sync.iteration_time / r.iteration_time)
        if r.strategy in K_FAMILY:
            assert r.effective_speedup == pytest.approx(r.k * r.speedup_vs_sync / n)


def test_best_k_follows_the_documented_criterion():
    # 1 + Exp(1) on 8 workers: K / E[X_{K:8}] peaks at K = 6 (slow-and-stale Fig. 7's regime)
    p = predict(DelayScenario(workers=8, delay=parse_delay("shifted-exp:shift=1,rate=1")))
    rate = {k: k / (1 + harmonic(8) - harmonic(8 - k)) for k in range(1, 9)}
    assert [r.k for r in p.rows if r.strategy == "k-sync" and r.best] == [max(rate, key=rate.get)]
    # K-batch-async applies gradients at P / E[X] for every K: the tie goes to the largest K
    assert [r.k for r in p.rows if r.strategy == "k-batch-async" and r.best] == [8]
    assert sum(r.best for r in p.rows if r.strategy == "dropcompute") == 1


def test_a_delay_law_with_mass_at_zero_is_refused_in_one_line_not_a_traceback():
    # half the jobs take no time: the first K of 16 finish at once, E[T_K] = 0 for small K
    with pytest.raises(UsageError, match="no mass at 0"):
        predict(DelayScenario(workers=16, delay=parse_delay("bernoulli:p=0.5,value=0.45")))


def test_best_k_leaves_out_a_k_without_a_finite_speedup():
    from tailtrain.prediction.estimates import best_k

    best, close = best_k([1, 2, 4], [np.inf, 1.5, 1.2], [np.nan, 0.01, 0.01])
    assert best == 2 and close.tolist() == [False, True, False]
    assert best_k([1, 2], [np.inf, np.inf], [np.nan, np.nan])[0] == 2


def test_comm_time_is_per_round_trip_for_every_parameter_server_family():
    """Every job takes X + c: K-sync waits for (X + c)_{K:N} = X_{K:N} + c, the renewal rate
    of K-batch-async and async is N / (1 + c), and K-batch-sync's first arrival is c + X_{1:N}."""
    n, comm = 8, 0.5
    p = predict(DelayScenario(workers=n, delay=parse_delay("exp:rate=1"), comm=comm))
    assert rows_of(p, "sync")[n].iteration_time == pytest.approx(harmonic(n) + comm)
    for k in (1, 3):
        order_stat = harmonic(n) - harmonic(n - k)
        assert rows_of(p, "k-sync")[k].iteration_time == pytest.approx(order_stat + comm)
    assert rows_of(p, "k-batch-async")[3].iteration_time == pytest.approx(3 * (1 + comm) / n)
    assert rows_of(p, "async")[1].iteration_time == pytest.approx((1 + comm) / n)
    assert rows_of(p, "k-async")[1].iteration_time == pytest.approx((1 + comm) / n)
    first = rows_of(p, "k-batch-sync")[1]
    assert first.method.startswith("monte-carlo")
    assert abs(first.iteration_time - (comm + 1 / n)) <= Z * first.iteration_time_stderr


def test_random_comm_time_is_convolved_with_each_job():
    """K-sync's K = N E[T] = E[max_n (X_n + C_n)] with X ~ Exp(1), C ~ Exp(2) (a server's round
    trips): an independent sample. sync is one allreduce a step, paying T^c once after the
    slowest compute: E[max_n X_n] + E[C] = H_N + 1/2."""
    n = 8
    p = predict(
        DelayScenario(
            workers=n, delay=parse_delay("exp:rate=1"), comm=parse_delay("exp:rate=2"), ks=(n,)
        )
    )
    rng = np.random.default_rng(7)
    trips = rng.exponential(1.0, (100_000, n)) + rng.exponential(0.5, (100_000, n))
    worst = trips.max(axis=1)
    k_sync = rows_of(p, "k-sync")[n]
    assert k_sync.method == "numerical-integration"
    assert abs(k_sync.iteration_time - worst.mean()) <= Z * worst.std() / np.sqrt(worst.size)
    assert rows_of(p, "sync")[n].iteration_time == pytest.approx(harmonic(n) + 0.5)


def test_monte_carlo_k_async_agrees_with_exact_limits():
    """1 + Exp(1) is not memoryless, so K-async is simulated: K = N is sync, Lemma 4 bounds."""
    n = 8
    p = predict(DelayScenario(workers=n, delay=parse_delay("shifted-exp:shift=1,rate=1")))
    k_async, sync = rows_of(p, "k-async"), rows_of(p, "sync")[n]
    assert k_async[n].method.startswith("monte-carlo")
    assert (
        abs(k_async[n].iteration_time - sync.iteration_time) <= Z * k_async[n].iteration_time_stderr
    )
    for k in (2, 4):
        bound = k_async_shifted_exp_bound(1.0, 1.0, k, n)
        assert k_async[k].iteration_time <= bound + Z * k_async[k].iteration_time_stderr
    k_batch_sync = rows_of(p, "k-batch-sync")[1]  # the first finisher, as K-sync with K = 1
    gap = abs(k_batch_sync.iteration_time - rows_of(p, "k-sync")[1].iteration_time)
    assert gap <= Z * k_batch_sync.iteration_time_stderr


def test_dropcompute_quadrature_agrees_with_simulation():
    n, m = 32, 6
    delay = parse_delay("normal:mean=1,std=0.2")  # P(X < 0) = 3e-7: not clipped
    row = rows_of(
        predict(DelayScenario(workers=n, delay=delay, micro_batches=m, comm=0.2)), "dropcompute"
    )[n]
    assert row.method == "numerical-integration" and 0 < row.drop_rate < 0.5
    t = np.maximum(delay.sample(np.random.default_rng(5), (20_000, n, m)), 0.0)
    found = evaluate_threshold(t, np.full(t.shape[0], 0.2), row.threshold)
    assert abs(found.effective_speedup - row.effective_speedup) <= Z * found.stderr
    dropped = 1 - (np.cumsum(t, axis=2) < row.threshold).mean(axis=(1, 2))
    stderr = dropped.std(ddof=1) / np.sqrt(dropped.size)
    assert abs(dropped.mean() - row.drop_rate) <= Z * stderr


def test_pattern_scenarios_are_simulated_and_seeded():
    n, s, extra = 8, 2, 1.0
    scenario = DelayScenario(
        workers=n,
        delay=parse_delay("exp:rate=1"),
        pattern=parse_pattern(f"subset:s={s},delay={extra}"),
        samples=1000,
        seed=3,
    )
    first, again = predict(scenario), predict(scenario)
    assert first.rows == again.rows
    other = predict(DelayScenario(**{**scenario.__dict__, "seed": 4}))
    assert rows_of(other, "sync")[n].iteration_time != rows_of(first, "sync")[n].iteration_time
    assert all(r.method.endswith("seed=3)") for r in first.rows)
    # every worker's mean job time is 1 + s/N extra: renewal rate N / (1 + s extra / N)
    row = rows_of(first, "k-batch-async")[4]
    expected = 4 * (1 + s * extra / n) / n
    assert abs(row.iteration_time - expected) <= Z * row.iteration_time_stderr


def test_micro_batches_of_exponential_use_the_gamma_law():
    p = predict(DelayScenario(workers=16, delay=parse_delay("exp:rate=4"), micro_batches=4))
    assert rows_of(p, "sync")[16].method == "numerical-integration"
    assert rows_of(p, "k-batch-async")[16].iteration_time == pytest.approx(1.0)


def test_grids_and_json_rows():
    assert k_grid(16) == list(range(1, 17))
    grid = k_grid(200)
    assert grid[0] == 1 and grid[-2:] == [199, 200] and len(grid) < 20
    assert k_grid(200, compact=True) == [1, 50, 100, 150, 199, 200]
    p = predict(DelayScenario(workers=4, delay=parse_delay("uniform:low=1,high=2"), ks=(2, 4)))
    out = p.to_json([2, 4])
    assert {"scenario", "results", "criterion", "best"} <= set(out)
    assert {r["k"] for r in out["results"] if r["strategy"] == "k-sync"} == {2, 4}
    assert "threshold" in next(r for r in out["results"] if r["strategy"] == "dropcompute")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"workers": 0}, "workers"),
        ({"micro_batches": 0}, "micro-batches"),
        ({"ks": (5,)}, "--k 5"),
        ({"delay": parse_delay("pareto:shape=1,scale=1")}, "infinite mean"),
        ({"comm": -1.0}, "comm-time"),
    ],
)
def test_bad_scenarios(kwargs, message):
    base = {"workers": 4, "delay": parse_delay("exp:rate=1")}
    with pytest.raises(UsageError, match=message):
        predict(DelayScenario(**{**base, **kwargs}))


def test_heterogeneous_workers_k_async_with_k_1_is_async():
    """Per-run worker speeds are a random effect: estimates average independent runs, and
    1-async must agree with async (slow-and-stale, Theorem 2's proof) within their errors."""
    scenario = DelayScenario(
        workers=16,
        delay=parse_delay("exp:rate=1"),
        pattern=parse_pattern("heterogeneous:low=1,high=3"),
        ks=(1, 16),
        samples=1000,
    )
    p = predict(scenario)
    one, plain = rows_of(p, "k-async")[1], rows_of(p, "async")[1]
    assert one.method.startswith("monte-carlo") and plain.method.startswith("monte-carlo")
    gap = abs(one.iteration_time - plain.iteration_time)
    assert gap <= Z * np.hypot(one.iteration_time_stderr, plain.iteration_time_stderr)


def test_large_n_best_k_sync_is_the_argmax_over_every_k():
    """Above LARGE_N K-sync is searched on a grid and refined; for 1 + Exp(2) the effective
    speedup K / E[X_{K:N}] of every K is a closed form, and its argmax is the best row."""
    n = 100_000
    p = predict(DelayScenario(workers=n, delay=parse_delay("shifted-exp:shift=1,rate=2")))
    k = np.arange(1, n + 1)
    cumulative = np.concatenate([[0.0], np.cumsum(1.0 / np.arange(1, n + 1))])
    rate = k / (1 + (cumulative[n] - cumulative[n - k]) / 2)
    best = int(k[rate >= rate.max() * (1 - 1e-9)].max())  # the criterion's 1e-9 slack
    assert [r.k for r in p.rows if r.strategy == "k-sync" and r.best] == [best]


def test_large_n_rows_name_their_method_and_match_closed_forms():
    n = 100_000
    p = predict(DelayScenario(workers=n, delay=parse_delay("uniform:low=0.5,high=1.5")))
    for k, row in rows_of(p, "k-sync").items():
        assert row.iteration_time == pytest.approx(0.5 + k / (n + 1), rel=1e-8)
    k_async = rows_of(p, "k-async")
    assert (
        k_async[1].method == "exact"
        and k_async[n].iteration_time == rows_of(p, "sync")[n].iteration_time
    )
    assert k_async[n // 2].method.startswith("mean-field(") and k_async[n - 1].method.startswith(
        "monte-carlo("
    )
    # far from K = N, K-async lies in the renewal-reward bracket [K E[X] / N, K E[X] / (N - K)]
    assert n // 2 / n <= k_async[n // 2].iteration_time <= n // 2 / (n - n // 2)
    batch_sync = rows_of(p, "k-batch-sync")
    assert batch_sync[2].method.startswith("k-sync's numerical-integration")
    assert batch_sync[2].iteration_time == rows_of(p, "k-sync")[2].iteration_time
    assert batch_sync[n].method.startswith("mean-field(")
    assert sum(r.best for r in p.rows if r.strategy == "k-async") == 1
