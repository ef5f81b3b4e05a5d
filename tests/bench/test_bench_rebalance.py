"""``bench/bench_rebalance.py`` end to end on a small task, with its setting
(``bench/rebalance_setting.py``), bounds (``bench/rebalance_bounds.py``) and goals
(``bench/rebalance_goals.py``): its figures, goals, the boundary cost its feasibility part
measures and a real run of the carried combination (a smoke test of the benchmark, not of its
speed)."""

from __future__ import annotations

import argparse
from dataclasses import replace

import numpy as np
import pytest

from bench import bench_rebalance as bench
from bench import rebalance_bounds as rb
from bench import rebalance_goals as rg
from bench import rebalance_setting as rs
from tailtrain.delays import parse_delay

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def test_the_virtual_clock_part_reports_figures_and_goals():
    base = replace(rs.BASE, task="logreg", time_budget=6.0, target_loss=5.0)
    args = argparse.Namespace(
        scenarios=["c", "d"], seeds=[0], jobs=1, learn_scenarios=["c"], learn_seeds=[0]
    )
    part = bench.simulate_part(args, base)
    combined = part["c"]["strategies"]["rebalance:then=dropcompute,defer=true"]
    dropcompute = part["c"]["strategies"][rs.DROPCOMPUTE]
    # DropCompute's threshold is in force after its 20 calibration steps: it drops, the
    # combination defers the same cut to the next step instead
    assert dropcompute["dropped_per_epoch"]["mean"] > 0
    assert combined["dropped_per_epoch"]["max"] == 0 < combined["deferred_per_epoch"]["mean"]
    assert part["c"]["runs"][0]["slow_classes"]  # the slow ranks' classes, from the partition
    assert part["c"]["optimal_share_time"]["stderr"] < part["c"]["optimal_share_time"]["time"]
    # a second report of the same seeds adds no run: merging keeps the figures
    again = bench.merged([{"simulate": part}, {"simulate": part}])
    assert again["c"]["strategies"] == part["c"]["strategies"]
    found = rg.goals(part)
    assert isinstance(found["c"]["met"], bool) and isinstance(found["d"]["met"], bool)
    assert found["c"]["rebalance:then=dropcompute,defer=true"]["drops_no_sample"] is True
    # each spec against its own predicted time: deal=demand's row, the shares' for the others
    own, static = part["c"]["optimal_demand_time"], part["c"]["optimal_share_time"]
    assert own["stderr"] < own["time"] < static["time"]
    for spec, optimal in (("rebalance:deal=demand", own), ("rebalance", static)):
        time = part["c"]["strategies"][spec]["mean_iteration_time"]["mean"]
        goal = found["c"][spec]
        assert goal["time_over_optimal"] == pytest.approx(time / optimal["time"])
        assert goal["time_over_optimal_share"] == pytest.approx(time / static["time"])
        assert goal["within_5pct_of_optimal_time"] == (abs(goal["time_over_optimal"] - 1) <= 0.05)


def test_the_boundary_cost_is_measured_idle_plus_wasted_and_checked_as_a_bound():
    base = replace(rs.BASE, time_budget=6.0)
    out = rb.boundary_cost("b", base, [0, 1])
    # every rank's step splits into counted busy seconds, idle (share done) and wasted (the
    # micro-batch in flight at the threshold, cut)
    assert out["idle_per_rank_per_step"] >= 0 and out["wasted_per_rank_per_step"] > 0
    assert out["idle_per_rank_per_step"] + out["wasted_per_rank_per_step"] == pytest.approx(
        out["idle_wasted_per_rank_per_step"]
    )
    assert 0 < out["weighted_fraction"] < 1 and len(out["own_rate_over_it"]) == 2
    assert out["ceiling_x_1_minus_f"] < out["ceiling_micro_batches_per_s"]
    # the verdict is the check on the runs' own rate, not a constant
    assert out["is_an_upper_bound"] == (max(out["own_rate_over_it"]) <= 1.0)


def test_the_synchronous_bounds_order_the_schemes(monkeypatch):
    """Sync <= static shares with a carried threshold (the optimal shares, then the local
    search's, never worse) <= dealt on demand <= the fluid ceiling, on the same draws."""
    monkeypatch.setattr(rb, "BOUND_DRAWS", 400)
    delay = parse_delay(rs.NOISE)
    factor = np.array([1.4] * 2 + [1.0] * 2)
    out = rb.synchronous_bounds(delay, factor, 6, 0)
    static = out["static_threshold_optimal_shares"]
    searched = out["static_threshold_best_shares"]
    assert sum(static["shares"]) == sum(searched["shares"]) == 24
    assert out["sync_long_run_micro_batches_per_s"] < static["micro_batches_per_s"]
    assert static["micro_batches_per_s"] <= searched["micro_batches_per_s"]
    ceiling = float((1.0 / (delay.mean * factor)).sum())
    assert out["dealt_on_demand"]["micro_batches_per_s"] < ceiling


@pytest.mark.slow
def test_the_real_part_runs_the_carried_combination_on_train():
    scenario = replace(rs.BASE, task="logreg", time_budget=None, iterations=2)
    out = bench.real_run("rebalance:then=dropcompute,defer=true", scenario, 0, timeout=120)
    assert out["status"] == "ran", out
    assert "deferred_rate" in out["summary"] and "dropped_micro_batches" in out["summary"]
