"""What `simulate` and `compare` show a reader: where files went, table headers and widths, and
the TensorBoard events of `simulate --tensorboard`."""

from __future__ import annotations

import json
import sys

import pytest
from tests.cli.helpers import run

SMALL = ["--task", "logreg", "--workers", "4", "--iterations", "6", "--eval-every", "3"]


def test_simulate_says_where_it_wrote_records_and_figure(tmp_path, capsys):
    code, out, _ = run(["simulate", *SMALL, "--out", str(tmp_path), "--no-progress"], capsys)
    assert code == 0
    assert f"records: {tmp_path}/steps.jsonl, evals.jsonl, summary.json" in out.splitlines()
    assert (tmp_path / "simulate.png").stat().st_size > 0
    assert "virtual seconds" in out


def test_simulate_json_keeps_stdout_pure_json(tmp_path, capsys):
    code, out, err = run(["simulate", *SMALL, "--out", str(tmp_path), "--json"], capsys)
    assert code == 0
    assert json.loads(out)["iterations"] == 6
    assert "records: " in err


STRATEGIES = "sync,dbw:window=5,beta=1.01,adasync:base=k-sync,k0=2,interval=20,lgc:k=3,blocks=2"


def cells(lines: list[str], edge: str) -> list[str]:
    """The text of each column of a rich table over the lines starting with ``edge``."""
    rows = [line.strip(edge).split(edge) for line in lines if line.startswith(edge)]
    return [" ".join(" ".join(column).split()) for column in zip(*rows, strict=True)]


@pytest.mark.parametrize("columns", [80, 200])
def test_compare_table_fits_the_terminal_and_names_its_units(
    columns, tmp_path, capsys, monkeypatch
):
    monkeypatch.setenv("COLUMNS", str(columns))
    argv = ["compare", *SMALL, "--strategies", STRATEGIES, "--seeds", "0,1", "--target-loss", "1"]
    code, out, _ = run([*argv, "--out", str(tmp_path), "--no-progress"], capsys)
    assert code == 0
    table = [line for line in out.splitlines() if not line.startswith(("plot:", "summary:"))]
    assert max(len(line) for line in table) <= columns
    assert "…" not in out  # nothing cut off
    headers = cells(table, "┃")
    assert "final test accuracy" in headers and "time to train loss 1 (s)" in headers
    assert "virtual seconds" in " ".join(out.split())
    # every spec survives whole, wrapped only after its colons and commas
    names = cells(table, "│")[0].replace(": ", ":").replace(", ", ",").split()
    assert names == [
        "sync",
        "dbw:window=5,beta=1.01",
        "adasync:base=k-sync,k0=2,interval=20",
        "lgc:k=3,blocks=2",
    ]


def test_compare_names_mse_for_a_regression_task(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    argv = ["compare", "--task", "hyperplane:dim=4", "--workers", "4", "--iterations", "3"]
    code, out, _ = run(
        [*argv, "--strategies", "sync", "--seeds", "0", "--out", str(tmp_path)], capsys
    )
    assert code == 0 and "final test MSE" in out


def test_tensorboard_events_hold_the_records_scalars(tmp_path, capsys):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    board = tmp_path / "tb"
    argv = ["simulate", *SMALL, "--strategy", "k-sync:k=2", "--out", str(tmp_path / "run")]
    code, out, _ = run([*argv, "--tensorboard", str(board), "--no-progress"], capsys)
    assert code == 0 and f"tensorboard: {board}" in out
    steps = [json.loads(line) for line in (tmp_path / "run" / "steps.jsonl").open()]
    evals = [json.loads(line) for line in (tmp_path / "run" / "evals.jsonl").open()]
    events = EventAccumulator(str(board))
    events.Reload()
    k = events.Scalars("strategy/k")
    assert [e.step for e in k] == [row["step"] + 1 for row in steps]
    assert [e.value for e in k] == [2.0] * len(steps)
    assert [e.wall_time for e in k] == pytest.approx([row["time"] for row in steps])
    loss = events.Scalars("train/minibatch_loss")
    assert [e.value for e in loss] == pytest.approx([row["loss"] for row in steps], rel=1e-6)
    gaps = [b["time"] - a["time"] for a, b in zip([{"time": 0.0}, *steps], steps, strict=False)]
    assert [e.value for e in events.Scalars("time/iteration")] == pytest.approx(gaps, rel=1e-6)
    accuracy = events.Scalars("eval/test_accuracy")
    assert [(e.step, e.value) for e in accuracy] == [
        (row["step"], pytest.approx(row["eval"], rel=1e-6)) for row in evals
    ]


def test_tensorboard_missing_is_one_line_and_exit_2(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import fails
    argv = ["simulate", *SMALL, "--tensorboard", str(tmp_path / "tb")]
    code, out, err = run(argv, capsys)
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "pip install tailtrain[tensorboard]" in lines[0]
    assert not (tmp_path / "tb").exists()  # failed before the run, nothing written
