"""The machine a trace was measured on (``core.machine``): its rows are kept per run, and
advise says in one line when ranks or load outnumbered the cores."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tailtrain.advice import advise
from tailtrain.core.machine import (
    MACHINE_FILE,
    append_machine,
    contention_note,
    machine_row,
    read_machine,
)
from tailtrain.delays.trace import write_trace_rows


def test_this_host_s_row_counts_its_cores_ranks_and_load(monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    row = machine_row(run=2)
    assert row["run"] == 2 and row["local_ranks"] == 4 and row["cores"] >= 1
    assert len(row["load"]) == 3 and all(x >= 0 for x in row["load"])


def test_the_run_s_last_row_is_read_and_a_cut_line_is_skipped(tmp_path):
    append_machine(tmp_path, {"run": 0, "cores": 2, "local_ranks": 2, "load": [1, 1, 1]})
    append_machine(tmp_path, {"run": 1, "cores": 2, "local_ranks": 8, "load": [5, 4, 3]})
    with open(tmp_path / MACHINE_FILE, "a") as f:
        f.write('{"run": 1, "cores"')  # a crash mid-line
    assert read_machine(tmp_path, 1)["local_ranks"] == 8
    assert read_machine(tmp_path, 0)["local_ranks"] == 2
    assert read_machine(tmp_path, 3) is None and read_machine(tmp_path / "none", 0) is None


@pytest.mark.parametrize(
    ("ranks", "cores", "load", "says"),
    [
        (8, 2, [1.0, 1.0, 1.0], "4.0x oversubscribed"),  # more ranks than cores
        (2, 2, [6.0, 5.0, 2.0], "3.0x oversubscribed"),  # a loaded machine
        (2, 4, [1.5, 1.0, 0.5], None),  # room to spare
        (2, 2, [2.0, 2.0, 2.0], None),  # exactly full: no contention yet
    ],
)
def test_contention_is_named_only_when_ranks_or_load_outnumber_the_cores(ranks, cores, load, says):
    note = contention_note({"host": "h", "cores": cores, "local_ranks": ranks, "load": load})
    if says is None:
        assert note is None
    else:
        assert says in note and "assumes no contention" in note and "\n" not in note


@pytest.mark.slow
def test_advise_warns_of_the_trace_s_oversubscribed_machine(tmp_path):
    """A folder whose machine row shows 4 ranks on 2 cores: advise's notes say so in one
    line; the same trace without the row (or on a machine with room) does not."""
    rng = np.random.default_rng(0)
    i, w = np.meshgrid(np.arange(60), np.arange(4), indexing="ij")
    rows = np.column_stack([i.ravel(), w.ravel(), 0.01 + rng.exponential(0.002, i.size)])
    for name, row in [("busy", (4, 2)), ("idle", (4, 8)), ("none", None)]:
        (tmp_path / name).mkdir()
        write_trace_rows(tmp_path / name / "trace.csv", rows, per_micro_batch=False)
        if row is not None:
            line = {"run": 0, "host": "h", "local_ranks": row[0], "cores": row[1], "load": [1]}
            (tmp_path / name / MACHINE_FILE).write_text(json.dumps(line) + "\n")
    said = {name: advise(tmp_path / name, samples=200).notes for name in ("busy", "idle", "none")}
    assert sum("contention" in n for n in said["busy"]) == 1
    assert not any("contention" in n for n in said["idle"] + said["none"])
