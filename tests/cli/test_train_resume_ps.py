"""The parameter server keeps its runs as the other topologies do: checkpoints, --resume, restarts.

Every run here is ``k-sync:k=2`` on 3 workers (4 processes) with constant injected delays that
grow with the worker (``const:value=0.05`` and ``linear:step=0.15``: worker w's job lasts
0.05 + 0.15 w s), so arrivals are at least 150 ms apart, workers 0 and 1 close every step, and
the run's decisions do not depend on the machine's speed: a resumed run must end with the
uninterrupted run's loss. Nothing here times anything; every wait is bounded. (At 50 ms apart,
CI85's load once let worker 2 close step 25 before worker 1.)

"In flight" (what a stop may cost) is the step the server is collecting arrivals for when the
stop comes. Ctrl-C closes it and records it before the server stops, and the checkpoint then
holds it, so nothing is played again. A killed server records nothing of it, and its rows
after the last periodic checkpoint are cut from ``steps.jsonl`` and played again on resume.
Either way the finished ``steps.jsonl`` holds every step number exactly once, in order.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest
from tests.cli.helpers import run
from tests.cli.test_train_interrupt import interrupt, start, stop, wait_for_rows

from tailtrain.runtime.ps.server import SERVER_PID

ITERATIONS = 30
FLAGS = [
    "--task", "logreg", "--workers", "3", "--strategy", "k-sync:k=2", "--seed", "3",
    "--delay", "const:value=0.05", "--pattern", "linear:step=0.15", "--eval-every", "10",
    "--timeout", "60", "--no-progress",
]  # fmt: skip
#: rows in steps.jsonl before the stop
BEFORE = 6
#: seconds to wait for the server's pid file
PID_WAIT = 150.0


def steps(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "steps.jsonl").read_text().splitlines()]


def summary(folder: Path) -> dict:
    return json.loads((folder / "summary.json").read_text())


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """The same run, never interrupted."""
    folder = tmp_path_factory.mktemp("reference") / "run"
    code = run_quietly(["train", *FLAGS, "--iterations", str(ITERATIONS), "--out", str(folder)])
    assert code == 0
    return folder


def run_quietly(argv: list[str]) -> int:
    from tailtrain.cli import main

    return main(argv)


def launch(folder: Path, *extra: str):
    argv = [sys.executable, "-m", "tailtrain", "train", *FLAGS, "--iterations", str(ITERATIONS)]
    return start([*argv, "--out", str(folder), *extra])


def resume(folder: Path, capfd) -> None:
    code, _, err = run(["train", "--resume", str(folder), "--json"], capfd)
    assert code == 0, err


def assert_complete(folder: Path, reference: Path) -> None:
    """Every step exactly once, in order; the uninterrupted run's final loss; no checkpoint."""
    rows = steps(folder)
    assert [row["step"] for row in rows] == list(range(ITERATIONS))
    # who closed each step (in arrival order, which a loaded machine may swap)
    assert [sorted(r["workers"]) for r in rows] == [sorted(r["workers"]) for r in steps(reference)]
    assert summary(folder)["final_loss"] == pytest.approx(
        summary(reference)["final_loss"], rel=1e-6, abs=1e-6
    )
    assert "partial" not in summary(folder)
    assert not (folder / "checkpoint.pt").exists()  # a finished run keeps none


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_ctrl_c_then_resume_plays_every_step_once(tmp_path, capfd, reference):
    folder = tmp_path / "run"
    proc = launch(folder, "--checkpoint-every", "4")
    seen = wait_for_rows(proc, folder / "steps.jsonl", BEFORE)
    code, _, err = interrupt(proc, group=True)
    assert code == 130, err[-3000:]
    assert "resume with `tailtrain train --resume" in err
    kept = steps(folder)
    assert len(kept) >= len(seen) and summary(folder)["partial"] is True
    # the step in flight was closed and recorded; the checkpoint holds every kept row
    assert [row["step"] for row in kept] == list(range(len(kept))) and len(kept) < ITERATIONS
    resume(folder, capfd)
    assert_complete(folder, reference)
    assert steps(folder)[: len(kept)] == kept  # nothing kept was played again


def server_pid(proc, folder: Path) -> int:
    """The server's pid, from the file it writes in the run folder as it starts serving."""
    deadline = time.monotonic() + PID_WAIT
    path = folder / SERVER_PID
    while not (path.exists() and path.read_text().endswith("\n")):
        if proc.poll() is not None or time.monotonic() > deadline:
            stop(proc)
            pytest.fail(f"no {path} within {PID_WAIT:g}s")
        time.sleep(0.05)
    return int(path.read_text())


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_killed_server_leaves_a_checkpoint_and_resume_completes_the_run(tmp_path, capfd):
    folder = tmp_path / "run"
    proc = launch(folder, "--checkpoint-every", "4")
    pid = server_pid(proc, folder)
    wait_for_rows(proc, folder / "steps.jsonl", BEFORE + 4)  # past a periodic checkpoint
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    try:
        _, err = proc.communicate(timeout=120)
    except Exception:
        stop(proc)
        raise
    assert proc.returncode != 0, err[-3000:]
    assert "rank 0 failed" in err and "SIGKILL" in err, err[-3000:]
    # the periodic checkpoint: nobody outlived the server to write a later one
    assert f"in {folder}: continue with `tailtrain train --resume {folder}`" in err, err[-3000:]
    on_disk = [row["step"] for row in steps(folder)]
    assert on_disk == list(range(len(on_disk)))  # the rows of the closed steps, flushed
    resume(folder, capfd)
    assert [row["step"] for row in steps(folder)] == list(range(ITERATIONS))
    assert "partial" not in summary(folder) and not (folder / "checkpoint.pt").exists()


@pytest.mark.timeout(400)
def test_a_resumed_k_sync_run_ends_with_the_uninterrupted_runs_loss(tmp_path, capfd, reference):
    """--fail-at makes the server fail at step 13 without --max-restarts: the failure writes
    the checkpoint of its last closed step; the resumed run is the uninterrupted one."""
    folder = tmp_path / "run"
    argv = ["train", *FLAGS, "--iterations", str(ITERATIONS), "--out", str(folder)]
    code, _, err = run([*argv, "--checkpoint-every", "5", "--fail-at", "0:13"], capfd)
    assert code == 1
    assert "rank 0 failed at step 13" in err and "checkpoint of step 12" in err, err
    assert [row["step"] for row in steps(folder)] == list(range(13))
    resume(folder, capfd)
    assert_complete(folder, reference)


@pytest.mark.timeout(400)
def test_with_max_restarts_a_failed_server_restarts_and_finishes(tmp_path, capfd, reference):
    folder = tmp_path / "run"
    argv = ["train", *FLAGS, "--iterations", str(ITERATIONS), "--out", str(folder)]
    code, _, err = run([*argv, "--max-restarts", "1", "--fail-at", "0:9"], capfd)
    assert code == 0, err
    assert_complete(folder, reference)
    fired = (folder / "drills.jsonl").read_text().splitlines()
    # --fail-at is the raise drill: once, not again after the restart
    assert [json.loads(line)["fault"] for line in fired] == ["raise:rank=0,step=9"]
    failures = [json.loads(line) for line in (folder / "failures.jsonl").read_text().splitlines()]
    assert [(f["step"], f["checkpoint"]) for f in failures] == [(9, 9)]
