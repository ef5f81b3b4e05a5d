"""`tailtrain simulate` and `compare` from the command line: outputs and one-line errors."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from tests.cli.helpers import run

from tailtrain.cli import main


def test_simulate_writes_a_record_pandas_reads(tmp_path, capsys):
    argv = [
        "simulate",
        "--task",
        "logreg",
        "--workers",
        "4",
        "--strategy",
        "k-sync:k=2",
        "--iterations",
        "6",
        "--eval-every",
        "3",
        "--out",
        str(tmp_path),
        "--json",
    ]
    code, out, _ = run(argv, capsys)
    assert code == 0
    summary = json.loads(out)
    assert summary["strategy"] == "k-sync:k=2" and summary["iterations"] == 6
    steps = pd.read_json(tmp_path / "steps.jsonl", lines=True)
    assert len(steps) == 6 and (steps["k"] == 2).all()
    assert steps["workers"].map(len).eq(2).all()
    assert len(pd.read_json(tmp_path / "evals.jsonl", lines=True)) == 3


def test_compare_writes_plot_and_summary(tmp_path, capsys):
    argv = [
        "compare",
        "--task",
        "logreg",
        "--workers",
        "4",
        "--strategies",
        "sync,k-sync:k=2",
        "--seeds",
        "0,1",
        "--iterations",
        "4",
        "--out",
        str(tmp_path),
        "--json",
    ]
    code, out, _ = run(argv, capsys)
    assert code == 0
    rows = json.loads(out)["results"]
    assert [r["strategy"] for r in rows] == ["sync", "k-sync:k=2"]
    assert (tmp_path / "compare.png").stat().st_size > 0
    assert (tmp_path / "runs" / "sync" / "seed-1" / "steps.jsonl").exists()


BAD = [
    (["simulate", "--task", "logreg", "--time-budget", "3", "--delay", "const:value=0"], "no time"),
    (["simulate", "--task", "logreg", "--time-budget", "inf"], "--time-budget"),
    (["simulate", "--task", "logreg", "--iterations", "2", "--seed", "-1"], "seed"),
    (
        ["simulate", "--task", "logreg", "--iterations", "2", "--seed", "99999999999999999999"],
        "seed",
    ),
    (["simulate", "--task", "logreg", "--iterations", "2", "--lr", "inf"], "--lr"),
    (
        ["simulate", "--task", "logreg", "--iterations", "2", "--target-loss", "nan"],
        "--target-loss",
    ),
    (["simulate", "--task", "logreg", "--iterations", "2", "--comm-time", "-1"], "--comm-time"),
    (["simulate", "--task", "logreg", "--iterations", "2", "--strategy", "k-sync:k=99"], "k=99"),
    (["simulate", "--task", "nope", "--iterations", "2"], "nope"),
    (["simulate", "--task", "mnist", "--iterations", "2"], "--data"),
    (
        ["simulate", "--task", "logreg", "--iterations", "2", "--partition", "noniid:classes=20"],
        "classes",
    ),
    (["compare", "--task", "logreg", "--iterations", "2", "--strategies", ","], "empty"),
    (["compare", "--task", "logreg", "--iterations", "2", "--strategies", "sync,sync"], "twice"),
    (["compare", "--task", "logreg", "--iterations", "2", "--seeds", "0,x"], "--seeds"),
]


@pytest.mark.parametrize(("argv", "needle"), BAD)
def test_bad_input_is_one_line_and_exit_2(argv, needle, capsys, tmp_path):
    argv = [*argv, "--out", str(tmp_path / "out")]
    with pytest.raises(SystemExit) as exc:
        raise SystemExit(main(argv))
    _, err = capsys.readouterr()
    assert exc.value.code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in err
