"""Measured traces in the format ``trace:`` reads; profiler ranges."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from tailtrain.core.scenario import Scenario
from tailtrain.delays.trace import read_trace
from tailtrain.runtime.config import TrainConfig, build_world
from tailtrain.runtime.telemetry import (
    ProgressSink,
    TraceRows,
    close_record,
    phase,
    run_record,
    split_round,
    time_means,
    write_trace,
)


def test_a_ranks_trace_is_read_back_with_one_iteration_per_local_step(tmp_path):
    """Units tau cut are censored rows: the one in flight at the seconds it had run, those
    never started at 0 (issue 24: a trace records what it did not see)."""
    rows = TraceRows(rank=2, per_micro_batch=True)
    nan = np.nan
    rows.add(step=0, micro_batches=2, local_steps=2, times=np.array([0.1, 0.2, 0.3, nan]))
    rows.add(step=1, micro_batches=2, local_steps=2, times=np.array([0.4, nan, nan, nan]), cut=0.05)
    write_trace(tmp_path / "t.csv", rows.table(), per_micro_batch=True)
    trace = read_trace(tmp_path / "t.csv")
    assert trace.iteration.tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    assert trace.micro_batch.tolist() == [0, 1] * 4
    assert trace.worker.tolist() == [2] * 8
    assert trace.seconds.tolist() == [0.1, 0.2, 0.3, 0.0, 0.4, 0.05, 0.0, 0.0]
    assert trace.censored.tolist() == [False] * 3 + [True, False] + [True] * 3


def test_a_cut_unit_that_ran_to_its_end_is_its_time_not_a_bound(tmp_path):
    """A compute cannot be stopped: a unit with no injected seconds left that ends past tau
    is not counted, yet its seconds are its whole time. It is written uncensored (as a bound
    it would be completed beyond its own time, issue 36); the units after it, never started,
    stay censored, and its seconds are the rank's compute, not its noncompute: a forecast that
    completes the unit must not meet its run-on a second time in T^c."""
    rows = TraceRows(rank=0, per_micro_batch=True, charged=True)
    nan = np.nan
    rows.add(step=0, micro_batches=4, local_steps=1, times=np.array([0.1, nan, nan, nan]),
             cut=0.3, cut_whole=True)  # fmt: skip
    rows.add(step=1, micro_batches=4, local_steps=1, times=np.array([0.1, nan, nan, nan]),
             cut=0.3)  # fmt: skip
    rows.charge(0, 1.0)
    rows.charge(1, 1.0)
    table = rows.table()
    write_trace(tmp_path / "t.csv", table, per_micro_batch=True, charged=True)
    trace = read_trace(tmp_path / "t.csv")
    assert trace.seconds.tolist() == [0.1, 0.3, 0.0, 0.0] * 2
    assert trace.censored.tolist() == [False, False, True, True, False, True, True, True]
    assert table[3, -1] == table[7, -1] == pytest.approx(0.6)  # the counted 0.1 and the cut 0.3


def test_a_trace_without_cut_units_has_no_censored_column(tmp_path):
    rows = TraceRows(rank=0, per_micro_batch=True)
    rows.add(step=0, micro_batches=2, local_steps=1, times=np.array([0.1, 0.2]))
    write_trace(tmp_path / "t.csv", rows.table(), per_micro_batch=True)
    assert (tmp_path / "t.csv").read_text().splitlines()[
        0
    ] == "iteration,worker,micro_batch,seconds"


def test_a_round_splits_into_parts_that_are_never_negative_and_sum_to_its_wall_time():
    # rank 1 started its round late: its compute ended last though it was the shortest, so
    # max_k T~_k - T~_n (the old wait) would exceed its whole allreduce and leave comm < 0
    rows = np.array([[4, 0.30, 0.10], [4, 0.20, 0.0], [3, 0.25, 0.05]])
    timing = np.array([[0.09, 0.42], [0.02, 0.44], [0.06, 0.40]])  # [allreduce, round]
    parts = split_round(rows, timing)
    assert parts.wall == 0.44
    assert parts.comm.tolist() == [0.02] * 3  # the last to arrive waited for nobody
    np.testing.assert_allclose(parts.wait, [0.07, 0.0, 0.04])
    for part in (parts.wait, parts.comm, parts.overhead, parts.compute - parts.injected):
        assert (part >= 0).all()
    total = parts.compute + parts.wait + parts.comm + parts.overhead
    np.testing.assert_allclose(total, parts.wall)
    unknown = split_round(rows, None)
    assert np.isnan(unknown.wait).all() and np.isnan(unknown.wall)


def test_the_summary_means_of_the_parts_sum_to_the_mean_round():
    record = run_record_of_rounds(
        [(0.5, [0.3, 0.2], [0.1, 0.0], [0.0, 0.1], [0.1, 0.1], [0.1, 0.1])],
    )
    means = time_means(record.steps)
    assert means["mean_compute_time"] == pytest.approx(0.2)
    assert means["mean_injected_time"] == pytest.approx(0.05)
    assert sum(means.values()) == pytest.approx(0.5)


def run_record_of_rounds(rounds):
    from tailtrain.core.records import RunRecord

    record = RunRecord()
    for wall, compute, injected, wait, comm, overhead in rounds:
        row = {"step_time": wall, "rank_compute": compute, "rank_injected": injected}
        row |= {"rank_wait": wait, "rank_comm": comm, "rank_overhead": overhead}
        record.steps.append(row)
    return record


def test_a_charged_trace_records_each_rounds_noncompute_seconds_on_its_last_iteration(tmp_path):
    rows = TraceRows(rank=1, per_micro_batch=True, charged=True)
    nan = np.nan
    rows.add(step=0, micro_batches=2, local_steps=2, times=np.array([0.1, 0.2, 0.3, nan]))
    rows.add(step=1, micro_batches=2, local_steps=2, times=np.array([0.4, 0.1, 0.1, 0.1]))
    rows.charge(0, 1.0)  # round 1's timings never came
    write_trace(tmp_path / "t.csv", rows.table(), per_micro_batch=True, charged=True)
    trace = read_trace(tmp_path / "t.csv")
    # the unit never started is a censored row (its seconds a lower bound, 0)
    assert trace.iteration.tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    assert trace.censored.tolist() == [False, False, False, True, False, False, False, False]
    np.testing.assert_allclose(trace.noncompute, [nan, nan, 0.4, 0.4, nan, nan, nan, nan])
    assert trace.round_comm().tolist() == pytest.approx([0.4])
    # a rank that dropped work is charged every second it computed: the cut unit's run too,
    # whether tau stopped it (a bound) or its compute ran on past tau (its whole time)
    for whole in (False, True):
        rows = TraceRows(rank=0, per_micro_batch=True, charged=True)
        rows.add(0, 2, 1, times=np.array([0.1, nan]), cut=0.15, cut_whole=whole)
        rows.add(1, 2, 1, times=np.array([0.1, 0.1]))
        rows.add(2, 2, 1, times=np.array([0.3, nan]))  # the second unit never started
        for step in range(3):
            rows.charge(step, 1.0)
        table = rows.table()
        assert table[:, -1].tolist() == pytest.approx([0.75, 0.75, 0.8, 0.8, 0.7, 0.7])
        assert table[:, 3].tolist() == [False, not whole, False, False, False, True]


def test_whole_iteration_traces_have_no_micro_batch_column(tmp_path):
    rows = TraceRows(rank=0, per_micro_batch=False)
    rows.add(step=3, micro_batches=1, local_steps=1, times=np.array([0.5]))
    write_trace(tmp_path / "t.csv", rows.table(), per_micro_batch=False)
    trace = read_trace(tmp_path / "t.csv")
    assert trace.micro_batch is None and trace.iteration.tolist() == [3]


def test_phases_are_profiler_ranges():
    with torch.profiler.profile() as prof, phase("compute") as timer:
        torch.ones(3).sum()
    assert timer.seconds >= 0
    assert "tailtrain.compute" in {e.key for e in prof.key_averages()}


def test_a_phase_is_timed_when_its_section_raises():
    timer = phase("compute")
    with pytest.raises(ValueError), timer:
        raise ValueError("the section failed")
    assert timer.seconds > 0


class Terminal:
    """A standard error that says it is a terminal and keeps what is written."""

    def __init__(self) -> None:
        self.text: list[str] = []

    def isatty(self) -> bool:
        return True

    def write(self, text: str) -> int:
        self.text.append(text)
        return len(text)

    def flush(self) -> None:
        pass


@pytest.mark.parametrize("progress", [True, False])
def test_rank_0_follows_its_rounds_on_a_progress_bar_only_on_a_terminal(monkeypatch, progress):
    config = TrainConfig(
        Scenario(task="logreg", workers=2, iterations=4), "sync", progress=progress
    )
    world, _ = build_world(config)
    monkeypatch.setattr(sys, "stderr", Terminal())
    record = run_record(config, world, lead=True)
    assert isinstance(record.sink, ProgressSink) is progress
    assert run_record(config, world, lead=False).sink is None  # other ranks draw nothing
    if progress:
        for step in range(4):
            record.add_step({"step": step, "time": 0.1 * step})
        sink = record.sink
        assert sink.rounds == 4
        close_record(record)
        assert record.sink is None
    monkeypatch.undo()
    assert run_record(config, world, lead=True).sink is None  # standard error is no terminal
