"""``bench/bench_rebalance.py`` end to end on a small task: its figures, goals and the real
part's honest refusal (a smoke test of the benchmark, not of its speed)."""

from __future__ import annotations

import argparse
from dataclasses import replace

import pytest

from bench import bench_rebalance as bench

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def test_the_virtual_clock_part_reports_figures_and_goals():
    base = replace(bench.BASE, task="logreg", time_budget=6.0, target_loss=5.0)
    args = argparse.Namespace(
        scenarios=["c", "d"], seeds=[0], jobs=1, learn_scenarios=["c"], learn_seeds=[0]
    )
    part = bench.simulate_part(args, base)
    combined = part["c"]["strategies"]["rebalance:then=dropcompute,defer=true"]
    dropcompute = part["c"]["strategies"][bench.DROPCOMPUTE]
    # DropCompute's threshold is in force after its 20 calibration steps: it drops, the
    # combination defers the same cut to the next step instead
    assert dropcompute["dropped_per_epoch"]["mean"] > 0
    assert combined["dropped_per_epoch"]["max"] == 0 < combined["deferred_per_epoch"]["mean"]
    assert part["c"]["runs"][0]["slow_classes"]  # the slow ranks' classes, from the partition
    assert part["c"]["optimal_share_time"]["stderr"] < part["c"]["optimal_share_time"]["time"]
    # a second report of the same seeds adds no run: merging keeps the figures
    again = bench.merged([{"simulate": part}, {"simulate": part}])
    assert again["c"]["strategies"] == part["c"]["strategies"]
    found = bench.goals(part)
    assert isinstance(found["c"]["met"], bool) and isinstance(found["d"]["met"], bool)
    assert found["c"]["rebalance:then=dropcompute,defer=true"]["drops_no_sample"] is True


def test_the_real_part_reports_what_train_refuses_without_running_it():
    scenario = replace(bench.BASE, task="logreg", time_budget=None, iterations=2)
    out = bench.real_run("rebalance:then=dropcompute,defer=true", scenario, 0, timeout=120)
    if out["status"] == "ran":  # train deals shares and carries the cut: nothing to refuse
        return
    assert out["status"] == "not supported by train yet"
    assert "needs" in out["refusal"] and "\n" not in out["refusal"]
