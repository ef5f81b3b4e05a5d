"""Replica groups in the simulator and predict (issue 38 item 4): N ranks in groups of G are
N/G workers fed the grouped delays, bit for bit, and predict at G agrees with the simulated
mean iteration time (within the Z standard errors of the other predict-vs-simulate tests)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from tests.sim.test_comm_time import Z, batch_means

from tailtrain.core.scenario import Scenario
from tailtrain.delays import DelayProcess, parse_delay, parse_pattern
from tailtrain.delays.groups import GroupedDelays
from tailtrain.errors import UsageError
from tailtrain.prediction import DelayScenario, predict
from tailtrain.sim.run import simulate
from tailtrain.strategies.registry import parse_strategy

DELAY = "lognormal:mu=-1,sigma=0.6"


def runs(strategy: str, scenario: Scenario, seed: int = 5):
    """The grouped run, and the run of N/G workers fed the grouped delays of the same seed."""
    grouped = simulate(scenario, parse_strategy(strategy), seed)
    ranks = DelayProcess(
        parse_delay(scenario.delay),
        parse_pattern(scenario.pattern),
        seed,
        scenario.workers,
        parse_strategy(strategy).micro_batch_capacity(scenario.micro_batches),
    )
    source = GroupedDelays(ranks, scenario.group_size, scenario.group_cost)
    plain = replace(scenario, workers=scenario.groups, group_size=1, group_cost=0.0)
    fed = simulate(plain, parse_strategy(strategy), seed, delays=source)
    return grouped, fed


@pytest.mark.parametrize(
    ("strategy", "task", "pattern"),
    [
        ("sync", "none", "iid"),
        ("dropcompute:threshold=auto", "none", "persistent:h=5"),
        ("k-sync:k=3", "none", "subset:s=1,delay=0.5"),
        ("rebalance:deal=demand", "none", "iid"),
        ("k-batch-async:k=2", "none", "iid"),
        ("sync", "logreg", "iid"),
    ],
)
def test_groups_of_g_are_n_over_g_workers_fed_the_grouped_delays(strategy, task, pattern):
    scenario = Scenario(
        task=task,
        workers=8,
        delay=DELAY,
        pattern=pattern,
        micro_batches=3,
        iterations=40,
        eval_every=10,
        group_size=2,
        group_cost=0.02,
    )
    grouped, fed = runs(strategy, scenario)
    assert grouped.steps == fed.steps  # every row: times, k, losses, bit for bit
    assert grouped.evals == fed.evals
    summary = dict(grouped.summary)
    assert "8 ranks in 4 replica groups of 2" in summary.pop("groups")
    assert summary == fed.summary


def test_group_size_one_is_the_plain_run():
    scenario = Scenario(task="none", workers=6, delay=DELAY, micro_batches=2, iterations=30)
    grouped = simulate(replace(scenario, group_size=1), parse_strategy("sync"), 1)
    assert grouped.steps == simulate(scenario, parse_strategy("sync"), 1).steps
    assert "groups" not in grouped.summary


def test_groups_wait_for_their_slowest_rank():
    """A group's step is at least its slowest rank's: grouping never speeds sync up."""
    scenario = Scenario(task="none", workers=8, delay=DELAY, micro_batches=4, iterations=200)
    ranks = simulate(scenario, parse_strategy("sync"), 0).summary["virtual_time"]
    grouped = simulate(replace(scenario, group_size=4), parse_strategy("sync"), 0)
    assert grouped.summary["virtual_time"] >= ranks


@pytest.mark.parametrize(("workers", "group_size"), [(8, 3), (8, 0), (6, -2)])
def test_a_group_size_that_does_not_divide_is_refused(workers, group_size):
    with pytest.raises(UsageError):
        Scenario(task="none", workers=workers, iterations=5, group_size=group_size)
    with pytest.raises(UsageError):
        DelayScenario(workers, parse_delay(DELAY), group_size=group_size)


def test_k_counts_groups_in_predict():
    with pytest.raises(UsageError, match=r"1\.\.4 \(K of the replica groups\)"):
        DelayScenario(8, parse_delay(DELAY), ks=(5,), group_size=2)


def step_times(strategy: str, scenario: Scenario) -> np.ndarray:
    record = simulate(scenario, parse_strategy(strategy), 0)
    return np.diff(record.column("time"), prepend=0.0)


CASES = [
    # i.i.d. ranks: predict's law route (F^G), with a within-group cost
    ("exp:rate=2", None, 4, 2, 0.05, "sync"),
    ("exp:rate=2", None, 4, 2, 0.05, "dropcompute"),
    (DELAY, None, 3, 4, 0.0, "k-sync"),
    # a pattern: predict draws the ranks and groups them (Monte Carlo)
    (DELAY, "subset:s=1,delay=0.3", 2, 2, 0.01, "sync"),
    (DELAY, "subset:s=1,delay=0.3", 2, 2, 0.01, "dropcompute"),
]


@pytest.mark.parametrize(("delay", "pattern", "m", "g", "cost", "row"), CASES)
def test_predict_at_g_agrees_with_the_simulated_mean(delay, pattern, m, g, cost, row):
    n = 8
    asked = DelayScenario(
        n,
        parse_delay(delay),
        pattern=None if pattern is None else parse_pattern(pattern),
        micro_batches=m,
        group_size=g,
        group_cost=cost,
    )
    found = {(r.strategy, r.k): r for r in predict(asked).rows}
    groups = n // g
    r = found[(row, 2 if row == "k-sync" else groups)]
    strategy = {"sync": "sync", "k-sync": "k-sync:k=2"}.get(row)
    if row == "dropcompute":
        strategy = f"dropcompute:threshold={r.threshold!r}"
    scenario = Scenario(
        task="none",
        workers=n,
        delay=delay,
        pattern=pattern or "iid",
        micro_batches=m,
        iterations=3000,
        group_size=g,
        group_cost=cost,
    )
    simulated, sim_stderr = batch_means(step_times(strategy, scenario))
    gap = abs(simulated - r.iteration_time)
    assert gap <= Z * np.hypot(r.iteration_time_stderr, sim_stderr), (simulated, r)


def test_the_face_predicts_a_scenarios_groups():
    import tailtrain

    scenario = Scenario(task="none", workers=8, delay="exp:rate=1", iterations=5, group_size=4)
    found = tailtrain.predict(scenario, "sync")
    (row,) = found.rows
    # 2 groups, each the max of 4 Exp(1): E[max of 2 such] from F^8 = H_8
    assert row.k == 2 and row.iteration_time == pytest.approx(sum(1 / k for k in range(1, 9)))
