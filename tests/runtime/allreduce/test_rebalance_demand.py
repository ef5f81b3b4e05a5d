"""`tailtrain train --strategy rebalance:deal=demand` on real gloo ranks (issue 25): the run's
store deals the micro-batches to whichever rank asks next until N M are complete, as
`simulate` deals them on its virtual clock (``strategies.rebalance.on_demand``), and every
rank carries the same cut units to the next step.

Three ranks, M = 4 (12 micro-batches a step); ranks 0 and 1 are 1.7x slower (136 ms a
micro-batch against 80 ms, injected; the compute is ~1 ms). Completions at 80, 136 (x2),
160, 240, 272 (x2), 320, 400, 408 (x2), 480: the 12th is rank 2's 6th at 480 ms, when the
slow ranks' 4th units (started at 408, ending at 544) are cut. So every step counts 3, 3
and 6, deals 4, 4 and 6, and carries 2; each decision sits >= 60 ms from the nearest other
event, so the decisions are the simulator's.
"""

from __future__ import annotations

import numpy as np
import pytest

from tailtrain.core.scenario import Scenario
from tailtrain.runtime.config import TrainConfig
from tailtrain.runtime.launch import Endpoint, launch, reserve
from tailtrain.sim.run import simulate
from tailtrain.strategies.registry import parse_strategy

N, M, SEED, ITERATIONS = 3, 4, 3, 6
SPEC = "rebalance:deal=demand"
SCENARIO = Scenario(
    task="logreg",
    workers=N,
    micro_batches=M,
    iterations=ITERATIONS,
    eval_every=100,
    delay="const:value=0.08",
    pattern="slowdown:at=0,fraction=0.67,factor=1.7",
)
DECISIONS = ("shares", "completed", "deferred")


@pytest.fixture(scope="module")
def trained():
    config = TrainConfig(scenario=SCENARIO, strategy=SPEC, seed=SEED, inject=True, timeout=60)
    return launch([config], reserve(Endpoint("127.0.0.1", 0)))


@pytest.mark.timeout(120)
def test_train_deals_on_demand_as_simulate_does(trained):
    steps = trained[0][0].record.steps
    simulated = simulate(SCENARIO, parse_strategy(SPEC), SEED).steps
    decisions = [[row[key] for key in DECISIONS] for row in steps]
    assert decisions == [[row[key] for key in DECISIONS] for row in simulated]
    assert decisions[0] == [[4, 4, 6], [3, 3, 6], 2]  # the case is not a trivial one
    # the same micro-batches counted every step (the carried ones first): the same loss, up
    # to the order of the float sums (which rank took which is the store's order)
    np.testing.assert_allclose(
        [r["loss"] for r in steps], [r["loss"] for r in simulated], rtol=1e-5
    )
    for rank in range(N):  # every rank carried the same units: the same parameters
        assert np.array_equal(trained[rank][0].theta, trained[0][0].theta)
    summary = trained[0][0].record.summary
    assert summary["dropped_micro_batches"] == steps[-1]["deferred"] == 2
