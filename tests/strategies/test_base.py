"""The parameter server's step rules shared by the simulator and the runtime."""

from __future__ import annotations

import numpy as np

from tailtrain.strategies.base import SyncMode, step_closes, usable, uses_tokens


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
