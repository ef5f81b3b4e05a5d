"""A train run's folder (runtime.keep): records cut back to a checkpoint, drills noted once,
the launcher's one line."""

from __future__ import annotations

import json
import math

import pytest

from tailtrain.errors import UsageError
from tailtrain.faults import FaultPlan
from tailtrain.runtime.inject import FaultDrill
from tailtrain.runtime.keep import describe, fired_drills, head, reopen_records


def write_rows(path, rows, torn: str = ""):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + torn)


def test_records_are_cut_back_to_the_checkpoint_and_appended_to(tmp_path):
    write_rows(tmp_path / "steps.jsonl", [{"step": s, "loss": None} for s in range(5)])
    write_rows(tmp_path / "evals.jsonl", [{"step": 0}, {"step": 4}], torn='{"step": 8')
    sink, rows = reopen_records(tmp_path, {"steps": 3, "evals": 1}, None)
    assert [r["step"] for r in rows["steps"]] == [0, 1, 2]
    assert math.isnan(rows["steps"][0]["loss"])  # null read back as the NaN it was
    sink.write("steps", {"step": 3})
    sink.close()
    lines = (tmp_path / "steps.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [0, 1, 2, 3]
    assert (tmp_path / "evals.jsonl").read_text() == '{"step": 0}\n'


def test_a_step_row_rank_0_never_wrote_comes_from_the_checkpoint(tmp_path):
    write_rows(tmp_path / "steps.jsonl", [{"step": 0}])
    write_rows(tmp_path / "evals.jsonl", [])
    sink, rows = reopen_records(tmp_path, {"steps": 2, "evals": 0}, {"step": 1})
    sink.close()
    assert [r["step"] for r in rows["steps"]] == [0, 1]
    assert head(tmp_path / "steps.jsonl", 10)[0] == [{"step": 0}, {"step": 1}]


def test_records_shorter_than_the_checkpoint_are_refused(tmp_path):
    write_rows(tmp_path / "steps.jsonl", [{"step": 0}])
    write_rows(tmp_path / "evals.jsonl", [])
    with pytest.raises(UsageError, match="fewer rows"):
        reopen_records(tmp_path, {"steps": 3, "evals": 0}, {"step": 2})


def test_a_process_drill_fires_once_per_run_folder(tmp_path, monkeypatch):
    slept = []
    monkeypatch.setattr("tailtrain.runtime.inject.sleep", slept.append)
    plan = FaultPlan.parse(["freeze:worker=1,step=2,seconds=3"], workers=2)
    FaultDrill(plan, 1, tmp_path).before(2)
    assert slept == [3.0] and fired_drills(tmp_path) == {"freeze:worker=1,step=2,seconds=3"}
    FaultDrill(plan, 1, tmp_path).before(2)  # a restarted rank in the same folder
    FaultDrill(plan, 0, tmp_path).before(2)  # another worker
    assert slept == [3.0]
    FaultDrill(plan, 1).before(2)  # no folder: every run fires it
    assert slept == [3.0, 3.0]


def test_the_launchers_line_names_rank_step_and_checkpoint():
    note = {"step": 7, "missing": [1], "checkpoint": 7, "folder": "runs/a", "timeout": 5.0}
    line = describe(1, "Signal 9 (SIGKILL) received by PID 12", "SIGKILL", note)
    assert line == (
        "rank 1 died at step 7 (SIGKILL); checkpoint of step 6 in runs/a: "
        "continue with `tailtrain train --resume runs/a`"
    )
    hung = describe(0, "MissingRanks: rank 1 did not answer", None, note)
    assert hung.startswith("rank 1 hung at step 7: no answer within --timeout 5s;")
    nothing = describe(2, "InjectedFault: boom", None, {**note, "checkpoint": None})
    assert nothing.startswith("rank 2 failed at step 7: InjectedFault: boom; no step completed")
    assert describe(1, "Signal 9", "SIGKILL", None) == "rank 1 failed: Signal 9"
    no_folder = describe(1, "Signal 9", "SIGKILL", {**note, "folder": None})
    assert no_folder == "rank 1 died at step 7 (SIGKILL)"
