"""The protocol's shared pieces: the parameter server's step rules (simulator and runtime),
arrival columns and the default selection."""

from __future__ import annotations

import numpy as np

from tailtrain.strategies.base import (
    COLUMNS,
    ArrivalColumns,
    SyncMode,
    equal_weights,
    step_closes,
    usable,
    uses_tokens,
)


def test_a_stale_arrival_is_usable_only_where_the_plan_accepts_it():
    versions = np.array([3, 2, 3])
    assert usable(versions, 3, False).tolist() == [True, False, True]
    assert usable(versions, 3, True).tolist() == [True, True, True]
    assert usable(2, 3, False) is False and usable(2, 3, True) is True


def test_a_step_closes_at_k_unless_it_waits_for_an_older_job():
    assert not step_closes(2, 3, False)
    assert step_closes(3, 3, False) and step_closes(4, 3, False)
    assert not step_closes(3, 3, True)


def test_only_pull_without_stale_gradients_runs_on_tokens():
    assert uses_tokens(SyncMode.PULL, False)
    assert not uses_tokens(SyncMode.PULL, True)
    assert not uses_tokens(SyncMode.PSI, False)


def test_equal_weights_skip_the_partial_arrivals_and_weigh_the_rest_alike():
    whole = ArrivalColumns.of([0, 1, 2], [0, 0, 0], [0.0] * 3, [1.0, 2.0, 3.0])
    assert equal_weights(whole).now.keys.tolist() == whole.keys.tolist()
    assert equal_weights(whole).now.weight.tolist() == [1.0] * 3
    mixed = ArrivalColumns.of(
        [0, 1, 2], [0, 0, 0], [0.0] * 3, [1.0, 2.0, 3.0], partial=[False, True, False]
    )
    chosen = equal_weights(mixed).now
    assert chosen.keys.tolist() == mixed.keys[[0, 2]].tolist()
    assert chosen.weight.tolist() == [1.0, 1.0]


def test_trusted_arrivals_hold_their_columns_as_given():
    columns = [np.arange(2), np.zeros(2, np.int64), np.zeros(2, np.int64)]
    columns += [np.zeros(2), np.ones(2), np.full(2, 0.5), np.zeros(2, bool)]
    arrivals = ArrivalColumns.trusted(*columns)
    for name, column in zip(COLUMNS, columns, strict=True):
        assert getattr(arrivals, name) is column
    assert arrivals.keys.tolist() == ArrivalColumns(*columns).keys.tolist()
