"""The trace as a picture: per-worker iteration times, persistent stragglers marked."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def plot_heatmap(times: np.ndarray, ids: np.ndarray, persistent: list[int], path: Path) -> Path:
    """Heatmap of ``times[i, w]`` (seconds; iterations across, workers down) written to
    ``path``; persistent stragglers get a red label and a red marker."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workers = times.shape[1]
    fig, ax = plt.subplots(figsize=(10, max(3.0, 0.25 * workers + 1.5)))
    image = ax.imshow(times.T, aspect="auto", interpolation="nearest", cmap="viridis")
    fig.colorbar(image, ax=ax, label="iteration time (s)")
    ax.set_xlabel("iteration")
    ax.set_ylabel("worker")
    ticks = np.arange(workers) if workers <= 40 else np.linspace(0, workers - 1, 20).astype(int)
    ax.set_yticks(ticks, [str(int(ids[t])) for t in ticks])
    slow = np.flatnonzero(np.isin(ids, persistent))
    for row in slow:  # the red dashed line and label mark a persistent straggler
        ax.axhline(row, color="red", linewidth=0.8, linestyle="--")
    for label in ax.get_yticklabels():
        if int(label.get_text()) in persistent:
            label.set_color("red")
    ax.set_title("per-worker iteration times (red: persistent stragglers)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
