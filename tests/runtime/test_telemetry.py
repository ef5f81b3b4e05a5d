"""Measured traces in the format ``trace:`` reads; profiler ranges."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tailtrain.delays.trace import read_trace
from tailtrain.runtime.telemetry import TraceRows, phase, write_trace


def test_a_ranks_trace_is_read_back_with_one_iteration_per_local_step(tmp_path):
    rows = TraceRows(rank=2, per_micro_batch=True)
    nan = np.nan
    rows.add(step=0, micro_batches=2, local_steps=2, times=np.array([0.1, 0.2, 0.3, nan]))
    rows.add(step=1, micro_batches=2, local_steps=2, times=np.array([0.4, nan, nan, nan]))
    write_trace(tmp_path / "t.csv", rows.table(), per_micro_batch=True)
    trace = read_trace(tmp_path / "t.csv")
    assert trace.iteration.tolist() == [0, 0, 1, 2]
    assert trace.micro_batch.tolist() == [0, 1, 0, 0]
    assert trace.worker.tolist() == [2] * 4
    assert trace.seconds.tolist() == [0.1, 0.2, 0.3, 0.4]


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
