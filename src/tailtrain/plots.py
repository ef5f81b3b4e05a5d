"""Figures of simulated runs: train loss against virtual time, and below it what each strategy
decided over time (k_t, or NAP for eager-SGD, and DropCompute's threshold τ when present).

Several seeds of a strategy are drawn as their mean with a shaded min-max band, so the figure
reads the same for one seed or ten. k_t and τ are step functions of virtual time that can
change at every update; they are drawn as their time-weighted mean over short bins, which keeps
thousands of updates legible and is exact when an update lasts longer than a bin.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib
import numpy as np

matplotlib.use("Agg")  # files only: no display on servers and CI
import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.ticker import MaxNLocator

from tailtrain.core.records import RunRecord
from tailtrain.core.scenario import Scenario
from tailtrain.sim.compare import Comparison

#: bins of the time axis over which k_t and τ are averaged
BINS = 100
#: ten distinguishable colours; each further ten strategies reuse them with another line style
COLOURS = plt.get_cmap("tab10").colors
STYLES = ("-", "--", "-.", ":")
#: characters per legend line
LEGEND_WIDTH = 24

Runs = Mapping[str, Sequence[RunRecord]]


def plot_comparison(comparison: Comparison, path: Path) -> Path:
    """``compare``'s figure: every strategy, mean and range over the seeds."""
    return plot_runs(comparison.runs, comparison.scenario, comparison.seeds, path)


def plot_runs(runs: Runs, scenario: Scenario, seeds: Sequence[int], path: Path) -> Path:
    """Write the figure of ``runs`` (strategy name -> one record per seed) to ``path``."""
    fig = runs_figure(runs, scenario, seeds)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def runs_figure(runs: Runs, scenario: Scenario, seeds: Sequence[int]) -> plt.Figure:
    """Panels sharing the virtual-time axis: train loss (unless timing only), k_t, and τ when
    some strategy has a threshold."""
    learns = any(_losses(r)[0].size for records in runs.values() for r in records)
    thresholds = any(np.isfinite(_threshold(r)).any() for rs in runs.values() for r in rs)
    fig, ax = _panels(["loss"] * learns + ["k"] + ["tau"] * thresholds)
    end = scenario.time_budget or max(
        (r.steps[-1]["time"] for rs in runs.values() for r in rs if r.steps), default=1.0
    )
    edges = np.linspace(0.0, end, BINS + 1)
    for i, (name, records) in enumerate(runs.items()):
        style = {"color": COLOURS[i % len(COLOURS)], "linestyle": STYLES[i // len(COLOURS) % 4]}
        if learns:
            _draw_loss(ax["loss"], records, style, name)
        _draw_binned(ax["k"], records, edges, "k", style, name)
        if thresholds:
            _draw_binned(ax["tau"], records, edges, "threshold", style, name)
    if learns:
        _decorate_loss(ax["loss"], scenario.target_loss)
    _label_decisions(ax)
    bottom, top = fig.axes[-1], fig.axes[0]
    bottom.set_xlabel("virtual time (s)")
    bottom.set_xlim(0.0, end)
    top.set_title(title(scenario), fontsize="medium")  # over the panels, not the legend
    _legend(fig, top)
    fig.supxlabel(caption(seeds, end / BINS, learns), fontsize="small", x=0.01, ha="left")
    fig.get_layout_engine().set(h_pad=0.08)
    return fig


def _panels(panels: list[str]) -> tuple[plt.Figure, dict[str, Axes]]:
    heights = {"loss": 3.0, "k": 2.0, "tau": 1.5}
    fig, axes = plt.subplots(
        len(panels),
        1,
        figsize=(11, 1.6 + sum(heights[p] for p in panels)),
        sharex=True,
        height_ratios=[heights[p] for p in panels],
        layout="constrained",
        squeeze=False,
    )
    return fig, dict(zip(panels, axes[:, 0], strict=True))


def _label_decisions(ax: dict[str, Axes]) -> None:
    """k_t on integer ticks; k_t and τ from zero, so sizes compare at a glance and a constant
    line shows no rounding jitter."""
    ax["k"].set_ylabel("k_t: gradients per\nupdate (NAP for eager)")
    ax["k"].yaxis.set_major_locator(MaxNLocator(integer=True))
    if "tau" in ax:
        ax["tau"].set_ylabel("threshold τ (s)")
    for name in ("k", "tau"):
        if name in ax:
            top = ax[name].dataLim.y1
            ax[name].set_ylim(0.0, 1.08 * top if np.isfinite(top) and top > 0 else 1.0)
            ax[name].ticklabel_format(axis="y", useOffset=False)


def title(scenario: Scenario) -> str:
    """Three lines naming what sets the scenario apart: task and data, delays, worker pattern."""
    first = f"{scenario.task}, {scenario.workers} workers, partition {scenario.partition}"
    second = [f"delay {scenario.delay}"]
    if scenario.micro_batches is not None:
        second.append(f"{scenario.micro_batches} micro-batches")
    if scenario.comm_time is not None:
        second.append(f"comm time {scenario.comm_time}")
    return f"{first}\n{', '.join(second)}\npattern {scenario.pattern}"


def caption(seeds: Sequence[int], bin_width: float, learns: bool) -> str:
    which = f"seed {seeds[0]}" if len(seeds) == 1 else f"mean over seeds {_listed(seeds)}"
    band = "" if len(seeds) == 1 else "; shaded: min to max over the seeds"
    loss = "Loss: evaluated on the training set. " if learns else "Timing only: no model. "
    return (
        f"Lines: {which}{band}.\n{loss}k_t and τ: time-weighted mean over bins of "
        f"{bin_width:.3g} s.\nVirtual time: the simulated clock, in seconds."
    )


def time_weighted_mean(times: np.ndarray, values: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Mean over each bin [edges[j], edges[j+1]) of the step function that equals ``values[i]``
    on (times[i-1], times[i]] (times[-1] = 0): update i's decision holds while it is in flight.

    NaN values (no threshold in force) and time after the last update are left out; a bin with
    nothing left is NaN.
    """
    knots = np.concatenate(([0.0], np.asarray(times, dtype=float)))
    values = np.asarray(values, dtype=float)
    known = np.isfinite(values)
    span = np.diff(knots)
    area = np.concatenate(([0.0], np.cumsum(np.where(known, values, 0.0) * span)))
    cover = np.concatenate(([0.0], np.cumsum(known * span)))
    clipped = np.minimum(edges, knots[-1])
    # piecewise-linear integrals of piecewise-constant functions: interpolation is exact
    sums = np.diff(np.interp(clipped, knots, area))
    lengths = np.diff(np.interp(clipped, knots, cover))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(lengths > 0, sums / np.where(lengths > 0, lengths, 1.0), np.nan)


def _losses(record: RunRecord) -> tuple[np.ndarray, np.ndarray]:
    rows = [r for r in record.evals if r.get("train_loss") is not None]
    t = np.array([r["time"] for r in rows], dtype=float)
    return t, np.array([r["train_loss"] for r in rows], dtype=float)


def _threshold(record: RunRecord) -> np.ndarray:
    return np.array(
        [np.nan if r.get("threshold") is None else r["threshold"] for r in record.steps],
        dtype=float,
    )


def _column(record: RunRecord, key: str) -> np.ndarray:
    return _threshold(record) if key == "threshold" else record.column(key).astype(float)


def _draw_loss(ax: Axes, records: Sequence[RunRecord], style: dict, name: str) -> None:
    curves = [_losses(r) for r in records]
    curves = [(t, y) for t, y in curves if t.size]
    if not curves:
        return
    # every seed's own evaluation times, up to where the shortest seed ends
    grid = np.unique(np.concatenate([t for t, _ in curves]))
    grid = grid[grid <= min(t[-1] for t, _ in curves)]
    ys = np.array([np.interp(grid, t, y) for t, y in curves])
    _mean_and_band(ax, grid, ys, style, name, drawstyle="default")


def _draw_binned(
    ax: Axes, records: Sequence[RunRecord], edges: np.ndarray, key: str, style: dict, name: str
) -> None:
    runs = [r for r in records if r.steps]
    if not runs:
        return
    ys = np.array([time_weighted_mean(r.column("time"), _column(r, key), edges) for r in runs])
    _mean_and_band(ax, edges[:-1], ys, style, name, drawstyle="steps-post")


def _mean_and_band(
    ax: Axes, x: np.ndarray, ys: np.ndarray, style: dict, name: str, drawstyle: str
) -> None:
    with warnings.catch_warnings():  # all-NaN columns: after a seed's last update
        warnings.simplefilter("ignore", RuntimeWarning)
        mean, low, high = np.nanmean(ys, 0), np.nanmin(ys, 0), np.nanmax(ys, 0)
    ax.plot(x, mean, label=name, drawstyle=drawstyle, linewidth=1.6, **style)
    if len(ys) > 1:
        step = "post" if drawstyle == "steps-post" else None
        ax.fill_between(x, low, high, color=style["color"], alpha=0.15, step=step, linewidth=0)


def _decorate_loss(ax: Axes, target: float | None) -> None:
    if target is not None:
        ax.axhline(target, color="grey", linestyle=":", label=f"target loss {target:g}")
    low, high = ax.get_ylim()
    if low > 0 and high / low > 30:  # log only when the losses span well over a decade
        ax.set_yscale("log")
    ax.set_ylabel("train loss")


def _legend(fig: plt.Figure, top: Axes) -> None:
    """One legend right of the panels; long specs wrap at their commas."""
    handles, labels = top.get_legend_handles_labels()
    labels = ["\n".join(wrap_spec(label, LEGEND_WIDTH)) for label in labels]
    fig.legend(handles, labels, loc="outside right upper", fontsize="small")


def wrap_spec(text: str, width: int) -> list[str]:
    """Lines of at most ``width`` characters where possible, broken after ':' and ','."""
    pieces, start = [], 0
    for i, char in enumerate(text):
        if char in ":,":
            pieces.append(text[start : i + 1])
            start = i + 1
    pieces.append(text[start:])
    lines = [""]
    for piece in filter(None, pieces):
        if lines[-1] and len(lines[-1]) + len(piece) > width:
            lines.append("")
        lines[-1] += piece
    return lines


def _listed(seeds: Sequence[int]) -> str:
    return ", ".join(str(s) for s in seeds)
