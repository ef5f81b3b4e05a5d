"""The partial collective's rank loop (runtime.partial.rounds): what a rank's steps export, and
a gradient screened out on a rank reaching every rank's row as such."""

from __future__ import annotations

import json

import pytest
from tests.cli.helpers import run


@pytest.mark.timeout(120)
def test_train_exports_every_second_of_a_ranks_steps(tmp_path, capfd):
    """Partial collective (eager-SGD, solo): every rank's every step (a job: compute, call,
    adopt) in five parts >= 0 that sum to its wall seconds (rank-steps.jsonl), the summary's
    means of them, and each job's noncompute in the trace: its step less its unit (issue 23)."""
    from tests.cli.helpers import trained_time_parts

    injected, means = trained_time_parts("eager:mode=solo", tmp_path / "run", capfd, [0, 1, 2])
    assert (injected > 0).all()  # the injected sleeps are measured as such
    assert means[1] == pytest.approx(injected.mean())


@pytest.mark.timeout(120)
def test_a_screened_gradient_is_counted_and_left_out_of_its_round(tmp_path, capfd):
    """Rank 1's gradient of round 1 is poisoned: its ``screened`` flag (not its loss) travels
    in the round's slot, so round 1's row counts it in ``nonfinite`` and leaves rank 1 out of
    ``workers``; every round is synchronous (staleness bound 1), so no other row changes."""
    out = tmp_path / "run"
    argv = ["train", "--task", "logreg", "--workers", "2", "--iterations", "4", "--no-progress"]
    argv += ["--strategy", "eager:mode=quorum,staleness-bound=1", "--out", str(out)]
    code, _, err = run([*argv, "--inject-fault", "nan:worker=1,step=1"], capfd)
    assert code == 0, err
    rows = [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines()]
    assert [row.get("nonfinite", 0) for row in rows] == [0, 1, 0, 0]
    assert [sorted(row["workers"]) for row in rows] == [[0, 1], [0], [0, 1], [0, 1]]
    assert rows[1]["nap"] == 2 and rows[1]["arrivals"] == 2  # it arrived; it was not used
