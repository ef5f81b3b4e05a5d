"""Fault drill specs (tailtrain.faults): parsing, checks, and who is hit when."""

from __future__ import annotations

import math

import pytest

from tailtrain.errors import UsageError
from tailtrain.faults import Fault, FaultPlan, parse_fault


def test_each_kind_parses_and_describes_itself_back():
    texts = ["nan:worker=1,step=2", "inf:worker=0,step=0", "kill:worker=3,step=5"]
    texts += ["freeze:worker=2,step=4,seconds=1.5", "raise:rank=3,step=1"]
    plan = FaultPlan.parse(texts, workers=4)
    assert plan.describe() == texts
    assert FaultPlan.parse(plan.describe(), workers=4) == plan


def test_numeric_faults_reach_the_update_and_process_faults_do_not():
    plan = FaultPlan.parse(["nan:worker=1,step=2", "kill:worker=1,step=2"], workers=4)
    workers, values = plan.at(2)
    assert workers.tolist() == [1] and math.isnan(values[0])
    assert plan.at(3) is None
    assert math.isnan(plan.value(1, 2)) and plan.value(0, 2) is None
    assert plan.process_faults(1, 2, 2) == [Fault("kill", 1, 2)]
    assert plan.process_faults(1, 3, 9) == []


def test_a_raise_names_a_rank_which_may_be_a_parameter_server():
    plan = FaultPlan.parse(["raise:rank=0,step=2", "kill:worker=0,step=2"], workers=2, ranks=3)
    assert plan.process_faults(None, 0, 9, rank=0) == [Fault("raise", -1, 2, rank=0)]
    assert [f.kind for f in plan.process_faults(0, 0, 9, rank=0)] == ["kill", "raise"]
    assert plan.process_faults(0, 0, 9, rank=1) == [Fault("kill", 0, 2)]
    with pytest.raises(UsageError, match=r"ranks are 0..2 \(rank 0 is the parameter server\)"):
        FaultPlan.parse(["raise:rank=3,step=0"], workers=2, ranks=3)
    with pytest.raises(UsageError, match="does not take parameter 'worker'"):
        FaultPlan.parse(["raise:worker=0,step=0"], workers=2)


def test_a_kill_wins_over_a_freeze_of_the_same_step():
    plan = FaultPlan.parse(["freeze:worker=0,step=1,seconds=2", "kill:worker=0,step=1"], 2)
    assert [f.kind for f in plan.process_faults(0, 1, 1)] == ["kill", "freeze"]


@pytest.mark.parametrize(
    ("texts", "kinds", "message"),
    [
        (["boom:worker=0,step=0"], None, "unknown fault 'boom'"),
        (["kill:worker=0,step=0"], ("nan", "inf"), "needs real processes"),
        (["raise:rank=0,step=0"], ("nan", "inf"), "needs real processes"),
        (["raise:rank=4,step=0"], None, "ranks are 0..3"),
        (["freeze:worker=0,step=0"], None, "missing parameter 'seconds'"),
        (["freeze:worker=0,step=0,seconds=0"], None, "must be > 0"),
        (["freeze:worker=0,step=0,seconds=inf"], None, "finite"),
        (["kill:worker=0,step=0,seconds=1"], None, "does not take parameter 'seconds'"),
        (["kill:worker=4,step=0"], None, "workers are 0..3"),
        (["nan:worker=0,step=-1"], None, "must be >= 0"),
    ],
)
def test_bad_faults_are_refused_in_one_line(texts, kinds, message):
    with pytest.raises(UsageError, match=message) as err:
        if kinds is None:
            FaultPlan.parse(texts, workers=4)
        else:
            FaultPlan.parse(texts, workers=4, kinds=kinds)
    assert "\n" not in str(err.value)


def test_parse_fault_default_accepts_every_kind():
    assert parse_fault("freeze:worker=0,step=0,seconds=3").seconds == 3.0


def test_a_worker_that_skips_updates_meets_their_drills_at_the_next_one(monkeypatch):
    from tailtrain.runtime import inject

    slept = []
    monkeypatch.setattr(inject, "sleep", slept.append)
    plan = FaultPlan.parse(
        ["freeze:worker=1,step=3,seconds=2", "freeze:worker=0,step=3,seconds=9"], 2
    )
    drill = inject.FaultDrill(plan, worker=1)
    for step in (0, 1, 5, 6):  # update 3 is skipped, as a late eager rank skips rounds
        drill.before(step)
    assert slept == [2.0]
    drill.before(3)  # fired once: a step played again does not fire it again
    assert slept == [2.0]
