"""`tailtrain.advice`: verdicts, the straggler cost and the recommendation, on generated traces."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from tailtrain.advice import advise
from tailtrain.advice.cost import sync_cost
from tailtrain.advice.stragglers import score_workers
from tailtrain.strategies.registry import parse_strategy


def test_the_always_slow_worker_is_the_only_persistent_one(slow_trace):
    path, times = slow_trace
    found = advise(path)
    assert found.persistent == [3]
    slowest = next(s for s in found.stragglers if s.worker == 3)
    assert slowest.score == min(s.score for s in found.stragglers)
    # the saving from excluding worker 3, from the definitions: E[max over the 15 others]
    saving = times.max(axis=1).mean() - np.delete(times, 3, axis=1).max(axis=1).mean()
    assert found.cost.iteration_time == pytest.approx(times.max(axis=1).mean())
    assert found.cost.mean_worker_time == pytest.approx(times.mean())
    assert "excluding worker(s) 3 saves" in found.reason
    assert f"{saving:.4g} s per step" in found.reason
    parse_strategy(found.recommendation)


def test_no_persistent_verdict_without_a_persistent_straggler(clean_trace):
    found = advise(clean_trace)
    assert found.persistent == [] and found.without_persistent is None
    assert "excluding" not in found.reason


def test_score_is_relative_to_the_best_worker_and_the_sign_test_is_binomial(helpers):
    _, noisy = helpers
    times = noisy("lognormal", (60, 8), seed=3)
    times[:, 5] *= 1.5
    scores = score_workers(times, np.arange(8))
    assert max(s.score for s in scores) == 1.0
    ratio = times / np.median(times, axis=1, keepdims=True)
    slowdown = np.median(ratio, axis=0)
    for s in scores:
        assert s.slowdown == pytest.approx(slowdown[s.worker])
        assert s.score == pytest.approx(slowdown.min() / slowdown[s.worker])
        slower = int((ratio[:, s.worker] > 1).sum())
        expected = stats.binomtest(slower, 60, 0.5, alternative="greater").pvalue
        assert s.p_value == pytest.approx(expected)


def test_intermittent_worker(helpers):
    """A worker 4x slower in a fifth of its iterations, fine otherwise: not persistent."""
    _, noisy = helpers
    times = noisy("lognormal", (200, 12), seed=4)
    times[::5, 7] *= 4
    verdicts = {s.worker: s.verdict for s in score_workers(times, np.arange(12))}
    assert verdicts[7] == "intermittent"
    assert [w for w, v in verdicts.items() if v != "healthy"] == [7]


def test_cost_with_more_workers_replays_worker_n_mod_w(helpers):
    _, noisy = helpers
    times = noisy("lognormal", (50, 4), seed=5)
    cost = sync_cost(times, np.arange(4), 10)  # replicas 3, 3, 2, 2
    weights = np.array([3, 3, 2, 2])
    assert cost.iteration_time == pytest.approx(times.max(axis=1).mean())
    assert cost.mean_worker_time == pytest.approx((times.mean(axis=0) * weights).sum() / 10)
    fewer = sync_cost(times, np.arange(4), 2)
    assert fewer.iteration_time == pytest.approx(times[:, :2].max(axis=1).mean())


def test_extrapolation_to_a_million_workers_and_short_traces(tmp_path, helpers):
    write_trace, noisy = helpers
    times = noisy("lognormal", (20, 8), seed=6)
    times[:, 2] *= 3
    found = advise(write_trace(tmp_path / "t.csv", times), workers=10**6)
    assert any("too short to trust" in note for note in found.notes)
    assert any("mod 8" in note for note in found.notes)
    sync = next(r for r in found.ranked if r.row.strategy == "sync")
    assert sync.row.iteration_time == pytest.approx(times.max(axis=1).mean())
    parse_strategy(found.recommendation)
