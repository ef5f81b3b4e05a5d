"""Plots of the reproductions: labelled axes with units, one PNG per figure, no display."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only: no display on servers and CI
import matplotlib.pyplot as plt

from tailtrain.core.records import RunRecord


@contextmanager
def figure(
    path: Path,
    panels: int = 1,
    *,
    title: str = "",
    sharex: bool = False,
    rows: int = 1,
    legend: str = "each",
) -> Iterator[Sequence[Any]]:
    """Axes for ``panels`` side by side (or in ``rows`` rows); saved to ``path`` on exit.

    ``legend``: ``"each"`` panel its own, or ``"below"``: one legend under the panels, from
    the first panel's lines, for panels that draw the same runs (it covers none of them)."""
    cols = -(-panels // rows)
    fig, axes = plt.subplots(
        rows, cols, figsize=(4.6 * cols, 3.6 * rows), sharex=sharex, squeeze=False,
        layout="constrained",
    )  # fmt: skip
    flat = list(axes.ravel())
    try:
        yield flat[:panels]
        for extra in flat[panels:]:
            extra.set_visible(False)
        if legend == "below":
            handles, labels = flat[0].get_legend_handles_labels()
            fig.legend(handles, labels, loc="outside lower center", ncols=2, fontsize="small")
        else:
            for ax in flat[:panels]:
                if ax.get_legend_handles_labels()[0]:
                    ax.legend(fontsize="small")
        if title:
            fig.suptitle(title, fontsize="medium")
        fig.savefig(path, dpi=110)
    finally:
        plt.close(fig)


def label(ax: Any, xlabel: str, ylabel: str, title: str = "") -> None:
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title, fontsize="small")
    ax.grid(alpha=0.3)


def eval_curve(ax: Any, record: RunRecord, name: str, key: str = "train_loss", **style) -> None:
    """One run's evaluations against virtual time."""
    t = [row["time"] for row in record.evals]
    ax.plot(t, [row.get(key) for row in record.evals], label=name, **style)


def k_curve(ax: Any, record: RunRecord, name: str, **style) -> None:
    """k_t against virtual time, as a step function."""
    ax.step(record.column("time"), record.column("k"), where="pre", label=name, **style)


def bars(ax: Any, groups: Sequence[str], series: dict[str, Sequence[float]]) -> None:
    """Grouped bars: one group per entry of ``groups``, one bar per series."""
    width = 0.8 / max(1, len(series))
    for i, (name, values) in enumerate(series.items()):
        x = [g + (i - (len(series) - 1) / 2) * width for g in range(len(groups))]
        ax.bar(x, values, width=width, label=name)
    ax.set_xticks(range(len(groups)), groups)
