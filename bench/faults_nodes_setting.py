"""The setting that ``bench_faults_nodes.py`` shares with its accounting
(``faults_nodes_accounting.py``) and its goals (``faults_nodes_goals.py``): the nodes and their
ranks, the rows (the tailtrain rows' rules) and the drills, and the environment of every
process it starts."""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench import bench_faults as bf  # noqa: E402
from bench import faults_goals as fg  # noqa: E402

NODES, NPROC = 3, 2
WORKERS = NODES * NPROC
ROWS = (
    "tailtrain-sync",
    "tailtrain-rebalance",
    "tailtrain-deal-demand",
    "torchft-default",
    "torchft-tuned",
    "torchrun",
)
STRATEGY = {
    "tailtrain-sync": "sync",
    "tailtrain-rebalance": "rebalance",
    "tailtrain-deal-demand": "rebalance:deal=demand",
}
TAILTRAIN = ("tailtrain-sync", "tailtrain-rebalance", "tailtrain-deal-demand")
TORCHFT = fg.TORCHFT
DRILLS = ("kill", "stop", "slow", "heal")


def child_env() -> dict[str, str]:
    """``bench_faults.env`` plus the bench folder (the scripts import ``faults_peer``)."""
    out = bf.env()
    out["PYTHONPATH"] = os.pathsep.join([out["PYTHONPATH"], str(ROOT / "bench")])
    return out
