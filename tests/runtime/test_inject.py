"""Injected delays are the simulator's draws: worker w's j-th unit, column w of the process;
and a drill that fires is noted in the run folder's ledger, so it fires once per run."""

from __future__ import annotations

import numpy as np
import pytest

from tailtrain.core.scenario import Scenario
from tailtrain.delays import DelayProcess
from tailtrain.faults import FaultPlan
from tailtrain.runtime.config import TrainConfig, build_world
from tailtrain.runtime.inject import FaultDrill, Injector, fired_drills

SCENARIO = Scenario(
    task="logreg",
    workers=3,
    delay="exp:rate=10",
    pattern="heterogeneous:low=1,high=2",
    micro_batches=2,
    comm_time="uniform:low=0,high=1",
    iterations=1,
)


def injector(strategy: str, rank: int, delays: bool = True) -> Injector:
    world, _ = build_world(TrainConfig(SCENARIO, strategy, seed=7))
    return Injector(world, rank, delays)


@pytest.mark.parametrize("rank", [0, 2])
def test_rank_w_sleeps_column_w_of_the_seeded_process(rank):
    rank_injector = injector("dropcompute:threshold=1", rank)
    rounds = 70  # past the clock's 64-iteration block
    got = np.stack([rank_injector.unit_times(1, 2, 0.0) for _ in range(rounds)])
    expected = DelayProcess("exp:rate=10", "heterogeneous:low=1,high=2", 7, 3, 2).next_block(
        rounds
    )[:, rank, :]
    np.testing.assert_array_equal(got, expected)


def test_local_steps_take_one_process_iteration_each():
    local = injector("local-sgd:period=2", 1)
    expected = DelayProcess("exp:rate=10", "heterogeneous:low=1,high=2", 7, 3, 2).next_block(4)
    np.testing.assert_array_equal(local.unit_times(2, 2, 0.0), expected[:2, 1].ravel())
    np.testing.assert_array_equal(local.unit_times(2, 2, 0.0), expected[2:, 1].ravel())


def test_without_delay_nothing_is_injected_but_comm_draws_agree_across_ranks():
    a, b = (injector("sync", r, delays=False) for r in (0, 1))
    assert not a.unit_times(1, 2, 0.0).any()
    assert [a.comm_time() for _ in range(5)] == [b.comm_time() for _ in range(5)]


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
