"""Figures: the time-weighted k_t average against a brute-force model, and what a figure shows."""

from __future__ import annotations

import itertools

import matplotlib.pyplot as plt
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tailtrain.core.records import RunRecord
from tailtrain.core.scenario import Scenario
from tailtrain.plots import plot_runs, runs_figure, time_weighted_mean, title, wrap_spec


def brute_force_mean(times, values, a, b, points=20_000):
    """Average of the step function on (a, b) sampled finely: k(t) = values[i] for
    times[i-1] < t <= times[i], undefined (NaN) after the last update or where NaN."""
    t = a + (np.arange(points) + 0.5) * (b - a) / points
    index = np.searchsorted(times, t, side="left")
    inside = index < len(times)
    v = np.full(points, np.nan)
    v[inside] = np.asarray(values, dtype=float)[index[inside]]
    return np.nanmean(v) if np.isfinite(v).any() else np.nan


def test_time_weighted_mean_of_a_hand_made_step_function():
    # k = 8 on (0, 1], k = 2 on (1, 4], k = 5 on (4, 5]
    times, ks = np.array([1.0, 4.0, 5.0]), np.array([8, 2, 5])
    means = time_weighted_mean(times, ks, np.array([0.0, 2.0, 4.5, 6.0]))
    # (8*1 + 2*1)/2 = 5; (2*2 + 5*0.5)/2.5 = 2.6; (5*0.5)/0.5 over the covered half = 5
    np.testing.assert_allclose(means, [5.0, 2.6, 5.0])
    assert np.isnan(time_weighted_mean(times, ks, np.array([5.0, 6.0])))[0]


def test_nan_values_are_left_out_of_the_mean():
    # a calibration round without a threshold (NaN) then tau = 2
    means = time_weighted_mean(np.array([3.0, 4.0]), np.array([np.nan, 2.0]), np.array([0, 4.0]))
    np.testing.assert_allclose(means, [2.0])


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.floats(0.01, 3.0), min_size=1, max_size=12),
    st.lists(st.integers(1, 16), min_size=12, max_size=12),
    st.integers(1, 9),
)
def test_time_weighted_mean_matches_fine_sampling(gaps, ks, bins):
    times = np.cumsum(gaps)
    ks = np.array(ks[: len(times)])
    edges = np.linspace(0.0, times[-1] * 1.2, bins + 1)
    got = time_weighted_mean(times, ks, edges)
    want = [brute_force_mean(times, ks, a, b) for a, b in itertools.pairwise(edges)]
    clear = np.abs(edges[:-1] - times[-1]) > 1e-6  # a bin starting at the last update: rounding
    np.testing.assert_allclose(got[clear], np.array(want)[clear], rtol=2e-3, atol=2e-3 * ks.max())


@pytest.mark.parametrize(
    ("text", "lines"),
    [
        ("sync", ["sync"]),
        ("dbw:window=5,beta=1.01", ["dbw:window=5,", "beta=1.01"]),
        ("adasync:base=k-sync,k0=2,interval=20", ["adasync:", "base=k-sync,", "k0=2,interval=20"]),
    ],
)
def test_wrap_spec_breaks_after_colons_and_commas(text, lines):
    assert wrap_spec(text, 16) == lines
    assert "".join(wrap_spec(text, 16)) == text


def test_title_names_pattern_partition_and_delay():
    scenario = Scenario(
        task="logreg", pattern="persistent:h=5", partition="noniid:classes=2", iterations=1
    )
    text = title(scenario)
    assert "persistent:h=5" in text and "noniid:classes=2" in text and scenario.delay in text


def record(seed: int, ks: list[int], threshold: float | None = None) -> RunRecord:
    rng = np.random.default_rng(seed)
    times = np.cumsum(rng.uniform(0.5, 1.5, len(ks)))
    steps = [
        {"step": i, "time": float(t), "k": k, "threshold": threshold}
        for i, (t, k) in enumerate(zip(times, ks, strict=True))
    ]
    evals = [{"step": 0, "time": 0.0, "train_loss": 2.0}] + [
        {"step": i + 1, "time": float(t), "train_loss": 2.0 / (i + 2)} for i, t in enumerate(times)
    ]
    return RunRecord(steps=steps, evals=evals)


def test_fifteen_strategies_get_distinct_lines_and_a_threshold_panel(tmp_path):
    runs = {f"k-sync:k={k}": [record(0, [k] * 6), record(1, [k] * 6)] for k in range(1, 15)}
    runs["dropcompute:threshold=0.9"] = [record(0, [8] * 6, 0.9), record(1, [8] * 6, 0.9)]
    fig = runs_figure(runs, Scenario(task="logreg", workers=16, iterations=6), [0, 1])
    loss, k, tau = fig.axes
    assert "loss" in loss.get_ylabel() and "k_t" in k.get_ylabel() and "τ" in tau.get_ylabel()
    assert "(s)" in tau.get_xlabel() and "virtual time" in tau.get_xlabel()
    looks = {(line.get_color(), line.get_linestyle()) for line in k.get_lines()}
    assert len(looks) == 15
    assert all(float(t).is_integer() for t in k.get_yticks())
    (legend,) = fig.legends
    assert len(legend.get_texts()) == 15
    caption = fig.get_supxlabel()
    assert "mean over seeds 0, 1" in caption and "shaded" in caption
    plt.close(fig)


def test_the_mean_line_and_band_span_the_seeds():
    runs = {"k-sync:k=2": [record(0, [2, 2, 2]), record(1, [2, 2, 2])]}
    runs["k-sync:k=2"][1].evals = [
        {**r, "train_loss": r["train_loss"] + 1} for r in runs["k-sync:k=2"][1].evals
    ]
    fig = runs_figure(runs, Scenario(task="logreg", workers=4, iterations=3), [0, 1])
    (line,) = fig.axes[0].get_lines()
    assert line.get_ydata()[0] == pytest.approx(2.5)  # mean of 2 and 3 at t = 0
    plt.close(fig)


def test_timing_only_runs_get_no_loss_panel_and_one_seed_no_band(tmp_path):
    runs = {"sync": [RunRecord(steps=record(0, [4] * 3).steps, evals=[])]}
    path = plot_runs(runs, Scenario(task="none", workers=4, iterations=3), [0], tmp_path / "f.png")
    assert path.stat().st_size > 0
    fig = runs_figure(runs, Scenario(task="none", workers=4, iterations=3), [0])
    (k,) = fig.axes
    assert not k.collections  # no band with one seed
    assert "Timing only" in fig.get_supxlabel() and "seed 0" in fig.get_supxlabel()
    plt.close(fig)
