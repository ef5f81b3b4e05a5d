"""`rebalance:deal=demand` under `--on-rank-loss shrink`: the global batch is kept (issue 37, 3.).

Four logreg ranks deal N M = 12 micro-batches a step on demand; rank 2 is killed at step 3
and started again (``--restart-lost 1``). The live ranks deal the whole pool among themselves
while it is away, and all four once it is healed, so every update applies 12 micro-batches
of the same stream. Rank 0 keeps each completed round's gathered deal (every unit's index in
the step's stream, as ``RoundData.on_demand`` receives them); the reference replays the
stream from those alone (the carried units first, then fresh ones of the job's N ranks'
global batches: ``tasks.stream.CarryOver``, written again here) and is plain SGD on each
step's counted micro-batches over N M, whoever computed them.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from tests.runtime.allreduce.test_shrink import LR, SEED, config, run

from tailtrain.runtime.allreduce.deal import OnDemand
from tailtrain.runtime.allreduce.rounds import train_allreduce
from tailtrain.runtime.config import TrainConfig
from tailtrain.runtime.reduce import Collectives
from tailtrain.tasks import parse_partition, parse_task
from tailtrain.tasks.stream import job_batches

N, M, KILLED, AT = 4, 3, 2, 3
POOL = N * M


def tells_deals(cfg: TrainConfig, comm: Collectives):
    """Each completed round's gathered deal on this rank, by step, in its summary
    (``deals``: every rank's dealt indices, -1 past them, and counted units)."""
    keep, deals = OnDemand.keep, {}

    def kept(self, run, rows):
        deals[run.step] = (rows[3].astype(np.int64).tolist(), rows[0][:, 0].astype(int).tolist())
        return keep(self, run, rows)

    OnDemand.keep = kept
    result = train_allreduce(cfg, comm)
    result.record.summary["deals"] = deals
    return result


def replayed(cfg: TrainConfig, deals: dict[int, tuple]) -> tuple[torch.Tensor, list, list]:
    """SGD on each step's counted micro-batches over N M (weights C_n / M over N), the
    micro-batch of the k-th dealt unit the k-th of the carried ones then the fresh stream.
    Also each step's counted stream positions and those still carried at the end."""
    s = cfg.scenario
    task = parse_task(s.task, seed=SEED)
    partition = parse_partition(s.partition).assign(task, N, np.random.default_rng(SEED))

    rounds: dict[int, np.ndarray] = {}

    def batch(position: int) -> np.ndarray:  # the stream: round-major, then rank, then unit
        r, rest = divmod(position, POOL)
        if r not in rounds:  # every rank's micro-batches of round r, keyed (seed, rank, r)
            ranks = np.arange(N)
            drawn = job_batches(partition, SEED, task.batch_size, ranks, np.full(N, r), M)
            rounds[r] = drawn.reshape(POOL, -1)
        return rounds[r][rest]

    theta, queue, taken, counted = task.init_params(SEED), [], 0, []
    for step in range(s.iterations):
        index, done = (np.asarray(x) for x in deals[step])
        dealt = np.count_nonzero(index >= 0, axis=1)
        # the k-th ask took the k-th micro-batch: the asks are 0..D-1, none twice or skipped
        assert sorted(index[index >= 0].tolist()) == list(range(int(dealt.sum())))
        fresh = range(taken, taken + max(0, int(dealt.sum()) - len(queue)))
        pool = queue + list(fresh)
        taken, queue = taken + len(fresh), queue[int(dealt.sum()) :]
        counted.append([pool[k] for n in range(len(done)) for k in index[n, : done[n]]])
        queue += [pool[k] for n in range(len(done)) for k in index[n, done[n] : dealt[n]]]
        model = task.module_at(theta)
        b = np.stack([batch(p) for p in counted[-1]])  # (N M, B): the mean loss of each
        each = F.cross_entropy(
            model(task.data.x_train[b.reshape(-1)]),
            task.data.y_train[b.reshape(-1)],
            reduction="none",
        )
        loss = each.reshape(b.shape).mean(dim=1).sum() / (N * M)
        grads = torch.autograd.grad(loss, list(model.parameters()))
        theta = theta - LR * torch.cat([g.reshape(-1) for g in grads])
    return theta, counted, queue


@pytest.mark.slow  # four ranks, one started again, ~10 s of rounds: ~20 s on an idle machine
@pytest.mark.timeout(150)
def test_the_global_batch_is_kept_through_a_death_and_a_heal():
    cfg = config(
        N,
        [f"kill:worker={KILLED},step={AT}"],
        iterations=60,
        delay="const:value=0.04",  # ~10 s of rounds: a new process starts and joins in ~2 s
        strategy="rebalance:deal=demand",
        restart_lost=1,
    )
    cfg = dataclasses.replace(cfg, scenario=dataclasses.replace(cfg.scenario, micro_batches=M))
    by_rank = run(cfg, tells_deals)
    steps = by_rank[0][0].record.steps
    summary = by_rank[0][0].record.summary
    assert [r["step"] for r in steps] == list(range(cfg.scenario.iterations))
    back = next(i for i, r in enumerate(steps) if r["rejoined"])
    lives = [tuple(r["live"]) for r in steps]
    assert steps[AT]["dead"] == [KILLED] and back > AT and steps[back]["rejoined"] == [KILLED]
    assert lives[:AT] == [(0, 1, 2, 3)] * AT and set(lives[AT:back]) == {(0, 1, 3)}
    assert set(lives[back:]) == {(0, 1, 2, 3)}
    # (a) every update, before, during and after the loss, applied the whole pool; the
    # record says who computed how many, and no lost shard is skipped
    for row in steps:
        assert sum(row["completed"]) == POOL and len(row["completed"]) == len(row["live"])
        assert row["skipped"] == 0
    assert summary["drop_rate"] == 0.0
    # the round in flight at the death: every unit it had dealt, dealt again (counted once);
    # the heal came at a step boundary, with nothing in flight
    assert [g[2:4] for g in summary["generations"]] == [[[KILLED], []], [[], [KILLED]]]
    redone, healed = summary["redone_micro_batches"]
    assert redone >= POOL and healed == 0
    # (b) the parameters are SGD on each step's counted micro-batches, on every live rank
    deals = summary["deals"]
    for row in steps:
        index, done = deals[row["step"]]
        assert done == row["completed"]
        assert [sum(i >= 0 for i in units) for units in index] == row["shares"]
    want, counted, carried = replayed(cfg, deals)
    for rank in range(N):
        np.testing.assert_allclose(by_rank[rank][0].theta, want.numpy(), rtol=1e-4, atol=1e-5)
    # (c) no micro-batch of the stream entered two updates, and none was skipped: the counted
    # ones and the last step's carried ones are the stream's first ones, each once
    every = [p for step in counted for p in step]
    assert len(set(every)) == len(every) == POOL * cfg.scenario.iterations
    assert sorted(every + carried) == list(range(len(every) + len(carried)))
    assert len(carried) == steps[-1]["deferred"]
