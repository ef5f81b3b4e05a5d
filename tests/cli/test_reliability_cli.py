"""The CLI keeps runs safe: --out is never written over silently, Ctrl-C keeps what
finished, bad numbers are dropped and counted, bad input is refused in one line."""

from __future__ import annotations

import contextlib
import json
import pickle

import pytest
from tests.cli.helpers import run

SIM = ["simulate", "--task", "logreg", "--workers", "4", "--iterations", "5", "--no-progress"]
CMP = [
    "compare",
    "--task",
    "logreg",
    "--workers",
    "4",
    "--iterations",
    "4",
    "--strategies",
    "sync,k-sync:k=2",
    "--seeds",
    "0,1",
    "--no-progress",
]


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_simulate_refuses_an_out_folder_holding_a_run(tmp_path, capsys):
    out = tmp_path / "run"
    assert run([*SIM, "--out", str(out)], capsys)[0] == 0
    before = (out / "steps.jsonl").read_bytes()
    code, _, err = run([*SIM, "--strategy", "k-sync:k=2", "--out", str(out)], capsys)
    line = one_line(err)
    assert code == 2 and f"--resume {out}" in line and "--overwrite" in line
    assert (out / "steps.jsonl").read_bytes() == before
    code, _, _ = run([*SIM, "--strategy", "k-sync:k=2", "--out", str(out), "--overwrite"], capsys)
    assert code == 0
    assert json.loads((out / "summary.json").read_text())["strategy"] == "k-sync:k=2"


def test_overwrite_keeps_the_old_run_when_the_new_input_is_bad(tmp_path, capsys):
    out = tmp_path / "run"
    assert run([*SIM, "--out", str(out)], capsys)[0] == 0
    code, _, err = run([*SIM, "--out", str(out), "--overwrite", "--partition", "nope"], capsys)
    assert code == 2 and "nope" in one_line(err)
    assert json.loads((out / "summary.json").read_text())["strategy"] == "sync"


def test_compare_refuses_an_out_folder_holding_a_comparison(tmp_path, capsys):
    out = tmp_path / "cmp"
    assert run([*CMP, "--out", str(out)], capsys)[0] == 0
    code, _, err = run([*CMP, "--seeds", "2", "--out", str(out)], capsys)
    assert code == 2 and "--overwrite" in one_line(err)
    assert run([*CMP, "--seeds", "2", "--out", str(out), "--overwrite"], capsys)[0] == 0
    seeds = {p.name for p in (out / "runs").glob("*/seed-*")}
    assert seeds == {"seed-2"}  # no mix of old and new seed folders


def interrupting(at: int):
    @contextlib.contextmanager
    def step_progress(scenario, label, enabled, runs=1):
        done = [0]

        def for_run(index):
            def progress(step, now):
                done[0] += 1
                if done[0] == at:
                    raise KeyboardInterrupt

            return progress

        yield for_run

    return step_progress


def test_compare_interrupted_keeps_finished_runs_and_a_partial_summary(
    tmp_path, capsys, monkeypatch
):
    out = tmp_path / "cmp"
    # 4 updates per run: the Ctrl-C comes in the third run (k-sync:k=2, seed 0)
    monkeypatch.setattr("tailtrain.cli.compare.step_progress", interrupting(at=10))
    code, _, err = run([*CMP, "--out", str(out)], capsys)
    assert code == 130
    line = one_line(err)
    assert "k-sync:k=2 seed 0" in line and "2 finished run(s)" in line
    summary = json.loads((out / "summary.json").read_text())
    assert summary["partial"] is True and summary["plot"] is None
    assert summary["interrupted"] == {"strategy": "k-sync:k=2", "seed": 0}
    assert [r["strategy"] for r in summary["results"]] == ["sync"]
    assert summary["results"][0]["seeds"] == 2
    for seed in (0, 1):
        kept = out / "runs" / "sync" / f"seed-{seed}"
        assert len((kept / "steps.jsonl").read_text().splitlines()) == 4
    assert not (out / "runs" / "k-sync_k_2").exists()


def test_simulate_interrupted_writes_what_it_has(tmp_path, capsys, monkeypatch):
    out = tmp_path / "run"
    monkeypatch.setattr("tailtrain.cli.simulate.step_progress", interrupting(at=3))
    code, _, err = run([*SIM, "--out", str(out)], capsys)
    assert code == 130 and "interrupted at update 3" in one_line(err)
    assert len((out / "steps.jsonl").read_text().splitlines()) == 3
    summary = json.loads((out / "summary.json").read_text())
    assert summary["partial"] is True and summary["iterations"] == 3


def test_nan_fault_is_dropped_and_counted(tmp_path, capsys):
    out = tmp_path / "run"
    argv = [*SIM, "--out", str(out), "--json", "--inject-fault", "nan:worker=2,step=3"]
    code, stdout, _ = run(argv, capsys)
    assert code == 0
    summary = json.loads(stdout)
    assert summary["nonfinite"] == 1 and summary["injected_faults"] == ["nan:worker=2,step=3"]
    assert summary["final_loss"] is not None  # the model stayed finite
    rows = [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines()]
    assert [row.get("nonfinite", 0) for row in rows] == [0, 0, 0, 1, 0]
    assert 2 not in rows[3]["workers"] and len(rows[3]["workers"]) == 3


def test_nan_fault_under_raise_stops_with_exit_3(tmp_path, capsys):
    argv = [*SIM, "--out", str(tmp_path / "r"), "--inject-fault", "inf:worker=1,step=2"]
    code, _, err = run([*argv, "--on-nonfinite", "raise"], capsys)
    line = one_line(err)
    assert code == 3 and "worker 1" in line and "update 2" in line
    assert json.loads((tmp_path / "r" / "summary.json").read_text())["partial"] is True


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--workers", "4", "simulate"], "put it after the command"),
        (["simulate", "--seeds", "0,1"], "--seeds is an option of compare, not of simulate"),
        (["simulate", "collectives", "--workers", "3"], "not of simulate collectives"),
        (["predict", "--workers", "3", "--delay", "exp:rate=1", "--out", "x"], "not of predict"),
        ([*CMP, "--seeds", "1,2,1"], "seed 1 twice"),
        ([*SIM, "--target-loss", "-0.5"], "--target-loss"),
        ([*SIM, "--workers", "10000000"], "too many"),
        (["simulate", "--task", "none", "--workers", "6000000", "--iterations", "1"], "GiB"),
        ([*SIM, "--time-budget", "100", "--iterations", "2"], "--iterations"),
        (["simulate", "--task", "none", "--time-budget", "1000", "--eval-interval", "1e-9"], "1e"),
        ([*SIM, "--checkpoint-every", "2"], "needs --out"),
        ([*SIM, "--inject-fault", "nan:worker=9,step=1"], "worker 9"),
        ([*SIM, "--inject-fault", "boom:worker=1,step=1"], "boom"),
        (["simulate", "--task", "none", "--inject-fault", "nan:worker=0,step=0"], "--task none"),
        (["simulate", "--resume", "/nonexistent/run"], "--resume"),
        (["simulate", "collectives", "--procs", "99999999999"], "GiB"),
        (["predict", "--workers", "99999999999", "--delay", "exp:rate=1"], "GiB"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(argv, needle, capsys):
    code, _, err = run(argv, capsys)
    assert code == 2 and needle in one_line(err)


def test_a_malicious_cifar_pickle_is_refused_and_never_runs(tmp_path, capsys):
    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return (exec, (f"open({str(marker)!r}, 'w').write('x')",))

    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        (tmp_path / name).write_bytes(pickle.dumps({b"data": Payload()}))
    argv = ["simulate", "--task", "cifar10", "--data", str(tmp_path), "--iterations", "1"]
    code, _, err = run(argv, capsys)
    assert code == 2 and "refusing to load" in one_line(err)
    assert not marker.exists()


def test_a_screened_gradient_is_no_contribution_of_an_eager_round(tmp_path, capsys):
    out = tmp_path / "run"
    argv = [*SIM, "--strategy", "eager:mode=majority", "--out", str(out)]
    code, _, _ = run([*argv, "--inject-fault", "nan:worker=1,step=1"], capsys)
    assert code == 0
    rows = [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines()]
    hit = [row for row in rows if row.get("nonfinite")]
    assert len(hit) == 1 and 1 not in hit[0]["workers"]
    assert len(hit[0]["workers"]) == len(hit[0]["staleness"])
