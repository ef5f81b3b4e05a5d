"""Injected delays are the simulator's draws: worker w's j-th unit, column w of the process."""

from __future__ import annotations

import numpy as np
import pytest

from tailtrain.delays import DelayProcess
from tailtrain.runtime.inject import Injector
from tailtrain.sim.scenario import Scenario
from tailtrain.strategies.registry import parse_strategy

SCENARIO = Scenario(
    task="logreg",
    workers=3,
    delay="exp:rate=10",
    pattern="heterogeneous:low=1,high=2",
    micro_batches=2,
    comm_time="uniform:low=0,high=1",
    iterations=1,
)


@pytest.mark.parametrize("rank", [0, 2])
def test_rank_w_sleeps_column_w_of_the_seeded_process(rank):
    injector = Injector(SCENARIO, parse_strategy("dropcompute:threshold=1"), 7, rank, True)
    rounds = 70  # past the clock's 64-iteration block
    got = np.stack([injector.unit_times(1, 2, 0.0) for _ in range(rounds)])
    expected = DelayProcess("exp:rate=10", "heterogeneous:low=1,high=2", 7, 3, 2).next_block(
        rounds
    )[:, rank, :]
    np.testing.assert_array_equal(got, expected)


def test_local_steps_take_one_process_iteration_each():
    injector = Injector(SCENARIO, parse_strategy("local-sgd:period=2"), 7, 1, True)
    expected = DelayProcess("exp:rate=10", "heterogeneous:low=1,high=2", 7, 3, 2).next_block(4)
    np.testing.assert_array_equal(injector.unit_times(2, 2, 0.0), expected[:2, 1].ravel())
    np.testing.assert_array_equal(injector.unit_times(2, 2, 0.0), expected[2:, 1].ravel())


def test_without_delay_nothing_is_injected_but_comm_draws_agree_across_ranks():
    a, b = (Injector(SCENARIO, parse_strategy("sync"), 7, r, False) for r in (0, 1))
    assert not a.unit_times(1, 2, 0.0).any()
    assert [a.comm_time() for _ in range(5)] == [b.comm_time() for _ in range(5)]
