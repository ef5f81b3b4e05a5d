"""The runtime's one contact with a rule: weights from a Selection, topology checks."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

import tailtrain.runtime
from tailtrain.errors import TailtrainError, UsageError
from tailtrain.runtime.control import (
    RuleDriver,
    carried_rtol,
    check_agreement,
    check_divisor,
    check_own_weight,
    weighting,
)
from tailtrain.runtime.launching.topologies import TOPOLOGY_SPECS, check_topology
from tailtrain.strategies.base import (
    COLUMNS,
    ArrivalColumns,
    Context,
    Selection,
    StepStats,
    Topology,
    Weighting,
)
from tailtrain.strategies.registry import parse_strategy
from tailtrain.topology.allreduce import own_arrival, round_arrivals


def arrivals(units) -> ArrivalColumns:
    n = len(units)
    return ArrivalColumns.of(np.arange(n), np.zeros(n), np.zeros(n), np.ones(n), units=units)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # DropCompute Eq. (1) with g_n the mean of M: w_n = C_n / M, divided by N
        ("dropcompute:threshold=1", 3.0),
        # App. B.2.2: w_n = C_n / M, divided by the reduced sum of the weights
        ("dropcompute:threshold=1,divide-by=computed", None),
    ],
)
def test_each_rank_gets_its_unnormalised_weight_and_the_divisor(text, expected):
    driver = RuleDriver(parse_strategy(text), Context(n_workers=3))
    cols = arrivals([1.0, 0.5, 0.0])
    for rank, weight in enumerate([1.0, 0.5, 0.0]):
        w = driver.weights(cols, rank)
        assert w.weight == weight and w.total == 1.5 and w.divisor == expected
        assert cols.worker[np.isin(cols.keys, w.used)].tolist() == [0, 1]


def test_sync_weighs_every_rank_equally():
    driver = RuleDriver(parse_strategy("sync"), Context(n_workers=4))
    weights = [driver.weights(arrivals([1.0] * 4), r) for r in range(4)]
    assert [w.weight for w in weights] == [1.0] * 4 and weights[0].divisor is None


@pytest.mark.parametrize(
    ("text", "units", "done", "expected"),
    [
        ("sync", 1, [1, 1, 1], [1.0, 1.0, 1.0]),
        # DropCompute Eq. (1): w_n = C_n / M, whatever the other ranks computed
        ("dropcompute:threshold=1", 4, [4, 2, 0], [1.0, 0.5, 0.0]),
        ("dropcompute:threshold=1,divide-by=computed", 4, [3, 0, 1], [0.75, 0.0, 0.25]),
        # Local-SGD: C_n / (H M) with H = 2 local steps of M = 2
        ("local-sgd:period=2,threshold=1", 4, [4, 1, 2], [1.0, 0.25, 0.5]),
    ],
)
def test_a_ranks_own_arrival_gives_its_weight_before_anything_is_exchanged(
    text, units, done, expected
):
    driver = RuleDriver(parse_strategy(text), Context(n_workers=3))
    compute = np.array([0.3, 0.1, 0.2])
    everyone = round_arrivals(7, 1.0, np.array(done), compute, units)
    for rank, weight in enumerate(expected):
        mine = own_arrival(7, 1.0, rank, done[rank], compute[rank], units)
        own = driver.own_weight(done[rank], units, lambda m=mine: m)
        assert own.weight == pytest.approx(weight)
        check_own_weight(weight, driver.weights(everyone, rank).weight)


def test_a_ranks_own_arrival_is_its_row_of_the_rounds_arrivals():
    """Built apart (one before the allreduce, one from its rows), column for column equal."""
    done, compute = np.array([4.0, 1.0, 0.0]), np.array([0.3, 0.1, 0.2])
    everyone = round_arrivals(7, 2.5, done, compute, 4)
    for rank in range(3):
        mine = own_arrival(7, 2.5, rank, int(done[rank]), float(compute[rank]), 4)
        row = everyone.take(np.array([rank]))
        for column in COLUMNS:
            ours, theirs = getattr(mine, column), getattr(row, column)
            assert ours.dtype == theirs.dtype and ours.tolist() == theirs.tolist(), column
    assert everyone.units.tolist() == [1.0, 0.25, 0.0]
    assert everyone.finish.tolist() == [2.5 + c for c in compute.tolist()]


def test_a_plan_is_planned_again_only_for_a_new_state():
    """The driver keeps the plan of the state object it planned for: a static rule's every
    round; a rule that adapts gets a new plan from its new state."""
    static = RuleDriver(parse_strategy("sync"), Context(n_workers=2))
    assert static.plan() is static.plan()
    driver = RuleDriver(parse_strategy("dropcompute:threshold=auto,calibrate=1"), Context(2))
    first = driver.plan()
    assert first.threshold == float("inf") and driver.plan() is first  # calibrating
    times = np.full((2, 4), 0.01)
    arrivals = round_arrivals(0, 0.0, np.array([4.0, 4.0]), np.array([0.04, 0.04]), 4)
    driver.adapt(
        StepStats(
            step=0,
            version=1,
            time=0.05,
            k=2,
            arrivals=arrivals,
            used=arrivals.keys,
            micro_batch_times=times,
            comm_time=0.01,
        )
    )
    assert driver.plan() is not first and driver.plan().threshold < float("inf")


class Counting:
    """A rule that counts its selections (a stand-in wrapping a real one)."""

    def __init__(self, text: str) -> None:
        self.rule, self.selections = parse_strategy(text), 0

    def __getattr__(self, name):
        return getattr(self.rule, name)

    def select(self, state, arrivals):
        self.selections += 1
        return self.rule.select(state, arrivals)


def test_the_own_weight_is_asked_once_per_state_count_and_units():
    rule = Counting("dropcompute:threshold=1")
    driver = RuleDriver(rule, Context(n_workers=2))
    arrival = {d: own_arrival(0, 0.0, 1, d, 0.1, 4) for d in range(5)}
    first = driver.own_weight(4, 4, lambda: arrival[4])
    assert first == (1.0, 2) and rule.selections == 1  # DropCompute Eq. (1): C/M, over N
    assert driver.own_weight(4, 4, lambda: pytest.fail("asked again")) is first
    assert driver.own_weight(2, 4, lambda: arrival[2]).weight == 0.5 and rule.selections == 2
    # a loop may give a call more units than the last: 4 of 8 is another weight
    wider = own_arrival(0, 0.0, 1, 4, 0.1, 8)
    assert driver.own_weight(4, 8, lambda: wider).weight == 0.5 and rule.selections == 3
    driver.state = rule.rule.adapt(driver.state, StepStats(step=0, version=1, time=0.1, k=2))
    assert driver.own_weight(4, 4, lambda: arrival[4]) == first and rule.selections == 4


def test_static_rules_keep_their_state_and_adapting_ones_do_not():
    assert parse_strategy("sync").keeps_state
    for text in ("dropcompute:threshold=1", "local-sgd:period=2", "dbw"):
        assert not parse_strategy(text).keeps_state, text


def test_a_divisor_used_before_the_selection_over_all_ranks_must_be_its():
    check_divisor(None, None)
    check_divisor(3.0, 3.0 + 1e-9)
    for used, selected in ((None, 3.0), (3.0, None), (2.0, 3.0)):
        with pytest.raises(TailtrainError, match="divides by"):
            check_divisor(used, selected)


def test_a_weight_that_depends_on_other_ranks_is_refused():
    with pytest.raises(TailtrainError, match="own counts"):
        check_own_weight(1.0, 1 / 3)


def test_deferred_weights_have_no_place_in_an_allreduce():
    with pytest.raises(TailtrainError, match="deferred"):
        cols = arrivals([1.0, 1.0])
        later = Weighting.of(cols, np.array([1]), 0.5)
        weighting(Selection(now=Weighting.of(cols, np.array([0]), 1.0), later=later), 0)


def test_disagreeing_ranks_are_caught_by_the_reduced_weight_sum():
    check_agreement(0.5, 0.5 + 1e-7)
    with pytest.raises(TailtrainError, match="disagree"):
        check_agreement(0.5, 2 / 3)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_weights_summed_in_half_precision_agree_to_its_rounding_and_no_further(dtype):
    """DropCompute at M = 3, one rank cut after 1: weights 1 and 1/3, summed in the gradient
    buffer's half dtype, are off the total by more than WEIGHT_RTOL but within the dtype's
    rounding; a rank that selected other weights is still caught."""
    import torch

    summed = float(torch.tensor([1.0, 1 / 3], dtype=getattr(torch, dtype)).sum())
    rtol = carried_rtol(torch.finfo(getattr(torch, dtype)).eps, 2)
    with pytest.raises(TailtrainError, match="disagree"):
        check_agreement(4 / 3, summed)  # float32's tolerance
    check_agreement(4 / 3, summed, rtol)
    with pytest.raises(TailtrainError, match="disagree"):
        check_agreement(4 / 3, 1 + 2 / 3, rtol)  # the other rank weighed 2/3


@pytest.mark.parametrize("text", ["sync", "dropcompute", "local-sgd:period=2"])
def test_allreduce_strategies_run(text):
    check_topology(parse_strategy(text))


@pytest.mark.parametrize(
    ("text", "topology"),
    [("dbw", Topology.PARAMETER_SERVER), ("eager:mode=solo", Topology.PARTIAL_COLLECTIVE)],
)
def test_a_topology_train_lacks_is_refused_in_one_line(text, topology, monkeypatch):
    monkeypatch.delitem(TOPOLOGY_SPECS, topology, raising=False)
    with pytest.raises(UsageError, match="topology") as err:
        check_topology(parse_strategy(text))
    assert "\n" not in str(err.value)


#: a rule's methods that decide (``strategies.base.Strategy``): only the driver calls them
RULE_METHODS = {"init", "plan", "select", "adapt", "state_dict", "load_state_dict", "follow_world"}


def rule_calls(path: Path) -> list[str]:
    """``strategy.m(...)`` / ``x.strategy.m(...)`` calls of a rule method in ``path``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        receiver = node.func.value
        name = getattr(receiver, "id", None) or getattr(receiver, "attr", None)
        if node.func.attr in RULE_METHODS and name == "strategy":
            found.append(f"{path.name}:{node.lineno} strategy.{node.func.attr}")
    return found


def test_only_the_rule_driver_calls_a_rule_in_the_runtime():
    """Issue 22: the rule object is reached through ``RuleDriver`` alone; the partial
    collective's reducer thread and the parameter server's loop hold a driver too."""
    runtime = Path(tailtrain.runtime.__file__).parent
    calls = [
        c for p in sorted(runtime.rglob("*.py")) if p.name != "control.py" for c in rule_calls(p)
    ]
    assert calls == []
    assert rule_calls(runtime / "control.py")  # the finder sees the driver's own calls


def test_a_driver_without_memory_asks_the_plan_every_time():
    """A rule that adapts its state in place plans anew each round (the partial collective,
    the parameter server); the allreduce's driver remembers the plan of a state object."""
    asked = []

    class Counting:
        def __init__(self, rule):
            self.rule = rule

        def __getattr__(self, name):
            return getattr(self.rule, name)

        def plan(self, state):
            asked.append(state)
            return self.rule.plan(state)

    rule = Counting(parse_strategy("sync"))
    RuleDriver(rule, Context(n_workers=2)).plan()
    driver = RuleDriver(rule, Context(n_workers=2))
    driver.plan(), driver.plan()
    fresh = RuleDriver(rule, Context(n_workers=2), shape=None, remember=False)
    fresh.plan(), fresh.plan()
    assert len(asked) == 1 + 1 + 2
