"""Dead and hung workers on the parameter server: the run goes on (issue 14).

Each test is one `tailtrain train` in a process of its own (a second local launch in one
process may find a rank that never joins): four workers and a server on gloo, a fault drill
(``--inject-fault``), and the run record read back. ``--worker-timeout 0.5`` keeps the
detection short next to runs of a few seconds of injected delays.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
N = 4


def train(out: Path, strategy: str, *flags: str) -> tuple[dict, list[dict], str]:
    """Run `tailtrain train`; its summary, step rows and stderr (exit status 0 required)."""
    args = ["train", "--workers", str(N), "--task", "logreg", "--strategy", strategy]
    args += ["--worker-timeout", "0.5", "--timeout", "30", "--out", str(out), "--json", *flags]
    done = subprocess.run(
        [sys.executable, "-m", "tailtrain", *args],
        capture_output=True,
        text=True,
        timeout=150,
        env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines()]
    return json.loads(done.stdout), rows, done.stderr


def first(rows: list[dict], column: str, worker: int) -> int:
    """The first step whose row records ``worker`` under ``column``."""
    return next(r["step"] for r in rows if worker in r.get(column, []))


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("strategy", ["k-async:k=2", "k-sync:k=4"])
def test_a_killed_worker_is_found_dead_and_the_run_finishes_without_it(tmp_path, strategy):
    """k-async: 2 of the 3 left; k-sync with k = n: k is capped at the 3 live workers, so
    the steps close again once the dead worker is found (without the cap, never). Its closed
    connection fails its receiving thread's receive, so it is found dead in the step it died
    in, not a bound later (a frozen worker's stays open: the next test)."""
    summary, rows, _ = train(
        tmp_path,
        strategy,
        *("--iterations", "60", "--delay", "const:value=0.03"),
        *("--inject-fault", "kill:worker=1,step=4"),
    )
    assert summary["dead_workers"] == [1]
    assert summary["iterations"] == 60 and len(rows) == 60
    assert all(math.isfinite(r["loss"]) for r in rows) and math.isfinite(summary["final_loss"])
    assert summary["worker_jobs"][1] is None  # its report died with it
    died = first(rows, "dead", 1)
    assert 4 <= died < 59
    assert all(1 not in r["workers"] for r in rows[died + 1 :])
    assert all(r["live"] == N - 1 for r in rows[died:])
    if strategy == "k-sync:k=4":  # the rule's k stays 4; the steps close on the 3 live ones
        assert died == 4
        assert all(r["k"] == 4 and sorted(r["workers"]) == [0, 2, 3] for r in rows[died + 1 :])
        assert all(sorted(r["workers"]) == [0, 1, 2, 3] for r in rows[:4])


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_frozen_worker_is_suspected_then_rejoins_and_its_gradients_count_again(tmp_path):
    summary, rows, _ = train(
        tmp_path,
        "k-async:k=2",
        *("--time-budget", "5", "--delay", "const:value=0.03"),
        *("--inject-fault", "freeze:worker=1,step=5,seconds=2.5"),
    )
    assert summary["dead_workers"] == [] and summary["hung_workers"] == [1]
    assert summary["rejoins"] == 1
    suspected, rejoined = first(rows, "suspect", 1), first(rows, "rejoined", 1)
    assert 5 <= suspected < rejoined
    assert all(1 not in r["workers"] for r in rows[suspected + 1 : rejoined])
    later = [r for r in rows[rejoined + 1 :] if 1 in r["workers"]]
    assert len(later) >= 5  # its gradients are used again, as any worker's
    assert "live" not in rows[-1]  # every worker live at the end


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_nan_gradient_is_left_out_of_its_update_and_counted(tmp_path):
    summary, rows, _ = train(
        tmp_path,
        "k-sync:k=4",
        *("--iterations", "8", "--inject-fault", "nan:worker=2,step=3"),
    )
    assert summary["nonfinite"] == 1 and summary["dead_workers"] == []
    assert rows[3]["nonfinite"] == 1 and sorted(rows[3]["workers"]) == [0, 1, 3]
    assert all("nonfinite" not in r and len(r["workers"]) == N for r in rows if r["step"] != 3)
    assert all(math.isfinite(r["loss"]) for r in rows) and math.isfinite(summary["final_loss"])


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_worker_that_raises_is_named_and_left_out(tmp_path):
    summary, rows, stderr = train(
        tmp_path,
        "k-sync:k=2",
        *("--iterations", "40", "--delay", "const:value=0.02"),
        *("--inject-fault", "raise:rank=2,step=3"),
    )
    drill = "(--inject-fault raise:rank=2,step=3)"
    assert f"rank 2 died (InjectedFault: rank 2 fails at step 3 {drill})" in stderr
    assert summary["dead_workers"] == [1] and len(rows) == 40


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_healthy_run_longer_than_the_timeout_sends_no_probe_and_loses_no_worker(tmp_path):
    # the workers' probe mailboxes hear nothing all run: their wait must outlast --timeout
    args = ["train", "--workers", str(N), "--task", "logreg", "--strategy", "k-async:k=2"]
    args += ["--delay", "const:value=0.02", "--timeout", "3", "--time-budget", "8", "--json"]
    done = subprocess.run(
        [sys.executable, "-m", "tailtrain", *args, "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=150,
        env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout)
    assert summary["dead_workers"] == [] and summary["hung_workers"] == []
    assert "died" not in done.stderr
