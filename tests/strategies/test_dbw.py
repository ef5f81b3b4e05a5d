"""DBW and B-DBW: gain estimator (Eqs. 10-16), choice rule (Eqs. 18-19), round-trip samples."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tailtrain.errors import UsageError
from tailtrain.strategies.base import Context, StepStats, SyncMode
from tailtrain.strategies.dbw import (
    Dbw,
    GainEstimates,
    OpenVersion,
    argmax_gain_rate,
    gain,
    grad_norm_plus,
    lipschitz_plus,
    loss_guard,
    round_trip_samples,
    variance_plus,
)
from tailtrain.strategies.registry import parse_strategy
from tailtrain.strategies.testing import ArrivalRow, arrivals


def step_stats(
    version: int,
    k: int,
    rows: list[ArrivalRow],
    loss: float = math.nan,
    grad_sq_sum: float = math.nan,
    mean_grad_sq: float = math.nan,
) -> StepStats:
    """Stats of the update that made ``version``, closing at the k-th fresh arrival."""
    fresh = sorted(a.finish for a in rows if a.version == version - 1)
    cols = arrivals(rows)
    return StepStats(
        step=version - 1,
        version=version,
        time=fresh[k - 1],
        k=k,
        arrivals=cols,
        used=cols.keys[:k],
        loss=loss,
        grad_sq_sum=grad_sq_sum,
        mean_grad_sq=mean_grad_sq,
    )


def arrivals_at(version: int, start: float, durations: list[float]) -> list[ArrivalRow]:
    return [ArrivalRow(w, version, start, start + d) for w, d in enumerate(durations)]


# --- Eqs. (10)-(16) ------------------------------------------------------------------------


def test_single_iteration_estimates_match_hand_computation():
    # three gradients with sum ||g_j||^2 = 14 and ||mean||^2 = 2
    assert variance_plus(14.0, 2.0, 3) == pytest.approx((14 - 3 * 2) / 2)  # Eq. (10): 4
    assert math.isnan(variance_plus(5.0, 5.0, 1))
    assert grad_norm_plus(2.0, 4.0, 3) == pytest.approx(2 - 4 / 3)  # Eq. (11)
    assert grad_norm_plus(1.0, 9.0, 3) == 0.0  # clipped at 0
    # Eq. (12): 2 (eta |grad|^2 - G) / (eta^2 (|grad|^2 + V/k)) with G = 0.05 observed
    expected = 2 * (0.1 * (2 / 3) - 0.05) / (0.1**2 * (2 / 3 + 4 / 3))
    assert lipschitz_plus(0.1, 2 / 3, 4.0, 3, 0.05) == pytest.approx(expected)
    assert math.isnan(lipschitz_plus(0.1, 0.0, 0.0, 3, 0.05))
    # Eq. (16)
    k = np.array([1.0, 2.0, 4.0])
    expected_gain = (0.1 - 5 * 0.01 / 2) * 0.8 - (5 * 0.01 / 2) * 3.0 / k
    np.testing.assert_allclose(gain(k, np.full(3, 0.1), 5.0, 0.8, 3.0), expected_gain)


def test_windowed_estimates_match_hand_computation():
    est = GainEstimates(window=2)
    est = est.observe(loss=2.0, grad_sq_sum=14.0, mean_grad_sq=2.0, k=3, eta=0.1)
    assert not est.ready  # Eq. (12) needs a previous iteration
    est = est.observe(loss=1.95, grad_sq_sum=5.0, mean_grad_sq=2.0, k=2, eta=0.1)
    # iteration 1: V+ = (5 - 2*2)/1 = 1, |grad|+ = 2 - 1/2 = 1.5,
    # L+ from iteration 0 (V+ = 4, |grad|+ = 2/3, k = 3, eta = 0.1, G+ = 2.0 - 1.95)
    lip1 = 2 * (0.1 * 2 / 3 - 0.05) / (0.01 * (2 / 3 + 4 / 3))
    assert est.ready
    assert est.variances == pytest.approx((4.0, 1.0))
    assert est.grad_norms == pytest.approx((2 / 3, 1.5))
    assert est.lipschitz == pytest.approx((lip1,))
    # iteration 2 with k = 1: Eq. (10) undefined, the windowed V = (4 + 1)/2 stands in
    est = est.observe(loss=1.9, grad_sq_sum=3.0, mean_grad_sq=3.0, k=1, eta=0.05)
    lip2 = 2 * (0.1 * 1.5 - 0.05) / (0.01 * (1.5 + 1.0 / 2))
    assert est.variances == pytest.approx((4.0, 1.0))
    assert est.grad_norms == pytest.approx((1.5, 3.0 - 2.5))  # window D = 2 dropped 2/3
    assert est.lipschitz == pytest.approx((lip1, lip2))
    # Eqs. (13)-(16): averages over the window
    v, g, lip = 2.5, (1.5 + 0.5) / 2, (lip1 + lip2) / 2
    k = np.arange(1, 4)
    expected = (0.1 - lip * 0.01 / 2) * g - (lip * 0.01 / 2) * v / k
    np.testing.assert_allclose(est.gains(k, np.full(3, 0.1)), expected)
    # iteration 3 (k = 1 again): Eq. (12) uses iteration 2's eta, |grad|+ and stand-in V
    est = est.observe(loss=1.8, grad_sq_sum=1.0, mean_grad_sq=1.0, k=1, eta=0.05)
    lip3 = 2 * (0.05 * 0.5 - 0.1) / (0.05**2 * (0.5 + 2.5 / 1))
    assert est.lipschitz == pytest.approx((lip2, lip3))


def test_nan_statistics_break_the_chain_of_lipschitz_estimates():
    est = GainEstimates(window=5).observe(2.0, 14.0, 2.0, 3, 0.1)
    est = est.observe(math.nan, math.nan, math.nan, 3, 0.1)
    est = est.observe(1.9, 14.0, 2.0, 3, 0.1)
    assert est.lipschitz == ()  # no L+ across the gap


def test_pooled_lipschitz_is_eq12_summed_over_every_iteration():
    # noisy losses around a steady decrease: Eq. (15)'s mean of the last D = 2 L+ follows
    # the noise, the pooled ratio of sums divides the telescoped decrease by all the terms
    losses = [2.0, 1.90, 1.95, 1.70, 1.80, 1.55]
    windowed, pooled = GainEstimates(window=2), GainEstimates(window=2, pooled=True)
    for loss in losses:
        windowed = windowed.observe(loss, 14.0, 2.0, 3, 0.1)
        pooled = pooled.observe(loss, 14.0, 2.0, 3, 0.1)
    # every iteration: V+ = 4, |grad|+ = 2/3, k = 3, eta = 0.1
    den = 0.01 * (2 / 3 + 4 / 3)
    decreases = -np.diff(losses)
    lips = 2 * (0.1 * 2 / 3 - decreases) / den
    assert windowed.lipschitz == pooled.lipschitz == pytest.approx(tuple(lips[-2:]))
    assert windowed.lipschitz_estimate == pytest.approx(lips[-2:].mean())
    telescoped = losses[0] - losses[-1]
    expected = 2 * (5 * 0.1 * 2 / 3 - telescoped) / (5 * den)
    assert pooled.lipschitz_estimate == pytest.approx(expected)
    k = np.arange(1, 4)
    np.testing.assert_allclose(
        pooled.gains(k, np.full(3, 0.1)), gain(k, np.full(3, 0.1), expected, 2 / 3, 4.0)
    )
    # a NaN step adds no term, and the estimate is NaN until the first term
    assert math.isnan(GainEstimates(window=2, pooled=True).lipschitz_estimate)
    gap = pooled.observe(math.nan, math.nan, math.nan, 3, 0.1)
    assert gap.lipschitz_estimate == pytest.approx(expected)


def test_lipschitz_option_reaches_the_estimator_and_the_spec():
    strategy = parse_strategy("dbw:mode=psw,lipschitz=pooled")
    assert strategy.pooled_lipschitz and "lipschitz=pooled" in strategy.describe()
    assert strategy.init(Context(n_workers=3)).gains.pooled
    assert parse_strategy(strategy.describe()) == strategy
    assert parse_strategy("dbw:lipschitz=window") == parse_strategy("dbw")
    assert "lipschitz" not in parse_strategy("dbw").describe()


# --- Eqs. (18)-(19) -------------------------------------------------------------------------


def test_best_k_maximises_gain_per_time():
    gains = np.array([-1.0, 2.0, 3.0, 3.5])
    times = np.array([1.0, 1.5, 2.0, 4.0])  # rates: -1, 1.33, 1.5, 0.875
    assert argmax_gain_rate(gains, times) == 3


def test_best_k_never_picks_a_negative_gain_when_a_positive_one_exists():
    assert argmax_gain_rate(np.array([-0.1, 0.01, -0.5]), np.array([0.01, 100.0, 1.0])) == 2


def test_all_negative_gains_give_k_equal_n():
    assert argmax_gain_rate(np.array([-3.0, -2.0, -1.0, -0.5]), np.array([1.0, 2.0, 3.0, 4.0])) == 4


def test_loss_rise_above_beta_forces_k_above_previous():
    assert loss_guard(k=2, k_prev=5, n=8, loss=1.02, prev_loss=1.0, beta=1.01) == 6
    assert loss_guard(k=7, k_prev=5, n=8, loss=1.02, prev_loss=1.0, beta=1.01) == 7
    assert loss_guard(k=2, k_prev=5, n=8, loss=1.005, prev_loss=1.0, beta=1.01) == 2
    assert loss_guard(k=2, k_prev=8, n=8, loss=2.0, prev_loss=1.0, beta=1.01) == 2
    assert loss_guard(k=2, k_prev=5, n=8, loss=2.0, prev_loss=math.nan, beta=1.01) == 2


# --- round-trip samples t_{h,i,t} (DBW §3.2) ------------------------------------------------


def test_round_trip_samples_count_late_arrivals_of_older_versions():
    n = 3
    versions = (OpenVersion(0, math.nan, n),)
    step0 = arrivals([ArrivalRow(0, 0, 0.0, 1.0), ArrivalRow(1, 0, 0.0, 2.0)])
    versions, h, i, t = round_trip_samples(versions, step0, n)
    assert (h.tolist(), i.tolist(), t.tolist()) == ([3, 3], [1, 2], [1.0, 2.0])
    versions = (*versions, OpenVersion(1, 2.0, 2))  # the update at t = 2 waited for k_0 = 2
    # worker 2 delivers w_0 late; workers 0 and 1 deliver w_1; a partial arrival is ignored
    step1 = arrivals(
        [
            ArrivalRow(2, 0, 0.0, 2.5),
            ArrivalRow(1, 1, 2.0, 3.5),
            ArrivalRow(0, 1, 2.0, 3.0),
            ArrivalRow(2, 1, 2.5, 3.6, units=0.5, partial=True),
        ]
    )
    versions, h, i, t = round_trip_samples(versions, step1, n)
    got = sorted(zip(h.tolist(), i.tolist(), t.tolist(), strict=True))
    assert got == [(2, 1, 1.0), (2, 2, 1.5), (3, 3, 2.5)]
    assert [(v.version, v.received) for v in versions] == [(0, 3), (1, 2)]


def test_adapt_records_samples_in_cells_h_i():
    strategy = Dbw("b-dbw", blind=True)
    state = strategy.init(Context(n_workers=3))
    state = strategy.adapt(state, step_stats(1, 2, arrivals_at(0, 0.0, [1.0, 2.0, 4.0])))
    # h = n for w_0; all three arrivals of w_0 count, the third (late) one for i = 3
    np.testing.assert_array_equal(state.times.counts[2], [1, 1, 1])
    np.testing.assert_array_equal(state.times.sums[2], [1.0, 2.0, 4.0])
    assert state.times.counts[:2].sum() == 0


# --- strategies -----------------------------------------------------------------------------


def test_b_dbw_picks_argmax_k_over_time():
    strategy = parse_strategy("b-dbw")
    state = strategy.init(Context(n_workers=4))
    assert strategy.plan(state).k == 4
    # E[T_{4,k}] = 1, 1.5, 1.6, 4 and, by the least consistent fill, T_hat_k the same
    state = strategy.adapt(state, step_stats(1, 4, arrivals_at(0, 0.0, [1.0, 1.5, 1.6, 4.0])))
    np.testing.assert_array_equal(state.times.iteration_times(), [1.0, 1.5, 1.6, 4.0])
    assert strategy.plan(state).k == 3  # k / T = 1, 1.33, 1.875, 1


def test_eq19_forces_k_up_when_the_loss_rose_through_adapt():
    strategy = parse_strategy("b-dbw:beta=1.01")
    state = strategy.init(Context(n_workers=4))
    durations = [1.0, 1.5, 2.5, 4.0]  # k / T = 1, 1.33, 1.2, 1: argmax k = 2
    state = strategy.adapt(state, step_stats(1, 4, arrivals_at(0, 0.0, durations), loss=1.0))
    assert state.k == 2
    for loss, expected in ((1.005, 2), (1.5, 3)):  # below, then above beta times the last
        start = 4.0
        nxt = strategy.adapt(state, step_stats(2, 2, arrivals_at(1, start, durations), loss))
        assert nxt.k == expected


def test_dbw_starts_at_n_then_follows_eq18():
    n, lr = 4, 0.1
    strategy = parse_strategy("dbw:window=5,beta=1.01")
    state = strategy.init(Context(n_workers=n, lr=lr))
    durations = [1.0, 1.5, 2.5, 4.0]
    stats = step_stats(1, n, arrivals_at(0, 0.0, durations), 2.0, 20.0, 2.0)
    state = strategy.adapt(state, stats)
    assert strategy.plan(state).k == n  # no Lipschitz estimate yet
    stats = step_stats(2, n, arrivals_at(1, 4.0, durations), 1.95, 16.0, 1.5)
    state = strategy.adapt(state, stats)
    # by hand: V+ = (20 - 8)/3 = 4 and (16 - 6)/3 = 10/3; |grad|+ = 2 - 1 = 1 and 1.5 - 5/6
    v = (4 + 10 / 3) / 2
    g = (1 + (1.5 - 10 / 12)) / 2
    lip = 2 * (lr * 1 - (2.0 - 1.95)) / (lr**2 * (1 + 4 / 4))
    k = np.arange(1, n + 1)
    gains = (lr - lip * lr**2 / 2) * g - lip * lr**2 / 2 * v / k
    expected = int(np.argmax(gains / np.array(durations))) + 1
    assert expected == 3  # gains -0.029, 0.017, 0.032, 0.040 per time 1, 1.5, 2.5, 4
    assert strategy.plan(state).k == expected


def test_dbw_without_loss_statistics_stays_synchronous():
    strategy = parse_strategy("dbw")
    state = strategy.init(Context(n_workers=3))
    for version in range(1, 5):
        start = 3.0 * (version - 1)
        state = strategy.adapt(
            state, step_stats(version, 3, arrivals_at(version - 1, start, [1, 2, 3]))
        )
        assert strategy.plan(state).k == 3


def test_adapt_is_deterministic_and_does_not_mutate_its_input():
    strategy = parse_strategy("dbw:window=2")
    state = strategy.init(Context(n_workers=3))
    before = state.times.sums.copy()
    stats = step_stats(1, 3, arrivals_at(0, 0.0, [1.0, 2.0, 3.0]), 2.0, 10.0, 2.0)
    a, b = strategy.adapt(state, stats), strategy.adapt(state, stats)
    np.testing.assert_array_equal(state.times.sums, before)
    np.testing.assert_array_equal(a.times.expected(), b.times.expected())
    assert (a.k, a.gains) == (b.k, b.gains)


def test_plan_is_sync_family_in_psi_by_default():
    plan = parse_strategy("dbw").plan(parse_strategy("dbw").init(Context(n_workers=5)))
    assert (plan.k, plan.mode, plan.accept_stale, plan.lr_scale) == (5, SyncMode.PSI, False, 1.0)
    strategy = parse_strategy("dbw:mode=psi,lr=proportional")
    state = strategy.init(Context(n_workers=4))
    state = strategy.adapt(state, step_stats(1, 4, arrivals_at(0, 0.0, [1, 2, 3, 4]), 1.0, 5, 1))
    plan = strategy.plan(state)
    assert plan.mode is SyncMode.PSI and plan.lr_scale == pytest.approx(plan.k / 4)


@pytest.mark.parametrize(
    ("text", "name", "window", "beta"),
    [
        ("dbw:window=5,beta=1.01", "dbw", 5, 1.01),
        ("dbw", "dbw", 5, 1.01),
        ("b-dbw:beta=1.2", "b-dbw", 5, 1.2),
        ("b-dbw:time-window=5", "b-dbw", 5, 1.01),
        ("dbw:mode=psw,time-window=3", "dbw", 5, 1.01),
    ],
)
def test_specs_parse(text, name, window, beta):
    strategy = parse_strategy(text)
    assert isinstance(strategy, Dbw)
    assert (strategy.name, strategy.window, strategy.beta) == (name, window, beta)
    assert parse_strategy(strategy.describe()) == strategy


@pytest.mark.parametrize(
    "text",
    [
        "dbw:window=0",
        "dbw:window=two",
        "dbw:beta=0.9",
        "dbw:gamma=1",
        "dbw:mode=fast",
        "dbw:lr=linear",
        "b-dbw:window=5",
        "dbw:time-window=-1",
        "dbw:lipschitz=median",
        "b-dbw:lipschitz=pooled",
    ],
)
def test_bad_specs_raise_usage_errors(text):
    with pytest.raises(UsageError):
        parse_strategy(text)


def test_time_window_reaches_the_estimator_and_the_spec():
    strategy = parse_strategy("b-dbw:time-window=4")
    assert strategy.time_window == 4 and "time-window=4" in strategy.describe()
    assert strategy.init(Context(n_workers=3)).times.window == 4
    assert parse_strategy("dbw").init(Context(n_workers=3)).times.window == 0
    assert "time-window" not in parse_strategy("dbw").describe()
