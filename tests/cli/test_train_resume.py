"""`tailtrain train` survives dead and hung ranks: one line naming rank and step, a checkpoint of
the last completed step, --resume and --max-restarts completing the run as if uninterrupted.

The reference is the same run never interrupted: sync SGD without injected delays is the same
computation on every launch, so the resumed run must end with its losses (float tolerance).
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from tests.cli.helpers import run

from tailtrain.cli import main

ITERATIONS = 8
RUN = [
    "train", "--task", "logreg", "--workers", "3", "--iterations", str(ITERATIONS),
    "--eval-every", "4", "--seed", "2", "--timeout", "30",
]  # fmt: skip


def records(folder):
    steps = pd.read_json(folder / "steps.jsonl", lines=True)
    evals = pd.read_json(folder / "evals.jsonl", lines=True)
    return steps, evals


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    folder = tmp_path_factory.mktemp("reference") / "run"
    code = main([*RUN, "--out", str(folder), "--json"])
    assert code == 0
    return folder


def assert_same_run(folder, reference):
    steps, evals = records(folder)
    ref_steps, ref_evals = records(reference)
    assert steps["step"].tolist() == list(range(ITERATIONS))  # each step once, in order
    np.testing.assert_allclose(steps["loss"], ref_steps["loss"], rtol=1e-5)
    assert evals["step"].tolist() == ref_evals["step"].tolist()
    np.testing.assert_allclose(evals["train_loss"], ref_evals["train_loss"], rtol=1e-5)
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["iterations"] == ITERATIONS
    assert not (folder / "checkpoint.pt").exists()  # a finished run keeps none


@pytest.mark.timeout(240)
def test_a_killed_rank_is_named_with_its_step_and_resume_completes_the_run(
    tmp_path, capfd, reference
):
    folder = tmp_path / "run"
    argv = [*RUN, "--out", str(folder), "--checkpoint-every", "3"]
    code, out, err = run([*argv, "--inject-fault", "kill:worker=1,step=5"], capfd)
    lines = [line for line in err.strip().splitlines() if line.startswith("tailtrain train")]
    assert code == 1 and out == "" and len(lines) == 1, err
    # the periodic checkpoint was of step 2; the survivors wrote one of step 4
    assert lines[0] == (
        f"tailtrain train: rank 1 died at step 5 (SIGKILL); checkpoint of step 4 in {folder}: "
        f"continue with `tailtrain train --resume {folder}`"
    )
    steps, _ = records(folder)
    assert steps["step"].tolist() == list(range(5))  # every completed round is on disk
    code, out, err = run(["train", "--resume", str(folder), "--json"], capfd)
    assert code == 0, err
    assert_same_run(folder, reference)
    assert json.loads(out)["final_loss"] == pytest.approx(
        json.loads((reference / "summary.json").read_text())["final_loss"], rel=1e-5
    )


@pytest.mark.timeout(240)
def test_with_max_restarts_the_run_completes_by_itself(tmp_path, capfd, reference):
    folder = tmp_path / "run"
    argv = [*RUN, "--out", str(folder), "--max-restarts", "1"]
    code, _, err = run([*argv, "--inject-fault", "kill:worker=2,step=3"], capfd)
    assert code == 0, err
    assert_same_run(folder, reference)
    fired = (folder / "drills.jsonl").read_text().splitlines()
    assert [json.loads(line)["fault"] for line in fired] == ["kill:worker=2,step=3"]


@pytest.mark.timeout(120)
def test_a_frozen_rank_is_named_once_the_collectives_time_out(capfd):
    argv = ["train", "--task", "logreg", "--workers", "2", "--iterations", "5", "--timeout", "3"]
    code, out, err = run([*argv, "--inject-fault", "freeze:worker=1,step=2,seconds=60"], capfd)
    lines = [line for line in err.strip().splitlines() if line.startswith("tailtrain train")]
    assert code == 1 and out == "", err
    assert lines == ["tailtrain train: rank 1 hung at step 2: no answer within --timeout 3s"]


@pytest.mark.timeout(240)
def test_a_frozen_rank_of_three_leaves_a_checkpoint_and_one_failure_row(tmp_path, capfd):
    """The survivors' census ends at different times; the agent stops the slower one, which
    may be the writer, as soon as the first raises: the writer ignores that SIGTERM."""
    folder = tmp_path / "run"
    argv = ["train", "--task", "logreg", "--workers", "3", "--iterations", "6", "--timeout", "3"]
    argv += ["--out", str(folder), "--inject-fault", "freeze:worker=2,step=3,seconds=60"]
    code, out, err = run(argv, capfd)
    lines = [line for line in err.strip().splitlines() if line.startswith("tailtrain train")]
    assert code == 1 and out == "", err
    assert lines == [
        "tailtrain train: rank 2 hung at step 3: no answer within --timeout 3s; checkpoint of "
        f"step 2 in {folder}: continue with `tailtrain train --resume {folder}`"
    ], err
    assert (folder / "checkpoint.pt").exists()
    rows = [json.loads(line) for line in (folder / "failures.jsonl").read_text().splitlines()]
    assert [(r["step"], r["missing"], r["checkpoint"]) for r in rows] == [(3, [2], 3)]
    steps, _ = records(folder)
    assert steps["step"].tolist() == [0, 1, 2]  # every completed round is on disk


@pytest.mark.timeout(120)
@pytest.mark.parametrize("strategy", ["sync", "eager:mode=majority"])
def test_a_nan_gradient_is_excluded_and_counted(tmp_path, capfd, strategy):
    folder = tmp_path / "run"
    argv = ["train", "--task", "logreg", "--workers", "2", "--iterations", "4"]
    argv += ["--strategy", strategy, "--out", str(folder), "--json"]
    code, out, err = run([*argv, "--inject-fault", "nan:worker=1,step=1"], capfd)
    assert code == 0, err
    assert json.loads(out)["nonfinite"] == 1
    steps, evals = records(folder)
    counted = steps["nonfinite"].fillna(0).astype(int).tolist()
    if strategy == "sync":
        assert counted == [0, 1, 0, 0]
        assert steps["workers"].tolist() == [[0, 1], [0], [0, 1], [0, 1]]  # screened out
    else:  # a late rank's gradient of its step 1 is reduced in the round it reaches: 1 or 2
        assert sum(counted) == 1 and counted.index(1) in (1, 2), counted
        # a round's workers are the gradients summed: its arrivals less the screened one
        summed = (steps["arrivals"] - steps["nonfinite"].fillna(0)).astype(int).tolist()
        assert steps["workers"].map(len).tolist() == summed
    assert np.isfinite(evals["train_loss"]).all()  # the NaN never reached the model


BAD = {
    "checkpoint every 0": (["--out", "{tmp}/a", "--checkpoint-every", "0"], "--checkpoint-every"),
    "restarts without out": (["--max-restarts", "1"], "needs --out"),
    "checkpoints without out": (["--checkpoint-every", "2"], "needs --out"),
    "negative restarts": (["--out", "{tmp}/a", "--max-restarts", "-1"], "--max-restarts"),
    "resume of no folder": (["--resume", "{tmp}/none"], "not a folder"),
    "resume of a folder with no run": (["--resume", "{tmp}"], "holds no run.json"),
    "overwrite without out": (["--overwrite"], "--overwrite needs --out"),
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", BAD)
def test_bad_run_flags_are_one_line_and_exit_2(name, tmp_path, capfd):
    flags, needle = BAD[name]
    flags = [f.replace("{tmp}", str(tmp_path)) for f in flags]
    base = [] if name.startswith("resume") else ["--task", "logreg", "--workers", "2"]
    code, out, err = run(["train", *base, *flags], capfd)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and needle in err, err


@pytest.mark.timeout(60)
def test_resume_refuses_other_flags_and_a_finished_run_and_out_is_never_overwritten(
    reference, capfd
):
    code, _, err = run(["train", "--resume", str(reference), "--strategy", "dropcompute"], capfd)
    assert code == 2 and "drop --strategy" in err, err
    code, _, err = run(["train", "--resume", str(reference)], capfd)
    assert code == 2 and "finished" in err, err
    code, _, err = run([*RUN, "--out", str(reference)], capfd)
    assert code == 2 and "already holds a run" in err, err
