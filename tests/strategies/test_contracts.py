"""Every registered strategy keeps the weight contract it declares, and every entry refuses a
strategy whose contract its topology cannot apply, before anything runs."""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tailtrain.errors import UsageError
from tailtrain.strategies.base import (
    TOPOLOGY_APPLIES,
    AllreducePlan,
    ArrivalColumns,
    Context,
    Selection,
    Strategy,
    Topology,
    WeightContract,
    check_contract,
    contract_refusal,
)
from tailtrain.strategies.registry import BUILDERS, parse_strategy

N = 4

#: one spec or more of every registered strategy, in states where its weights matter
SPECS = {
    "sync": ["sync"],
    "dropcompute": ["dropcompute:threshold=inf", "dropcompute:threshold=inf,divide-by=computed"],
    "local-sgd": ["local-sgd:period=2"],
    "k-sync": ["k-sync:k=2"],
    "k-batch-sync": ["k-batch-sync:k=2"],
    "k-async": ["k-async:k=2"],
    "k-batch-async": ["k-batch-async:k=2"],
    "async": ["async"],
    "dbw": ["dbw"],
    "b-dbw": ["b-dbw"],
    "adasync": ["adasync:base=k-sync,k0=2,interval=1"],
    "lgc": ["lgc:k=2,blocks=4"],
    "eager": ["eager:mode=solo", "eager:mode=majority"],
    "dbw-quorum": ["dbw-quorum", "dbw-quorum:lr=proportional"],
    "rebalance": ["rebalance", "rebalance:then=dropcompute,threshold=inf,divide-by=computed"],
}
ALL_SPECS = [spec for specs in SPECS.values() for spec in specs]


def test_every_registered_strategy_has_specs_here():
    assert set(SPECS) == set(BUILDERS)


def arrivals_of(units: list[int], versions: list[int], partial: list[bool]) -> ArrivalColumns:
    """One arrival per worker of ``units`` counted of 4, of model ``versions``."""
    n = len(units)
    worker = np.arange(n)
    version = np.asarray(versions, dtype=np.int64)
    start = np.zeros(n)
    finish = 1.0 + np.arange(n, dtype=np.float64)
    fraction = np.asarray(units, dtype=np.float64) / 4
    return ArrivalColumns(worker, version, version, start, finish, fraction, np.asarray(partial))


def raw_weights(selection: Selection) -> dict[int, float]:
    """Unnormalised ``now`` weight by arrival key."""
    now = selection.now
    return {int(k): float(w) for k, w in zip(now.keys, now.weight, strict=True)}


rows = st.lists(
    st.tuples(st.integers(0, 4), st.integers(0, 2), st.booleans()), min_size=1, max_size=N
)


@pytest.mark.parametrize("spec", ALL_SPECS)
@settings(max_examples=40, deadline=None)
@given(rows=rows)
def test_declared_contract_holds_for_any_arrivals(spec, rows):
    rule = parse_strategy(spec)
    state = rule.init(Context(n_workers=N))
    units, versions, partial = (list(c) for c in zip(*rows, strict=True))
    if rule.topology is Topology.ALLREDUCE:  # a round: every rank's fresh, whole-or-cut job
        versions, partial = [0] * len(units), [False] * len(units)
    cols = arrivals_of(units, versions, partial)
    selection = rule.select(state, cols)
    if not rule.defers:
        assert len(selection.later) == 0
    if rule.weights.within(WeightContract.OWN_COUNTS):  # w_i from arrival i alone
        together = raw_weights(selection)
        for i, key in enumerate(cols.keys):
            alone = raw_weights(rule.select(state, cols.take(np.array([i]))))
            assert together.get(int(key), 0.0) == pytest.approx(alone.get(int(key), 0.0))
    if rule.weights is WeightContract.EQUAL:
        weighed = np.array([w for w in raw_weights(selection).values() if w != 0])
        assert np.allclose(weighed, weighed[0]) if weighed.size else True


@pytest.mark.parametrize("spec", ALL_SPECS)
def test_each_registered_strategy_fits_its_own_topology(spec):
    rule = parse_strategy(spec)
    assert contract_refusal(rule, rule.topology) is None


def test_contracts_nest():
    assert WeightContract.EQUAL.within(WeightContract.OWN_COUNTS)
    assert WeightContract.OWN_COUNTS.within(WeightContract.ANY)
    assert not WeightContract.ANY.within(WeightContract.OWN_COUNTS)
    assert set(TOPOLOGY_APPLIES) == set(Topology)


class FinishTimeWeights(Strategy):
    """An allreduce rule that weighs a rank by when it finished: the others' arrivals matter."""

    name = "by-finish"
    topology: ClassVar[Topology] = Topology.ALLREDUCE
    weights: ClassVar[WeightContract] = WeightContract.ANY

    def init(self, ctx: Context) -> int:
        return ctx.n_workers

    def plan(self, state: int) -> AllreducePlan:
        return AllreducePlan(k=state)


class DeferringQuorum(FinishTimeWeights):
    """A partial-collective rule that defers weights, which a collective cannot apply."""

    name = "deferring"
    topology: ClassVar[Topology] = Topology.PARTIAL_COLLECTIVE
    weights: ClassVar[WeightContract] = WeightContract.EQUAL
    defers: ClassVar[bool] = True


def test_a_topology_refuses_weights_it_cannot_apply_in_one_line():
    with pytest.raises(UsageError, match="weighs arrivals by any") as refused:
        check_contract(FinishTimeWeights(), Topology.ALLREDUCE)
    assert "\n" not in str(refused.value)
    with pytest.raises(UsageError, match="defers weights"):
        check_contract(DeferringQuorum(), Topology.PARTIAL_COLLECTIVE)
    check_contract(FinishTimeWeights(), Topology.PARAMETER_SERVER)  # a server holds them all


def test_simulate_train_and_the_loop_refuse_a_mismatch_before_anything_runs():
    from tailtrain.core.scenario import Scenario
    from tailtrain.integrate.rounds import as_strategy
    from tailtrain.runtime.launching.topologies import check_topology
    from tailtrain.sim.run import simulate

    rule = FinishTimeWeights()
    with pytest.raises(UsageError, match="weighs arrivals by any"):
        simulate(Scenario(task="logreg", workers=2, iterations=1), rule, seed=0)
    with pytest.raises(UsageError, match="weighs arrivals by any"):
        check_topology(rule)  # launching.checks.validate's first check
    with pytest.raises(UsageError, match="weighs arrivals by any"):
        as_strategy(rule)  # StragglerStep, StragglerHookState
