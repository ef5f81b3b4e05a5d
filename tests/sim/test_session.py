"""RunKeeper: the one keeping of a run that the simulator and every `train` topology share."""

from __future__ import annotations

import numpy as np
import pytest

from tailtrain.core.scenario import Scenario, World
from tailtrain.core.session import RunKeeper, check_entry, run_identity, screened
from tailtrain.errors import UsageError
from tailtrain.faults import FaultPlan
from tailtrain.sim.run import simulate
from tailtrain.strategies.registry import parse_strategy


@pytest.fixture(scope="module")
def world() -> World:
    scenario = Scenario(task="logreg", workers=3, delay="const:value=1", iterations=4)
    return World.build(scenario, 0)


def test_a_checkpoint_is_due_every_u_steps_or_once_a_multiple_was_passed(tmp_path):
    keeper = RunKeeper({}, folder=tmp_path, every=3)
    assert [s for s in range(10) if keeper.due(s)] == [0, 3, 6, 9]
    assert keeper.due(7, since=5) and not keeper.due(8, since=6)  # an engine that skips
    assert not RunKeeper({}, every=3).due(3)  # no folder: nothing to write to


def test_a_checkpoint_of_another_run_is_refused_in_one_message(world):
    keeper = RunKeeper(run_identity(parse_strategy("sync"), world))
    keeper.check(dict(keeper.identity))
    with pytest.raises(UsageError, match="of another run \\(seed 1, not 0\\)"):
        keeper.check({**keeper.identity, "seed": 1})


def test_the_summary_on_either_clock_counts_the_screened_out_gradients(world):
    strategy = parse_strategy("sync")
    record = simulate(world.scenario, strategy, 0)
    record.steps[1]["nonfinite"] = 2
    faults = FaultPlan.parse(["nan:worker=1,step=0"], 3)
    virtual = RunKeeper({}, faults=faults).summary(world, strategy, record, {"x": 1})
    wall = RunKeeper({}, clock="wall").summary(world, strategy, record, {}, partial=True)
    assert virtual["nonfinite"] == wall["nonfinite"] == 2
    assert "virtual_time" in virtual and "wall_time" not in virtual and virtual["x"] == 1
    assert "wall_time" in wall and "virtual_time" not in wall and wall["partial"] is True
    assert virtual["injected_faults"] and "injected_faults" not in wall
    with pytest.raises(ValueError, match="clock"):
        RunKeeper({}, clock="cpu")


def test_a_screened_out_gradient_is_not_used():
    used = np.array([3, 5, 8])
    assert screened(used, np.array([5])).tolist() == [3, 8]
    assert screened(used, np.zeros(0, dtype=np.int64)) is used


def test_entry_checks_name_the_ranks_a_job_needs(world):
    check_entry(world, 3)
    check_entry(world, 4, servers=1)
    with pytest.raises(UsageError, match="--workers 3 but the job has 2 ranks"):
        check_entry(world, 2)
    with pytest.raises(UsageError, match="needs 4 ranks \\(a parameter server"):
        check_entry(world, 3, servers=1)
