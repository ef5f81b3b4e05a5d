"""``tailtrain launch``'s promise for your own script (issue 34 item 5), kept by its ranks'
bootstrap (``runtime.launching.script_rank``): bad input is one line and exit status 2, whichever
rank finds it; Ctrl-C is one line and 130, what the script finished kept; a crash is one line naming
the rank after its traceback. Each test starts ``tailtrain launch`` as a user does (its own
process group, as a terminal's job) on a gloo script of two ranks, one torch thread each, on a
free port; nothing here times anything."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from tests.cli.test_train_interrupt import interrupt, start, stop, wait_for_rows

#: a DDP-shaped script: its own flags (argparse), the process group, then steps; rank 0
#: appends each finished step to --out as a line
SCRIPT = """\
import argparse, os, time
import torch
import torch.distributed as dist
from tailtrain import UsageError

parser = argparse.ArgumentParser()
parser.add_argument("--lr", type=float, default=0.1)
parser.add_argument("--steps", type=int, default=2)
parser.add_argument("--out", default=None)
parser.add_argument("--fail", choices=("usage", "crash"), default=None)
args = parser.parse_args()
torch.set_num_threads(1)
dist.init_process_group("gloo")
rank = dist.get_rank()
for step in range(args.steps):
    if step == 1 and rank == 1 and args.fail == "usage":  # found by one rank, mid-run
        raise UsageError("--shares needs one int per rank")
    if step == 1 and rank == 1 and args.fail == "crash":
        raise ZeroDivisionError("the loss divided by zero")
    total = torch.ones(1)
    dist.all_reduce(total)
    time.sleep(0.05)
    if rank == 0 and args.out:
        with open(args.out, "a") as f:
            f.write(f"{step} {total.item():g}\\n")
dist.destroy_process_group()
"""
#: seconds a launch that should end by itself may take (two ranks import torch)
END = 150


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "job.py"
    path.write_text(SCRIPT)
    return path


def launched(script: Path, *args: str) -> tuple[int, str, str]:
    """``tailtrain launch --nproc-per-node 2 SCRIPT ARGS`` to its end."""
    argv = [sys.executable, "-m", "tailtrain", "launch", "--nproc-per-node", "2", str(script)]
    proc = start([*argv, *args])
    try:
        out, err = proc.communicate(timeout=END)
    except subprocess.TimeoutExpired:
        stop(proc)
        pytest.fail(f"the launch did not end within {END}s")
    return proc.returncode, out, err


@pytest.mark.timeout(200)
def test_a_script_s_bad_arguments_are_one_line_and_exit_2(script):
    code, out, err = launched(script, "--lr", "x")
    assert (code, out) == (2, "")
    assert err == "job.py: error: argument --lr: invalid float value: 'x'\n"  # not one per rank


@pytest.mark.timeout(200)
def test_a_usage_error_one_rank_raises_mid_run_is_one_line_and_exit_2(script):
    """Rank 1 refuses at step 1; rank 0, in the collective rank 1 left, is stopped silent."""
    code, _, err = launched(script, "--steps", "3", "--fail", "usage")
    assert code == 2
    assert err == "job.py: error: --shares needs one int per rank\n"


@pytest.mark.timeout(200)
def test_a_crash_is_its_traceback_and_one_line_naming_the_rank(script):
    code, _, err = launched(script, "--steps", "3", "--fail", "crash")
    assert code == 1
    assert err.count("Traceback") == 1  # rank 1's; rank 0, whose peer left, says nothing
    assert err.endswith(
        "tailtrain launch: error: rank 1 failed (ZeroDivisionError: the loss divided by zero; "
        "exit status 1); the other ranks were stopped\n"
    )


@pytest.mark.timeout(300)
def test_ctrl_c_is_one_line_and_130_and_what_finished_is_kept(script, tmp_path):
    steps = tmp_path / "steps.txt"
    argv = [sys.executable, "-m", "tailtrain", "launch", "--nproc-per-node", "2", str(script)]
    proc = start([*argv, "--steps", "100000", "--out", str(steps)])
    seen = wait_for_rows(proc, steps, 3)
    code, out, err = interrupt(proc, group=True)  # the terminal's Ctrl-C: the launcher's group
    assert (code, out) == (130, "")
    assert err == "tailtrain launch: interrupted; the ranks were stopped\n"
    kept = steps.read_text().splitlines()
    assert kept[: len(seen)] == seen and kept == [f"{i} 2" for i in range(len(kept))]
