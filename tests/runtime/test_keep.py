"""A train run's folder (runtime.keep): records cut back to a checkpoint, the failure census,
the launcher's one line."""

from __future__ import annotations

import json
import math
import os
import signal
import time

import pytest
import torch
import torch.distributed as dist

from tailtrain.core import checkpoint
from tailtrain.core.session import RunKeeper
from tailtrain.errors import UsageError
from tailtrain.runtime import interrupt, keep
from tailtrain.runtime.interrupt import stop_on_sigterm
from tailtrain.runtime.keep import (
    Keeper,
    MissingRanks,
    Snapshot,
    describe,
    head,
    read_note,
    reopen_records,
)
from tailtrain.runtime.reduce import PeerFailure


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


def test_the_launchers_line_names_rank_step_and_checkpoint(tmp_path):
    (tmp_path / "run.json").write_text("{}")  # the command line's run: --resume reads it
    note = {"step": 7, "missing": [1], "checkpoint": 7, "folder": str(tmp_path), "timeout": 5.0}
    line = describe(1, "Signal 9 (SIGKILL) received by PID 12", "SIGKILL", note)
    assert line == (
        f"rank 1 died at step 7 (SIGKILL); checkpoint of step 6 in {tmp_path}: "
        f"continue with `tailtrain train --resume {tmp_path}`"
    )
    library = describe(1, "Signal 9", "SIGKILL", {**note, "folder": str(tmp_path / "lib")})
    assert library.endswith("(a library run: no run.json for --resume)")  # no false promise
    hung = describe(0, "MissingRanks: rank 1 did not answer", None, note)
    assert hung.startswith("rank 1 hung at step 7: no answer within --timeout 5s;")
    nothing = describe(2, "InjectedFault: boom", None, {**note, "checkpoint": None})
    assert nothing.startswith("rank 2 failed at step 7: InjectedFault: boom; no step completed")
    assert describe(1, "Signal 9", "SIGKILL", None) == "rank 1 failed: Signal 9"
    no_folder = describe(1, "Signal 9", "SIGKILL", {**note, "folder": None})
    assert no_folder == "rank 1 died at step 7 (SIGKILL)"


# ---- the failure census (Keeper.failed) --------------------------------------------------------
def keeper(folder, rank, report=None):
    kept = Keeper(RunKeeper({"strategy": "sync"}, folder=folder), rank, 3, report)
    kept.snapshot = Snapshot(3, {"theta": torch.arange(4.0)})
    return kept


def test_a_sigterm_during_the_census_does_not_stop_the_writer(tmp_path, monkeypatch, sigterm):
    """The first survivor to end its census makes the agent SIGTERM the others, the writer
    among them: it must still write the checkpoint, the note and the failure row."""
    store = dist.HashStore()

    def census(store, step, rank, world, wait):  # the agent's SIGTERM arrives mid-census
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)  # the handler runs here, in the main thread
        return {0: 3, 1: 3}

    monkeypatch.setattr(keep, "census", census)
    monkeypatch.setattr(keep, "_store", lambda: store)
    stop_on_sigterm()
    end = keeper(tmp_path, 0, tmp_path / "note.json").failed(3, PeerFailure("gone"), 5.0)
    assert isinstance(end, MissingRanks) and "rank 2 did not answer at step 3" in str(end)
    assert checkpoint.load(tmp_path / checkpoint.FILENAME)["step"] == 3
    rows = (tmp_path / keep.FAILURES).read_text().splitlines()
    assert [json.loads(r)["missing"] for r in rows] == [[2]]
    assert read_note(tmp_path / "note.json")["checkpoint"] == 3


def test_two_ranks_that_each_think_they_write_leave_one_failure_row(tmp_path, monkeypatch):
    """Ranks that checked in around the census's close see different alive sets: each sees
    only itself and thinks it writes; the store elects one."""
    store = dist.HashStore()
    monkeypatch.setattr(keep, "census", lambda store, step, rank, world, wait: {rank: 3})
    monkeypatch.setattr(keep, "_store", lambda: store)
    for rank in (1, 0):
        keeper(tmp_path, rank).failed(3, PeerFailure("gone"), 5.0)
    rows = [json.loads(r) for r in (tmp_path / keep.FAILURES).read_text().splitlines()]
    assert [(r["step"], r["missing"]) for r in rows] == [(3, [0, 2])]  # rank 1's, claimed first


@pytest.mark.parametrize(
    ("torchrun", "written"),
    [(False, False), (True, True)],
    ids=["sigint-alone", "torchrun-sigterm-asks-too"],
)
def test_a_ctrl_c_whose_census_missed_a_rank_is_no_failure_unless_sigterm_asks_too(
    tmp_path, monkeypatch, torchrun, written
):
    """Under load a rank that left on the Ctrl-C first can miss the census (CI saw it once):
    under SIGINT alone the stop is surely the user's, and failures.jsonl stays unwritten;
    under torchrun a SIGTERM also stops the survivors of a real failure, so a missing rank
    keeps its row."""
    monkeypatch.setattr(interrupt.signal, "signal", lambda sig, handler: None)
    monkeypatch.setattr(interrupt, "_interrupting", interrupt._interrupting)
    monkeypatch.setattr(interrupt, "_asked", interrupt._asked)
    interrupt.interrupt_on_signals(torchrun=torchrun)
    interrupt._ask(signal.SIGINT, None)
    monkeypatch.setattr(keep, "census", lambda store, step, rank, world, wait: {0: 3, 2: 3})
    monkeypatch.setattr(keep, "_store", dist.HashStore)
    keeper(tmp_path, 0, tmp_path / "note.json").failed(3, PeerFailure("gone"), 5.0)
    assert (tmp_path / keep.FAILURES).exists() is written
    assert read_note(tmp_path / "note.json")["missing"] == [1]  # the launcher's note, always


def test_a_note_left_by_an_earlier_incarnation_is_not_the_last_ones(tmp_path, monkeypatch):
    path = tmp_path / "failure.json"
    monkeypatch.setenv(keep.RESTART_COUNT, "0")
    monkeypatch.setattr(keep, "census", lambda store, step, rank, world, wait: {0: 3})
    monkeypatch.setattr(keep, "_store", dist.HashStore)
    keeper(tmp_path, 0, path).failed(3, PeerFailure("gone"), 5.0)
    assert read_note(path, restart=0)["step"] == 3
    assert read_note(path, restart=1) is None  # the restarted group failed without a census
