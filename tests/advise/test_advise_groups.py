"""`advise --group-size G` (issue 38 item 4): a trace of ranks advised as its replica groups
is the trace grouped by the one rule (``delays.groups``) advised as any trace: the same
verdicts, figures and rows, the slow rank's group named."""

from __future__ import annotations

import numpy as np
import pytest

from tailtrain.advice import advise
from tailtrain.delays.groups import group_unit_times
from tailtrain.errors import UsageError
from tailtrain.prediction.families import row_spec


def test_a_trace_advised_in_groups_is_its_grouped_trace_advised(tmp_path, helpers):
    write_trace, noisy = helpers
    times = noisy("lognormal", (60, 8), seed=4)
    times[:, 5] *= 3  # rank 5: group 2 of groups of 2
    ranks = write_trace(tmp_path / "ranks.csv", times)
    by_hand = write_trace(tmp_path / "groups.csv", group_unit_times(times, 2, 0.05))
    grouped = advise(ranks, group_size=2, group_cost=0.05, samples=200)
    direct = advise(by_hand, samples=200)
    assert grouped.workers == 4 and grouped.persistent == [2] == direct.persistent
    # the file by hand keeps 9 decimals of each group's unit, advise's every digit
    np.testing.assert_allclose(grouped.times, direct.times, rtol=1e-12)
    assert grouped.recommendation == direct.recommendation
    assert [row_spec(r.row) for r in grouped.ranked] == [row_spec(r.row) for r in direct.ranked]
    assert [r.effective_speedup for r in grouped.ranked] == pytest.approx(
        [r.effective_speedup for r in direct.ranked], rel=1e-9
    )
    assert any("replica groups of 2" in note for note in grouped.notes)


def test_a_group_size_that_does_not_divide_the_trace_is_one_line(tmp_path, helpers):
    write_trace, noisy = helpers
    path = write_trace(tmp_path / "t.csv", noisy("lognormal", (20, 6), seed=1))
    with pytest.raises(UsageError, match="--group-size 4 does not divide --workers 6"):
        advise(path, group_size=4)
