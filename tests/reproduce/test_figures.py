"""The reproductions' figures are readable: a legend under the panels covers none of them,
and Fig. 11's ratio panel shows a gap of a few percent the curves hide (issue 36)."""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import numpy as np
import pytest

from tailtrain.reproduce import figures
from tailtrain.reproduce.stale import _ratio_panel

LONG = [
    "dbw:mode=psw",
    "dbw:mode=psw,time-window=5,beta=1.2",
    "dbw:mode=psw,time-window=5,beta=1.2,lipschitz=pooled",
    "b-dbw:mode=psw",
    "b-dbw:mode=psw,time-window=5,beta=1.2",
]


@pytest.fixture
def kept(monkeypatch):
    """The figures ``figure`` drew, kept open past its ``plt.close``."""
    drawn: list[plt.Figure] = []
    close = plt.close
    monkeypatch.setattr(figures.plt, "close", drawn.append)
    yield drawn
    for fig in drawn:
        close(fig)


def extent(artist, fig) -> np.ndarray:
    box = artist.get_window_extent(fig.canvas.get_renderer())
    return np.array([box.x0, box.y0, box.x1, box.y1])


def overlap(a: np.ndarray, b: np.ndarray) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


@pytest.mark.parametrize(("legend", "covers"), [("below", False), ("each", True)])
def test_a_legend_below_the_panels_covers_none_of_them(tmp_path, kept, legend, covers):
    """Five long specs over step curves that fill their panel (Fig. 9's k_t): a legend in
    each panel covers a panel (the plot the issue found), one below the panels none."""
    with figures.figure(tmp_path / "f.png", 2, title="t", legend=legend) as (top, bottom):
        t = np.linspace(0, 500, 200)
        for i, name in enumerate(LONG):
            top.plot(t, np.exp(-t / 300) + i / 10, label=name)
            bottom.step(t, 8 + 8 * (np.sin(t / 7 + i) > 0), label=name)
    fig = kept[0]
    legends = [*fig.legends, *(ax.get_legend() for ax in fig.axes if ax.get_legend())]
    axes = [extent(ax, fig) for ax in fig.axes if ax.get_visible()]
    hit = any(overlap(extent(lg, fig), a) for lg in legends for a in axes)
    assert hit is covers
    assert (tmp_path / "f.png").stat().st_size > 0


def test_fig11_s_ratio_panel_shows_each_fixed_k_over_adasync_and_says_what_never_arrived():
    names = ["adasync", "k=2", "k=4"]
    times = {"adasync": [10.0, math.inf], "k=2": [10.15, 30.0], "k=4": [12.0, 40.0]}
    fig, ax = plt.subplots()
    try:
        _ratio_panel(ax, times, names, (0.6, 0.25), seeds=3)
        points = {line.get_label(): line.get_ydata() for line in ax.get_lines()}
        np.testing.assert_allclose(points["k=2"][0], 1.015)  # a 1.5% gap, on an axis around 1
        np.testing.assert_allclose(points["k=4"][0], 1.2)
        assert all(math.isnan(points[n][1]) for n in ("k=2", "k=4"))  # not drawn
        said = [a.get_text() for a in ax.texts]
        assert said == ["not reached by every seed:\nadasync"]
        low, high = ax.get_ylim()
        assert low > 0.5 and high < 1.5  # zoomed on the gap, not from 0
    finally:
        plt.close(fig)
