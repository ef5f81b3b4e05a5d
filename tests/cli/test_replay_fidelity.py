"""`simulate` replaying a `train` run's own trace gives the run's own mean iteration time
(issue 23): `train` exports every second it measures (compute in the trace's seconds, the rest
in its ``noncompute`` column), so the replay has nothing left to guess.

Both figures come from one real run and its replay of that run's record, so the comparison is
of bookkeeping, not of two timings on a loaded machine; ``bench/bench_replay.py`` measures the
same on ``seq-lstm`` with no injection."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tailtrain.cli import main

TIMES = ("rank_compute", "rank_injected", "rank_wait", "rank_comm", "rank_overhead")


def flags(strategy: str) -> list[str]:
    # injected sleeps (>= 20 ms apart) dominate the tiny model's compute on a loaded machine
    return [
        "--task", "logreg", "--strategy", strategy, "--workers", "2", "--micro-batches", "2",
        "--delay", "const:value=0.02+exp:rate=40", "--iterations", "30", "--seed", "0",
        "--no-progress",
    ]  # fmt: skip


@pytest.mark.timeout(240)
@pytest.mark.parametrize("strategy", ["sync", "dropcompute:drop-rate=0.1"])
def test_a_replay_of_a_runs_own_trace_gives_its_mean_iteration_time(
    strategy: str, tmp_path: Path, capsys
) -> None:
    real, sim = tmp_path / "real", tmp_path / "sim"
    assert main(["train", *flags(strategy), "--out", str(real)]) == 0
    rows = [json.loads(line) for line in (real / "steps.jsonl").read_text().splitlines()]
    exported = [v for row in rows for name in TIMES for v in row.get(name) or [] if v is not None]
    assert exported and min(exported) >= 0.0  # no exported time is negative
    trace = real / "trace.csv"
    assert "noncompute" in trace.open().readline()
    # its units are mostly injected sleeps, which a threshold cuts: the replay cuts them too
    machine = json.loads((real / "machine.jsonl").read_text().splitlines()[-1])
    assert machine["asleep"] > 0.9
    # the simulation draws its own noise: only the trace's recorded seconds enter it
    replay = [
        a if a != "const:value=0.02+exp:rate=40" else f"trace:path={trace}" for a in flags(strategy)
    ]
    replay[replay.index("logreg")] = "none"
    assert main(["simulate", *replay, "--out", str(sim)]) == 0
    capsys.readouterr()
    measured = json.loads((real / "summary.json").read_text())["mean_iteration_time"]
    replayed = json.loads((sim / "summary.json").read_text())["mean_iteration_time"]
    assert replayed == pytest.approx(measured, rel=0.03)
