"""Figures: loss against virtual time with k_t below it, one colour per strategy."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display on servers and CI
import matplotlib.pyplot as plt

from tailtrain.sim.compare import Comparison


def plot_comparison(comparison: Comparison, path: Path) -> Path:
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 7), sharex=True, height_ratios=(3, 2))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (name, records) in enumerate(comparison.runs.items()):
        colour = colours[i % len(colours)]
        for j, record in enumerate(records):
            label = name if j == 0 else None
            t = [row["time"] for row in record.evals]
            loss = [row["train_loss"] for row in record.evals]
            top.plot(t, loss, color=colour, alpha=0.9 if j == 0 else 0.35, label=label)
        first = records[0]
        bottom.step(first.column("time"), first.column("k"), where="post", color=colour, label=name)
    target = comparison.scenario.target_loss
    if target is not None:
        top.axhline(target, color="grey", linestyle=":", label=f"target {target:g}")
    top.set_ylabel("train loss")
    top.set_yscale("log")
    top.legend(fontsize="small")
    top.set_title(
        f"{comparison.scenario.task}, {comparison.scenario.workers} workers, "
        f"delay {comparison.scenario.delay}"
    )
    bottom.set_ylabel("k_t (first seed)")
    bottom.set_xlabel("virtual time (s)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
