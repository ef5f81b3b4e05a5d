"""The conformance matrix: every registered strategy runs on every engine that accepts it
(the simulator, and `train` on its runtime topology with 2 workers on gloo), and every entry
that does not accept it refuses it before anything runs (optax's one table of optimizers
under test, extended to engines).

One local job per runtime topology runs all of its strategies in turn (the launcher sizes a
job by its first config), so the matrix costs three launches.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from tailtrain.core.scenario import Scenario
from tailtrain.errors import UsageError
from tailtrain.runtime.config import TrainConfig
from tailtrain.runtime.launching.endpoint import Endpoint, reserve
from tailtrain.runtime.launching.launch import launch
from tailtrain.runtime.launching.topologies import check_topology
from tailtrain.sim.run import simulate
from tailtrain.strategies.base import Topology
from tailtrain.strategies.registry import BUILDERS, parse_strategy
from tailtrain.topology import partial, ps

WORKERS, ITERATIONS, SEED = 2, 3, 0

#: a spec of every registered strategy, runnable with 2 workers
SPECS = {
    "sync": "sync",
    # two calibration rounds: Algorithm 2's S_eff averages them, so a tau* that cuts the fast
    # rank must clear both of its measured rounds (one round let a single stall of the slow
    # rank put tau* a hair above the fast rank's time); the third round runs under tau*
    "dropcompute": "dropcompute:threshold=auto,calibrate=2",
    "local-sgd": "local-sgd:period=2",
    "k-sync": "k-sync:k=1",
    "k-batch-sync": "k-batch-sync:k=1",
    "k-async": "k-async:k=1",
    "k-batch-async": "k-batch-async:k=1",
    "async": "async",
    "dbw": "dbw",
    "b-dbw": "b-dbw",
    "adasync": "adasync:base=k-sync,k0=2,interval=1",
    "lgc": "lgc:k=1,blocks=2",
    "eager": "eager:mode=majority",
    "dbw-quorum": "dbw-quorum",
    "rebalance": "rebalance:warmup=1",
}
#: combinations an engine must deal beyond a strategy's plain spec: rebalance's carried cut
#: (``AllreducePlan.carry_cut``), here with a threshold that cuts the slower rank's unit
VARIANTS = (
    "rebalance:warmup=1,then=dropcompute,threshold=0.03,defer=true",
    "rebalance:deal=demand",  # the store deals each micro-batch to whichever rank asks
)
BY_TOPOLOGY = {
    t: [s for s in (*SPECS.values(), *VARIANTS) if parse_strategy(s).topology is t]
    for t in Topology
}


def scenario() -> Scenario:
    return Scenario(
        task="logreg",
        workers=WORKERS,
        iterations=ITERATIONS,
        eval_every=ITERATIONS,
        delay="const:value=0.02",
        pattern="linear:step=0.02",
    )


def test_the_matrix_covers_every_registered_strategy():
    assert set(SPECS) == set(BUILDERS)
    assert all(BY_TOPOLOGY.values())  # every topology has strategies to run


#: the row columns each topology's ledger declares only the simulator fills
SIMULATED_ONLY = {
    Topology.PARAMETER_SERVER: ps.SIMULATED_ONLY,
    Topology.PARTIAL_COLLECTIVE: partial.SIMULATED_ONLY,
    Topology.ALLREDUCE: (),
}


def check_losses(spec: str, steps: list[dict]) -> None:
    """Every round that ran something has a finite loss; one that ran nothing (a measured
    tau* may stop every rank before its first micro-batch on a loaded machine) is marked
    ``empty``, with no rank used and no loss (``topology.allreduce.step_row``); some ran."""
    for row in steps:
        if row.get("empty"):
            assert row["k"] == 0 and row["workers"] == [] and math.isnan(row["loss"]), spec
        else:
            assert math.isfinite(row["loss"]), (spec, row)
    assert not all(row.get("empty") for row in steps), spec


@pytest.fixture(scope="module", params=list(Topology), ids=str)
def trained(request):
    specs = BY_TOPOLOGY[request.param]
    configs = [TrainConfig(scenario(), spec, seed=SEED, inject=True, timeout=60) for spec in specs]
    results = launch(configs, reserve(Endpoint("127.0.0.1", 0)))[0]
    return dict(zip(specs, (r.record for r in results), strict=True))


@pytest.mark.timeout(300)
def test_every_strategy_trains_on_its_runtime_topology_and_keeps_the_simulators_record(trained):
    lacking = {}
    for spec, record in trained.items():
        rule = parse_strategy(spec)
        check_topology(rule)  # what launching.checks.validate checks first
        assert len(record.steps) == ITERATIONS, spec
        check_losses(spec, record.steps)
        simulated = simulate(scenario(), rule, SEED)
        # one ledger per topology: the measured rows and summary carry every key the
        # simulated ones do (a measured wall_time stands for the virtual_time), but the
        # columns the topology's ledger declares only the simulator can fill
        rows = set(simulated.steps[0]) - set(record.steps[0]) - set(SIMULATED_ONLY[rule.topology])
        summary = set(simulated.summary) - set(record.summary) - {"virtual_time"}
        if rows or summary:
            lacking[spec] = {"rows": sorted(rows), "summary": sorted(summary)}
    assert not lacking, f"train's records lack what simulate's have: {lacking}"


@pytest.mark.parametrize("spec", list(SPECS.values()))
def test_the_user_loop_runs_allreduce_rules_and_refuses_the_rest(spec):
    from tailtrain.integrate.rounds import as_strategy
    from tailtrain.integrate.step import DEALS

    rule = parse_strategy(spec)
    if rule.topology is Topology.ALLREDUCE and spec.startswith(("sync", "dropcompute", "local")):
        assert as_strategy(rule) is rule
        return
    if spec.startswith("rebalance"):  # StragglerStep deals its shares; the DDP hook does not
        assert as_strategy(rule, DEALS) is rule
        with pytest.raises(UsageError, match="needs shares") as refused:
            as_strategy(rule)
        assert "\n" not in str(refused.value)
        return
    with pytest.raises(UsageError, match="topology") as refused:
        as_strategy(rule)
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize("spec", VARIANTS)
def test_the_user_loop_deals_on_demand_and_refuses_the_carried_cut_in_one_line(spec):
    """``StragglerStep`` deals shares and the pool on demand, but does not carry a cut
    (``Strategy.needs``)."""
    from tailtrain.integrate.rounds import as_strategy
    from tailtrain.integrate.step import DEALS

    rule = parse_strategy(spec)
    if "carry" not in rule.needs:
        assert as_strategy(rule, DEALS) is rule
        return
    with pytest.raises(UsageError, match=r"needs carry") as refused:
        as_strategy(rule, DEALS)
    assert "\n" not in str(refused.value)


def test_simulate_runs_every_strategy():
    for spec in (*SPECS.values(), *VARIANTS):
        record = simulate(scenario(), parse_strategy(spec), SEED)
        assert len(record.steps) == ITERATIONS and np.isfinite(record.column("loss")).all()


# ---- the user-factory column: the same matrix on a task from `--task module:factory` -----

USER_MODULE = "conformance_user_task"
USER_SOURCE = """
import torch
import torch.nn.functional as F
from torch import nn

from tailtrain import TaskParts


def make(hidden=8):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 6, generator=g)
    y = (x[:, 0] + x[:, 1] > 0).long()
    model = nn.Sequential(nn.Linear(6, hidden), nn.Tanh(), nn.Linear(hidden, 2))
    return TaskParts(
        model=model, loss=lambda out, t: F.cross_entropy(out, t, reduction="none"),
        train=(x[:200], y[:200]), test=(x[200:], y[200:]), batch_size=8,
    )
"""


@pytest.fixture(scope="module")
def user_scenario(tmp_path_factory):
    """The matrix's scenario on a user's factory, importable from a temporary folder."""
    import dataclasses
    import sys

    folder = tmp_path_factory.mktemp("user_task")
    (folder / f"{USER_MODULE}.py").write_text(USER_SOURCE)
    sys.path.insert(0, str(folder))
    yield dataclasses.replace(scenario(), task=f"{USER_MODULE}:make:hidden=6")
    sys.path.remove(str(folder))
    sys.modules.pop(USER_MODULE, None)


@pytest.fixture(scope="module", params=list(Topology), ids=str)
def trained_user(request, user_scenario):
    specs = BY_TOPOLOGY[request.param]
    configs = [
        TrainConfig(user_scenario, spec, seed=SEED, inject=True, timeout=60) for spec in specs
    ]
    results = launch(configs, reserve(Endpoint("127.0.0.1", 0)))[0]
    return dict(zip(specs, (r.record for r in results), strict=True))


@pytest.mark.timeout(300)
def test_every_strategy_trains_a_user_factory_on_its_runtime_topology(trained_user):
    for spec, record in trained_user.items():
        assert len(record.steps) == ITERATIONS, spec
        check_losses(spec, record.steps)
        assert record.summary["gradients"] == "vmap", spec


def test_simulate_runs_every_strategy_on_a_user_factory(user_scenario):
    for spec in SPECS.values():
        record = simulate(user_scenario, parse_strategy(spec), SEED)
        assert len(record.steps) == ITERATIONS and np.isfinite(record.column("loss")).all()
        assert record.summary["gradients"] == "vmap"
