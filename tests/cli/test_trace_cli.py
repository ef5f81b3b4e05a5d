"""`predict` and `simulate` on a trace with a persistent straggler: per-worker replay keeps it,
pooled sampling warns, and a trace with fewer workers than the scenario says how they map."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tailtrain.cli import main


def straggler_trace(tmp_path: Path, workers: int = 4) -> Path:
    """Worker 0 always takes 5 s, the others U(1, 3) s, so every sync iteration takes 5 s."""
    rng = np.random.default_rng(2)
    lines = ["iteration,worker,seconds"]
    for i in range(40):
        lines += [f"{i},{w},{5.0 if w == 0 else rng.uniform(1, 3)!r}" for w in range(workers)]
    path = tmp_path / "straggler.csv"
    path.write_text("\n".join(lines) + "\n")
    return path


def run_json(argv: list[str], capsys: pytest.CaptureFixture[str]) -> dict:
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def predict(delay: str, workers: int, capsys) -> dict:
    argv = ["predict", "--workers", str(workers), "--delay", delay, "--k", "1", "--json"]
    return run_json(argv, capsys)


def simulate(delay: str, workers: int, capsys) -> dict:
    argv = ["simulate", "--task", "none", "--workers", str(workers), "--delay", delay]
    return run_json([*argv, "--iterations", "100", "--json", "--no-progress"], capsys)


def sync_time(prediction: dict) -> float:
    return next(r["iteration_time"] for r in prediction["results"] if r["strategy"] == "sync")


def trace_notes(prediction: dict) -> list[str]:
    """The prediction's notes about its trace, without the rebalance row's own."""
    return [n for n in prediction["notes"] if not n.startswith("rebalance:")]


def test_per_worker_replay_keeps_the_straggler(tmp_path, capsys) -> None:
    delay = f"trace:path={straggler_trace(tmp_path)}"
    prediction = predict(delay, 4, capsys)
    assert sync_time(prediction) == pytest.approx(5.0, abs=1e-12)
    assert trace_notes(prediction) == []
    summary = simulate(delay, 4, capsys)
    assert summary["mean_iteration_time"] == pytest.approx(5.0, abs=1e-12)
    assert "trace_warning" not in summary and "trace_mapping" not in summary


def test_pooled_sampling_warns_that_it_loses_the_straggler(tmp_path, capsys, caplog) -> None:
    delay = f"trace:path={straggler_trace(tmp_path)},sampling=pooled"
    prediction = predict(delay, 4, capsys)
    assert sync_time(prediction) < 4.6  # E[max of 4 pooled draws] is about 4.2 s
    (note,) = trace_notes(prediction)
    assert "persistent per-worker differences" in note and "sampling=pooled" in note
    assert any("persistent per-worker" in r.getMessage() for r in caplog.records)
    summary = simulate(delay, 4, capsys)
    assert summary["mean_iteration_time"] < 4.6
    assert "persistent per-worker differences" in summary["trace_warning"]


def test_more_workers_than_the_trace_say_how_they_map(tmp_path, capsys) -> None:
    delay = f"trace:path={straggler_trace(tmp_path, workers=2)}"
    prediction = predict(delay, 6, capsys)  # workers 0, 2, 4 replay the straggler
    assert sync_time(prediction) == pytest.approx(5.0, abs=1e-12)
    assert any("worker w replays trace worker w mod 2" in n for n in prediction["notes"])
    summary = simulate(delay, 6, capsys)
    assert "worker w replays trace worker w mod 2" in summary["trace_mapping"]
    assert summary["mean_iteration_time"] == pytest.approx(5.0, abs=1e-12)


def charged_trace(tmp_path: Path) -> Path:
    """The straggler trace with each round's noncompute seconds, as ``train`` records them:
    1 s for the slowest worker (so T^c = 1 s and every round takes 6 s), more for the others."""
    rows = straggler_trace(tmp_path).read_text().splitlines()
    lines = [rows[0] + ",noncompute"]
    for row in rows[1:]:
        _, worker, seconds = row.split(",")
        lines.append(f"{row},{1.0 if worker == '0' else 6.0 - float(seconds)!r}")
    path = tmp_path / "charged.csv"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_replay_charges_the_recorded_noncompute_seconds_unless_told_otherwise(
    tmp_path, capsys
) -> None:
    delay = f"trace:path={charged_trace(tmp_path)}"
    prediction = predict(delay, 4, capsys)
    assert sync_time(prediction) == pytest.approx(6.0, abs=1e-12)
    (note,) = trace_notes(prediction)
    assert note.startswith("T^c replayed from the trace: its 40 rounds'")
    assert simulate(delay, 4, capsys)["mean_iteration_time"] == pytest.approx(6.0, abs=1e-12)
    argv = ["simulate", "--task", "none", "--workers", "4", "--delay", delay, "--no-progress"]
    assert main([*argv, "--iterations", "10"]) == 0
    assert "T^c replayed from the trace" in capsys.readouterr().out
    assert main([*argv, "--iterations", "10", "--comm-time", "0.5", "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["mean_iteration_time"] == pytest.approx(5.5, abs=1e-12)
    assert "T^c from --comm-time 0.5 in place of the trace's recorded" in captured.err


def test_compare_charges_the_recorded_noncompute_seconds_as_simulate_does(tmp_path, capsys) -> None:
    # the same trace's sync took 6.0 s a round in simulate; compare once priced it at 5.0
    delay = f"trace:path={charged_trace(tmp_path)}"
    argv = ["compare", "--task", "none", "--workers", "4", "--delay", delay, "--iterations"]
    argv += ["10", "--strategies", "sync", "--seeds", "0", "--no-progress"]
    summary = run_json([*argv, "--json", "--out", str(tmp_path / "c")], capsys)
    (row,) = summary["results"]
    assert row["mean_iteration_time"] == pytest.approx(6.0, abs=1e-12)
