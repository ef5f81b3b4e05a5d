"""`tailtrain train --strategy rebalance:then=dropcompute,defer=true` on real gloo ranks (issue
25): the micro-batches DropCompute's threshold cuts are dealt first in the next step's global
batch, as `simulate` deals them (``topology.allreduce.RoundData.dealt``), so every micro-batch
of the stream is computed exactly once.

Three ranks; ranks 0 and 1 are 2x slower (160 ms a micro-batch against 80 ms, injected; the
compute is ~1 ms). After the warm-up the shares are 3, 3 and 6 of 12, the only ones that
finish in 480 ms (the next best take 560), and the threshold, 0.46 s, lets the slow ranks
finish 2 (320 ms; the 3rd would end at 480) and the fast one 5 (400 ms; the 6th would end at
480): 3 micro-batches are carried every step, one from every rank. Every cut sits >= 20 ms
above and >= 60 ms below the threshold (a sleep never ends early; at half these delays a
loaded machine moved a cut by the 30 ms margin), so the decisions are the simulator's.
"""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from tests.cli.helpers import run

from tailtrain.core.scenario import Scenario
from tailtrain.runtime.config import TrainConfig
from tailtrain.runtime.launching.endpoint import Endpoint, reserve
from tailtrain.runtime.launching.launch import launch
from tailtrain.sim.run import simulate
from tailtrain.strategies.registry import parse_strategy
from tailtrain.tasks import parse_partition, parse_task
from tailtrain.tasks.stream import job_batches

N, M, SEED, ITERATIONS, LR = 3, 4, 3, 8, 0.1
SLOW = "slowdown:at=0,fraction=0.67,factor=2"
CARRIED = "rebalance:warmup=2,window=4,then=dropcompute,threshold=0.46,defer=true"
SCENARIO = Scenario(
    task="logreg",
    workers=N,
    micro_batches=M,
    iterations=ITERATIONS,
    eval_every=100,
    delay="const:value=0.08",
    pattern=SLOW,
)
DECISIONS = ("shares", "completed", "deferred")


@pytest.fixture(scope="module")
def trained():
    config = TrainConfig(scenario=SCENARIO, strategy=CARRIED, seed=SEED, inject=True, timeout=60)
    return launch([config], reserve(Endpoint("127.0.0.1", 0)))


@pytest.fixture(scope="module")
def simulated():
    return simulate(SCENARIO, parse_strategy(CARRIED), SEED)


def decisions(rows: list[dict]) -> list[tuple]:
    return [tuple(tuple(r[k]) if isinstance(r[k], list) else r[k] for k in DECISIONS) for r in rows]


@pytest.mark.timeout(120)
def test_train_carries_the_cut_as_simulate_does(trained, simulated):
    steps = trained[0][0].record.steps
    ours, theirs = decisions(steps), decisions(simulated.steps)
    # the run carries from every rank once the shares moved: the case is not a trivial one
    assert theirs[-1] == ((3, 3, 6), (2, 2, 5), 3)
    # the shares may move a round later than simulated (the first rounds run cold); where
    # they are the simulator's, so are the cut and the carried counts
    assert ours[-4:] == theirs[-4:]
    agree = 0
    while agree < len(ours) and ours[agree] == theirs[agree]:
        agree += 1
    assert agree >= 2, (ours, theirs)
    # until the decisions part, every step trains on the same micro-batches: the same loss
    np.testing.assert_allclose(
        [r["loss"] for r in steps[:agree]],
        [r["loss"] for r in simulated.steps[:agree]],
        rtol=1e-5,
    )
    summary = trained[0][0].record.summary
    assert summary["dropped_micro_batches"] == steps[-1]["deferred"]
    dealt = N * M * ITERATIONS
    assert summary["deferred_rate"] == pytest.approx(sum(r["deferred"] for r in steps) / dealt)
    for rank in range(N):  # every rank kept the same queue: the same parameters
        assert np.array_equal(trained[rank][0].theta, trained[0][0].theta)


def fresh_stream(task, partition, rounds: int) -> np.ndarray:
    """Sync's global batches one after another, worker-major (N M micro-batches a round)."""
    per_round = [
        job_batches(partition, SEED, task.batch_size, np.arange(N), np.full(N, r), M)
        for r in range(rounds)
    ]
    return np.concatenate([b.reshape(N * M, -1) for b in per_round])


def computed_by_step(rows: list[dict], stream: np.ndarray) -> tuple[list[np.ndarray], list]:
    """Replays a run's shares and counts on the stream, written out here as the carry's
    definition: each step's global batch is last step's cut, then fresh micro-batches up to
    N M, dealt in order by the shares; a rank's undone tail is carried. Returns each step's
    computed micro-batches and the ones still carried at the end."""
    queue, taken, out = [], 0, []
    for row in rows:
        need = N * M - len(queue)
        batch = queue + list(stream[taken : taken + need])
        taken += need
        starts = np.cumsum([0, *row["shares"]])
        done, queue = [], []
        for rank, (share, count) in enumerate(zip(row["shares"], row["completed"], strict=True)):
            mine = batch[starts[rank] : starts[rank] + share]
            done += mine[:count]
            queue += mine[count:]
        out.append(np.array(done))
    return out, queue


@pytest.mark.timeout(120)
def test_every_micro_batch_is_computed_exactly_once_and_the_update_is_sgd_on_them(trained):
    rows = trained[0][0].record.steps
    task = parse_task(SCENARIO.task, seed=SEED)
    partition = parse_partition(SCENARIO.partition).assign(task, N, np.random.default_rng(SEED))
    stream = fresh_stream(task, partition, ITERATIONS + 1)
    computed, left = computed_by_step(rows, stream)
    used = sum(len(c) for c in computed) + len(left)
    key = lambda batch: tuple(batch.tolist())  # noqa: E731
    # the first `used` micro-batches of the stream: each computed once or still carried
    assert Counter(map(key, [*np.concatenate(computed), *left])) == Counter(map(key, stream[:used]))
    assert len(left) == rows[-1]["deferred"]
    # the update: (1 / (N M)) times the sum of the computed micro-batches' mean gradients
    theta = task.init_params(SEED)
    for done in computed:
        model = task.module_at(theta)
        x, y = task.data.x_train[done.reshape(-1)], task.data.y_train[done.reshape(-1)]
        loss = F.cross_entropy(model(x), y) * (len(done) / (N * M))
        grads = torch.autograd.grad(loss, list(model.parameters()))
        theta = theta - LR * torch.cat([g.reshape(-1) for g in grads])
    np.testing.assert_allclose(trained[0][0].theta, theta.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.timeout(240)
def test_the_carried_cut_survives_a_checkpoint_and_resume(tmp_path, capfd, trained):
    folder = tmp_path / "run"
    argv = [
        "train", "--task", "logreg", "--workers", str(N), "--micro-batches", str(M),
        "--iterations", str(ITERATIONS), "--eval-every", "100", "--seed", str(SEED),
        "--timeout", "30", "--delay", "const:value=0.08", "--pattern", SLOW,
        "--strategy", CARRIED, "--out", str(folder), "--checkpoint-every", "2",
    ]  # fmt: skip
    code, _, err = run([*argv, "--inject-fault", "kill:worker=1,step=5"], capfd)
    assert code == 1 and "checkpoint of step 4" in err, err
    code, _, err = run(["train", "--resume", str(folder)], capfd)
    assert code == 0, err
    rows = [json.loads(line) for line in (folder / "steps.jsonl").read_text().splitlines()]
    whole = trained[0][0].record.steps
    assert [row["step"] for row in rows] == list(range(ITERATIONS))
    # after the resume the queue and the stream position are the uninterrupted run's: the
    # same decisions, and the same micro-batches (a lost queue would shift every batch after)
    assert decisions(rows)[4:] == decisions(whole)[4:]
    np.testing.assert_allclose(
        [r["loss"] for r in rows[4:]], [r["loss"] for r in whole[4:]], rtol=1e-5
    )
