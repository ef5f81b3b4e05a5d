"""`tailtrain train` as two torchrun nodes of one rank each (c10d rendezvous on 127.0.0.1):
the launcher sees torchrun's environment, the ranks meet, rank 0 writes the one run record."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[2]
ITERATIONS = 8


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.timeout(90)
def test_two_torchrun_nodes_train_and_write_one_run_record(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    node = [
        sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
        "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}",
        "--rdzv-id", f"two-nodes-{os.getpid()}",
        "-m", "tailtrain", "train", "--task", "logreg", "--micro-batches", "2",
        "--strategy", "dropcompute:calibrate=3", "--iterations", str(ITERATIONS),
        "--timeout", "60", "--out", str(tmp_path / "run"), "--json",
    ]  # fmt: skip
    nodes = [
        subprocess.Popen(node, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    try:
        outputs = [p.communicate(timeout=80) for p in nodes]
    finally:
        for p in nodes:
            p.kill()
    assert [p.returncode for p in nodes] == [0, 0], [err[-2000:] for _, err in outputs]
    printed = [out for out, _ in outputs if out.strip()]
    assert len(printed) == 1  # rank 0's summary, whichever node it landed on
    summary = json.loads(printed[0])
    steps = pd.read_json(tmp_path / "run" / "steps.jsonl", lines=True)
    assert len(steps) == ITERATIONS and all(len(c) == 2 for c in steps["completed"])
    assert summary == json.loads((tmp_path / "run" / "summary.json").read_text())
    assert 0 < summary["threshold"] < float("inf")  # Algorithm 2 ran on the gathered times
    assert {f"trace-rank{r}.csv" for r in (0, 1)} <= {p.name for p in (tmp_path / "run").iterdir()}
