"""`tailtrain train --strategy rebalance:deal=demand` on real gloo ranks (issue 25): the run's
store deals the micro-batches to whichever rank asks next until N M are complete, as
`simulate` deals them on its virtual clock (``strategies.rebalance.on_demand``), and every
rank carries the same cut units to the next step.

Three ranks, M = 4 (12 micro-batches a step); ranks 0 and 1 are 1.8x slower (540 ms a
micro-batch against 300 ms, injected; the compute is ~1 ms). Completions at 300, 540 (x2),
600, 900, 1080 (x2), 1200, 1500, 1620 (x2), 1800: the 12th is rank 2's 6th at 1800 ms, when
the slow ranks' 4th units (asked at 1620, ending at 2160) are cut. So every step counts 3, 3
and 6, deals 4, 4 and 6, and carries 2. Which micro-batches count depends on the order of
the asks too (the k-th ask takes the k-th micro-batch): asks that come together (at 0 ms,
and the slow ranks' at 540, 1080 and 1620) share a fate, and every other pair of events,
the asks with different fates (rank 2's at 1500, the slow ranks' at 1620) included, is
>= 120 ms apart, so the decisions and the data are the simulator's. (At 100 ms a
micro-batch the margin was 40 ms, and at 200 ms 80 ms: each was once overshot by a rank on a
loaded 2-core machine, the same decisions with one other micro-batch counted, the loss
0.2-0.3% off.)
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from tests.cli.helpers import run

from tailtrain.core.scenario import Scenario
from tailtrain.runtime.config import TrainConfig
from tailtrain.runtime.launching.endpoint import Endpoint, reserve
from tailtrain.runtime.launching.launch import launch
from tailtrain.sim.run import simulate
from tailtrain.strategies.registry import parse_strategy

N, M, SEED, ITERATIONS = 3, 4, 3, 6
MICRO_BATCH = 0.3  #: injected seconds per micro-batch of a fast rank
SPEC = "rebalance:deal=demand"
SCENARIO = Scenario(
    task="logreg",
    workers=N,
    micro_batches=M,
    iterations=ITERATIONS,
    eval_every=100,
    delay=f"const:value={MICRO_BATCH}",
    pattern=(SLOW := "slowdown:at=0,fraction=0.67,factor=1.8"),
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


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_the_carried_units_survive_a_checkpoint_and_resume(tmp_path, capfd, trained):
    folder = tmp_path / "run"
    argv = [
        "train", "--task", "logreg", "--workers", str(N), "--micro-batches", str(M),
        "--iterations", str(ITERATIONS), "--eval-every", "100", "--seed", str(SEED),
        "--timeout", "30", "--delay", f"const:value={MICRO_BATCH}", "--pattern", SLOW,
        "--strategy", SPEC, "--out", str(folder), "--checkpoint-every", "2",
    ]  # fmt: skip
    code, _, err = run([*argv, "--inject-fault", "kill:worker=1,step=3"], capfd)
    assert code == 1 and "checkpoint of step 2" in err, err
    code, _, err = run(["train", "--resume", str(folder)], capfd)  # a new store: new keys
    assert code == 0, err
    rows = [json.loads(line) for line in (folder / "steps.jsonl").read_text().splitlines()]
    whole = trained[0][0].record.steps
    assert [row["step"] for row in rows] == list(range(ITERATIONS))
    # the carried units and the stream position are the uninterrupted run's: the same
    # decisions and micro-batches (a lost queue would shift every batch after)
    pick = lambda rows: [[row[key] for key in DECISIONS] for row in rows]  # noqa: E731
    assert pick(rows[2:]) == pick(whole[2:])
    np.testing.assert_allclose(
        [r["loss"] for r in rows[2:]], [r["loss"] for r in whole[2:]], rtol=1e-5
    )
