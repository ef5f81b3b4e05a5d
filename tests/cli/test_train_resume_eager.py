"""`tailtrain train` keeps, resumes and restarts partial-collective (eager) runs.

A killed eager rank stops the job with one line naming the rank and the round in flight; the
survivors checkpoint the last round every reducer completed (``runtime.partial.rounds``). The
references are uninterrupted runs of the same flags:

* with ``staleness-bound=1`` every round is a synchronous allreduce: every rank is active in
  every round, adopts every result and leaves nothing buffered, so the agreed model is every
  rank's and a resumed run ends with the uninterrupted run's losses (float tolerance);
* with ``mode=majority`` a rank that is late skips rounds and buffers a stale gradient, and
  which rank is late depends on the machine's timing, so two uninterrupted runs differ too.
  A resume loses the buffered gradients (at most one per rank, each 1/P of a round's step) and
  the late ranks' private drift, less than a round's progress: the resumed final loss is
  within two rounds' mean loss decrease of the uninterrupted one.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from tests.cli.helpers import run

from tailtrain.cli import main

ROUNDS = 12
BASE = [
    "train", "--task", "logreg", "--iterations", str(ROUNDS), "--eval-every", "100",
    "--seed", "2", "--timeout", "30",
]  # fmt: skip
MAJORITY = [*BASE, "--workers", "3", "--strategy", "eager:mode=majority"]
SYNCHRONOUS = [*BASE, "--workers", "3", "--strategy", "eager:mode=majority,staleness-bound=1"]
LINE = re.compile(
    r"tailtrain train: rank 1 died at step (\d+) \(SIGKILL\); checkpoint of step (\d+) in "
    r"(\S+): continue with `tailtrain train --resume (\S+)`"
)


def steps_of(folder):
    return [json.loads(line) for line in (folder / "steps.jsonl").read_text().splitlines()]


def summary_of(folder):
    return json.loads((folder / "summary.json").read_text())


def uninterrupted(tmp_path_factory, argv):
    folder = tmp_path_factory.mktemp("reference") / "run"
    assert main([*argv, "--out", str(folder)]) == 0
    return folder


@pytest.fixture(scope="module")
def majority(tmp_path_factory):
    return uninterrupted(tmp_path_factory, MAJORITY)


@pytest.fixture(scope="module")
def synchronous(tmp_path_factory):
    return uninterrupted(tmp_path_factory, SYNCHRONOUS)


def assert_complete(folder):
    """Every round once, in order; the final evaluation after the last; no checkpoint left."""
    assert [row["step"] for row in steps_of(folder)] == list(range(ROUNDS))
    evals = [json.loads(line) for line in (folder / "evals.jsonl").read_text().splitlines()]
    assert [row["step"] for row in evals] == [0, ROUNDS]
    assert summary_of(folder)["iterations"] == ROUNDS
    assert not (folder / "checkpoint.pt").exists()


@pytest.mark.timeout(240)
def test_a_killed_eager_rank_is_named_with_its_round_and_resume_completes_it(
    tmp_path, capfd, majority
):
    folder = tmp_path / "run"
    argv = [*MAJORITY, "--out", str(folder), "--checkpoint-every", "3"]
    code, out, err = run([*argv, "--inject-fault", "kill:worker=1,step=6"], capfd)
    lines = [line for line in err.strip().splitlines() if line.startswith("tailtrain train")]
    assert code == 1 and out == "" and len(lines) == 1, err
    match = LINE.fullmatch(lines[0])
    assert match, lines[0]
    in_flight, saved = int(match[1]), int(match[2])
    # rank 1 dies as it starts its round 6; a late rank 1 starts it after the group's round 6
    assert in_flight >= 6 and saved == in_flight - 1, lines[0]
    assert match[3] == match[4] == str(folder)
    # every round the checkpoint counts is on disk, none lost but the one in flight; rank 0's
    # reducer may not have written the writer's latest round yet (runtime.keep's sink)
    rows = [row["step"] for row in steps_of(folder)]
    assert rows == list(range(len(rows))) and saved <= len(rows) <= in_flight, (rows, lines[0])
    code, out, err = run(["train", "--resume", str(folder), "--json"], capfd)
    assert code == 0, err
    assert_complete(folder)
    reference = summary_of(majority)
    steps = steps_of(majority)
    first = json.loads((majority / "evals.jsonl").read_text().splitlines()[0])["train_loss"]
    per_round = (first - reference["final_loss"]) / len(steps)
    assert per_round > 0
    assert abs(json.loads(out)["final_loss"] - reference["final_loss"]) <= 2 * per_round


@pytest.mark.timeout(240)
def test_with_max_restarts_an_eager_run_completes_by_itself(tmp_path, capfd):
    folder = tmp_path / "run"
    argv = [*BASE, "--workers", "4", "--strategy", "eager:mode=majority", "--out", str(folder)]
    argv += ["--max-restarts", "1", "--checkpoint-every", "1"]
    code, _, err = run([*argv, "--inject-fault", "kill:worker=2,step=5"], capfd)
    assert code == 0, err
    assert_complete(folder)
    fired = (folder / "drills.jsonl").read_text().splitlines()
    assert [json.loads(line)["fault"] for line in fired] == ["kill:worker=2,step=5"]


@pytest.mark.timeout(240)
def test_a_resumed_run_of_synchronous_rounds_ends_as_the_uninterrupted_one(
    tmp_path, capfd, synchronous
):
    folder = tmp_path / "run"
    argv = [*SYNCHRONOUS, "--out", str(folder), "--max-restarts", "1"]
    code, out, err = run([*argv, "--inject-fault", "kill:worker=1,step=7", "--json"], capfd)
    assert code == 0, err
    assert_complete(folder)
    # the kill fired and the group restarted once, or the comparison below proves nothing
    fired = (folder / "drills.jsonl").read_text().splitlines()
    assert [json.loads(line)["fault"] for line in fired] == ["kill:worker=1,step=7"]
    assert len((folder / "failures.jsonl").read_text().splitlines()) == 1
    got, want = steps_of(folder), steps_of(synchronous)
    assert all(row["nap"] == 3 for row in got + want)  # every rank fresh in every round
    np.testing.assert_allclose([r["loss"] for r in got], [r["loss"] for r in want], rtol=1e-5)
    assert json.loads(out)["final_loss"] == pytest.approx(
        summary_of(synchronous)["final_loss"], rel=1e-5
    )
