"""The examples run as documented: two ranks under torchrun (c10d rendezvous), CPU, gloo."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = {
    "custom_loop.py": "custom_loop: 60 steps on 2 ranks",
    "ddp_loop.py": "ddp_loop: 60 steps on 2 ranks",
    # rank 1 twice as slow a micro-batch: its share halves, every sample once an epoch
    "rebalance_loop.py": "rebalance_loop: 30 steps on 2 ranks, shares [6, 6] -> [8, 4],",
}
#: what else an example's last line says
ALSO = {"rebalance_loop.py": "every sample once an epoch: True"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def torchrun(*args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", *args]


def environment() -> dict[str, str]:
    """This checkout's sources first, as the tests import them."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    return env


@pytest.mark.slow
@pytest.mark.timeout(90)
@pytest.mark.parametrize("name", EXAMPLES)
def test_example_runs_under_torchrun(name):
    endpoint = f"127.0.0.1:{free_port()}"
    command = torchrun(
        "--nproc-per-node", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint,
        str(ROOT / "examples" / name),
    )  # fmt: skip
    done = subprocess.run(
        command, cwd=ROOT, env=environment(), capture_output=True, text=True, timeout=80
    )
    assert done.returncode == 0, done.stderr[-3000:]
    last = done.stdout.strip().splitlines()[-1]
    assert last.startswith(EXAMPLES[name]), done.stdout
    assert ALSO.get(name, "") in last, done.stdout
    accuracy = float(last.rsplit("test accuracy ", 1)[1])
    assert accuracy > 0.5  # ten classes: far above chance after 60 steps


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_face_example_runs_predict_simulate_and_train():
    """examples/face.py: the public face alone, on one small scenario (train: 2 local ranks)."""
    command = [sys.executable, str(ROOT / "examples" / "face.py")]
    done = subprocess.run(
        command, cwd=ROOT, env=environment(), capture_output=True, text=True, timeout=110
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    assert [line.split(":")[0] for line in lines] == ["predict", "simulate", "train"], done.stdout
    simulated, trained = (line.rsplit("loss ", 1)[1] for line in lines[1:])
    assert simulated == trained  # the same rule, data and seed: the same model (to 3 digits)


@pytest.mark.timeout(120)
def test_face_example_runs_under_torchrun(tmp_path):
    """examples/face.py as two torchrun ranks: ``train`` joins torchrun's job, and each rank
    prints what rank 0 prints locally; rank 1's ``train`` line reads the job's summary (rank
    1 once died on a summary without ``mean_iteration_time``)."""
    endpoint = f"127.0.0.1:{free_port()}"
    logs = tmp_path / "logs"
    command = torchrun(
        "--nproc-per-node", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint,
        "--log-dir", str(logs), "--redirects", "3", str(ROOT / "examples" / "face.py"),
    )  # fmt: skip
    done = subprocess.run(
        command, cwd=ROOT, env=environment(), capture_output=True, text=True, timeout=110
    )
    assert done.returncode == 0, done.stderr[-3000:]
    printed = {
        rank: next(logs.glob(f"*/attempt_0/{rank}/stdout.log")).read_text().splitlines()
        for rank in (0, 1)
    }
    lines = printed[0]
    assert [line.split(":")[0] for line in lines] == ["predict", "simulate", "train"], printed
    simulated, trained = (line.rsplit("loss ", 1)[1] for line in lines[1:])
    assert simulated == trained  # as in a local launch: the same model (to 3 digits)
    assert printed[1] == lines  # the same record on every rank, wall times included


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_probe_example_names_the_slow_rank_and_advise_reads_its_folder(tmp_path):
    """examples/probe_ddp.py under torchrun with rank 1 slowed by 20 ms a forward (the model
    computes in well under a millisecond): the probe names it live, and ``tailtrain advise``
    on the probe's folder names it as well."""
    endpoint = f"127.0.0.1:{free_port()}"
    out = tmp_path / "probe"
    command = torchrun(
        "--nproc-per-node", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint,
        str(ROOT / "examples" / "probe_ddp.py"), "--slow-rank", "1", "--out", str(out),
    )  # fmt: skip
    done = subprocess.run(
        command, cwd=ROOT, env=environment(), capture_output=True, text=True, timeout=80
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == (
        "probe_ddp: 40 steps on 2 ranks, named {1: 'persistent'}"
    ), done.stdout
    assert "rank 1 persistent" in done.stderr
    advised = subprocess.run(
        [sys.executable, "-m", "tailtrain", "advise", str(out), "--json"],
        cwd=ROOT, env=environment(), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert advised.returncode == 0, advised.stderr[-3000:]
    verdicts = {s["worker"]: s["verdict"] for s in json.loads(advised.stdout)["stragglers"]}
    assert verdicts == {0: "healthy", 1: "persistent"}


@pytest.mark.slow  # three ranks that each import torch and sklearn: ~10 s on a quiet machine
@pytest.mark.timeout(300)
def test_shrink_example_goes_on_without_a_killed_rank_0():
    """examples/shrink_loop.py as its docstring runs it: rank 0 (no rank is special: the store
    lives in the launcher) SIGKILLed inside step 10 of 40; ranks 1 and 2 redo the step and
    finish."""
    command = [
        sys.executable, "-m", "tailtrain", "launch", "--nproc-per-node", "3",
        "--on-rank-loss", "shrink", str(ROOT / "examples" / "shrink_loop.py"),
        "--kill-rank", "0", "--kill-step", "10",
    ]  # fmt: skip
    done = subprocess.run(
        command, cwd=ROOT, env=environment(), capture_output=True, text=True, timeout=280
    )
    assert done.returncode == 0, done.stderr[-3000:]
    last = done.stdout.strip().splitlines()[-1]
    assert last.startswith(
        "shrink_loop: 40 steps, ranks [1, 2] of 3 finished, lost [0], redone [10],"
    ), done.stdout
    assert "rank 0 died (killed by SIGKILL); noted dead for the live ranks" in done.stderr
    assert "ranks [1, 2] went on from step 10 (generation " in done.stderr
    assert float(last.rsplit("test accuracy ", 1)[1]) > 0.5
