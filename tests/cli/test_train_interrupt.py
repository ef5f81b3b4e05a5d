"""Ctrl-C on `tailtrain train`: exit status 130, one line, and the run folder keeps what finished.

Each test starts ``tailtrain train --out DIR`` as a user does (its own process group, as a
terminal's job), waits until a few rows are in ``steps.jsonl``, sends SIGINT to the launcher
or to the whole group (what a terminal's Ctrl-C does), and reads what is left. The injected
delays only keep the run going long enough to be interrupted; nothing here times anything.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: long enough never to end before the signal, on however slow a machine
ITERATIONS = 5000
FLAGS = [
    "--task", "logreg", "--delay", "const:value=0.05", "--iterations", str(ITERATIONS),
    "--timeout", "60", "--no-progress",
]  # fmt: skip
#: rows seen in steps.jsonl before the signal
BEFORE = 3
#: seconds to wait for the rows (the ranks start in seconds, more on a loaded machine)
START_WAIT = 150.0
#: seconds to wait for the job to end after the signal
END_WAIT = 60.0


def environment() -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT), env.get("PYTHONPATH", "")])
    return env


def start(argv: list[str]) -> subprocess.Popen:
    """``argv`` in a process group of its own, as a terminal starts a job."""
    return subprocess.Popen(
        argv,
        env=environment(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def rows(path: Path) -> list[str]:
    """The complete lines of ``path`` so far (a line still being written is left out)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    return text.splitlines()[: text.count("\n")]


def wait_for_rows(proc: subprocess.Popen, path: Path, count: int) -> list[str]:
    deadline = time.monotonic() + START_WAIT
    while len(seen := rows(path)) < count:
        if proc.poll() is not None:
            pytest.fail(f"the run ended before {count} rows: {proc.communicate()[1][-2000:]}")
        if time.monotonic() > deadline:
            stop(proc)
            pytest.fail(f"no {count} rows in {path} within {START_WAIT:g}s")
        time.sleep(0.1)
    return seen


def stop(proc: subprocess.Popen) -> None:
    """Kill what is left of the job (after a failed assertion)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate()


def interrupt(proc: subprocess.Popen, group: bool) -> tuple[int, str, str]:
    """Ctrl-C: SIGINT to the whole process group (a terminal's) or to the launcher alone."""
    if group:
        os.killpg(proc.pid, signal.SIGINT)
    else:
        proc.send_signal(signal.SIGINT)
    try:
        out, err = proc.communicate(timeout=END_WAIT)
    except subprocess.TimeoutExpired:
        stop(proc)
        pytest.fail(f"the job did not end within {END_WAIT:g}s of SIGINT")
    return proc.returncode, out, err


def check_kept(folder: Path, seen: list[str], code: int, out: str, err: str) -> dict:
    """What every interrupted run must leave; returns its summary."""
    assert code == 130, err[-3000:]
    assert "Traceback" not in err and "Traceback" not in out, err[-3000:]
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tailtrain train: interrupted at step"), err
    assert str(folder) in lines[0]
    kept = [json.loads(line) for line in (folder / "steps.jsonl").read_text().splitlines()]
    assert len(kept) >= len(seen)
    assert [row["step"] for row in kept] == list(range(len(kept)))
    assert kept[: len(seen)] == [json.loads(line) for line in seen]
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["partial"] is True
    assert summary["iterations"] == len(kept) < ITERATIONS
    assert f"kept {len(kept)} steps" in lines[0]
    return summary


def trace_rows(folder: Path) -> list[str]:
    return (folder / "trace.csv").read_text().splitlines()[1:]


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    ("strategy", "group"),
    [("sync", False), ("dropcompute:threshold=0.2", True)],
    ids=["sync-launcher", "dropcompute-group"],
)
def test_ctrl_c_keeps_an_allreduce_run_and_exits_130(tmp_path, strategy, group):
    folder = tmp_path / "run"
    argv = [sys.executable, "-m", "tailtrain", "train", *FLAGS, "--workers", "2"]
    proc = start([*argv, "--strategy", strategy, "--out", str(folder)])
    seen = wait_for_rows(proc, folder / "steps.jsonl", BEFORE)
    code, out, err = interrupt(proc, group)
    check_kept(folder, seen, code, out, err)
    assert "resume with `tailtrain train --resume" in err  # the last round is checkpointed
    assert (folder / "checkpoint.pt").exists()
    assert trace_rows(folder)


@pytest.mark.timeout(240)
def test_ctrl_c_keeps_a_partial_collective_run_and_exits_130(tmp_path):
    folder = tmp_path / "run"
    argv = [sys.executable, "-m", "tailtrain", "train", *FLAGS, "--workers", "2"]
    proc = start([*argv, "--strategy", "eager", "--out", str(folder)])
    seen = wait_for_rows(proc, folder / "steps.jsonl", BEFORE)
    code, out, err = interrupt(proc, group=True)
    check_kept(folder, seen, code, out, err)
    assert "resume with `tailtrain train --resume" in err  # the census checkpointed a round
    assert (folder / "checkpoint.pt").exists()
    assert not (folder / "failures.jsonl").exists()  # a Ctrl-C is no failure of the group


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    ("strategy", "group"),
    [("k-sync:k=1", False), ("lgc:k=1,blocks=2", True)],
    ids=["k-sync-launcher", "lgc-group"],
)
def test_ctrl_c_keeps_a_parameter_server_run_whose_rows_stream(tmp_path, strategy, group):
    folder = tmp_path / "run"
    argv = [sys.executable, "-m", "tailtrain", "train", *FLAGS, "--workers", "2"]
    proc = start([*argv, "--strategy", strategy, "--out", str(folder)])
    seen = wait_for_rows(proc, folder / "steps.jsonl", BEFORE)  # rows before the run ends
    assert proc.poll() is None
    code, out, err = interrupt(proc, group)
    summary = check_kept(folder, seen, code, out, err)
    assert "resume with `tailtrain train --resume" in err  # the last closed step is kept
    assert (folder / "checkpoint.pt").exists()
    assert summary["topology"] == "parameter-server"
    assert {int(row.split(",")[1]) for row in trace_rows(folder)} == {0, 1}
    kept = [json.loads(line) for line in (folder / "steps.jsonl").read_text().splitlines()]
    assert all("partial_workers" in row for row in kept)  # LGC's late columns, one row a step


@pytest.mark.timeout(240)
def test_ctrl_c_under_torchrun_keeps_the_run_and_rank_0_says_so(tmp_path):
    folder = tmp_path / "run"
    torchrun = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
        "-m", "tailtrain", "train", *FLAGS, "--strategy", "sync", "--out", str(folder),
    ]  # fmt: skip
    proc = start(torchrun)
    seen = wait_for_rows(proc, folder / "steps.jsonl", BEFORE)
    code, _, err = interrupt(proc, group=True)  # the terminal's: torchrun and both ranks
    assert code != 0  # torchrun's own status (and traceback) after a signal are not ours
    assert "tailtrain/runtime" not in err and "tailtrain/cli" not in err  # no rank's traceback
    ours = [line for line in err.splitlines() if line.startswith("tailtrain train:")]
    assert len(ours) == 1 and "interrupted at step" in ours[0], err[-3000:]
    kept = [json.loads(line) for line in (folder / "steps.jsonl").read_text().splitlines()]
    assert len(kept) >= len(seen) and kept[: len(seen)] == [json.loads(s) for s in seen]
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["partial"] is True and summary["iterations"] == len(kept)
    assert trace_rows(folder) and (folder / "checkpoint.pt").exists()
