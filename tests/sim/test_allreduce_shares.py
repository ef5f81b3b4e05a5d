"""The allreduce simulator with per-rank shares (``strategies.rebalance``): sync's global
batch dealt by shares, equal speeds equal sync bit for bit, the weighted update is
single-process SGD on the concatenated samples, and the shares land in the record."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tailtrain.core.scenario import Scenario, World
from tailtrain.sim.allreduce.engine import AllreduceEngine
from tailtrain.sim.allreduce.timing import share_rule, stop_rule
from tailtrain.sim.run import simulate
from tailtrain.strategies.base import AllreducePlan, Context
from tailtrain.strategies.registry import parse_strategy
from tailtrain.tasks.stream import deal

NOISE = "const:value=0.01+dropcompute-noise:scale=0.01"  # DropCompute App. B.1, i.i.d.


class CaptureTask:
    """Delegates to a task and keeps the parameters of the last evaluation."""

    def __init__(self, task) -> None:
        self._task = task
        self.theta = None

    def __getattr__(self, name):
        return getattr(self._task, name)

    def evaluate(self, theta):
        self.theta = theta.clone()
        return self._task.evaluate(theta)


def run(text: str, scenario: Scenario, seed: int = 0):
    world = World.build(scenario, seed)
    task = CaptureTask(world.task)
    record = simulate(scenario, parse_strategy(text), seed, task=task)
    return record, task.theta


def test_deal_hands_out_the_global_batch_in_order():
    batches = np.arange(3 * 2 * 1).reshape(3, 2, 1)  # micro-batches 0..5, worker-major
    dealt = deal(batches, np.array([3, 1, 2]))
    assert dealt[0, :3, 0].tolist() == [0, 1, 2]
    assert dealt[1, :1, 0].tolist() == [3]
    assert dealt[2, :2, 0].tolist() == [4, 5]
    np.testing.assert_array_equal(deal(batches, np.array([2, 2, 2])), batches)


@pytest.mark.parametrize("text", ["rebalance:warmup=2", "rebalance:warmup=2,then=dropcompute"])
def test_equal_speeds_give_syncs_run_bit_for_bit(text):
    """i.i.d. noise moves no share, so rebalance is sync's run (and with DropCompute on top,
    DropCompute's): same draws, same data, same parameters, same clock."""
    scenario = Scenario(
        task="logreg", workers=4, micro_batches=3, delay=NOISE, iterations=30, eval_every=10
    )
    record, theta = run(text, scenario)
    base, base_theta = run("sync" if "then" not in text else "dropcompute", scenario)
    assert all(row["shares"] == [3] * 4 for row in record.steps)
    assert record.column("loss").tolist() == base.column("loss").tolist()
    assert record.column("time").tolist() == base.column("time").tolist()
    assert torch.equal(theta, base_theta)


def test_a_deferred_cut_keeps_dropcomputes_clock_and_loses_no_micro_batch():
    """With the cut carried (``defer=true``), the threshold, counts and clock are DropCompute's
    bit for bit; what it cut is dealt first in the next step, so only the last step's cut
    is never computed, and the data (hence the parameters) differ."""
    scenario = Scenario(
        task="logreg", workers=4, micro_batches=3, delay=NOISE, iterations=30, eval_every=10
    )
    record, theta = run("rebalance:warmup=2,then=dropcompute,calibrate=5,defer=true", scenario)
    base, base_theta = run("dropcompute:calibrate=5", scenario)
    for key in ("time", "threshold", "drop_rate"):
        assert record.column(key).tolist() == base.column(key).tolist()
    cut = [sum(r["shares"]) - sum(r["completed"]) for r in record.steps]
    assert [r["deferred"] for r in record.steps] == cut and sum(cut) > 0
    summary = record.summary
    assert summary["deferred_rate"] == pytest.approx(sum(cut) / (30 * 12))
    assert summary["dropped_micro_batches"] == cut[-1]
    assert not torch.equal(theta, base_theta)


def test_the_weighted_update_is_single_process_sgd_on_the_dealt_samples():
    scenario = Scenario(
        task="logreg", workers=4, micro_batches=4, delay="const:value=1", iterations=1
    )
    world = World.build(scenario, 0)
    engine = AllreduceEngine(world)
    rule = parse_strategy("rebalance")
    state = rule.init(Context(n_workers=4, micro_batches=4))
    plan = AllreducePlan(k=4, shares=(7, 1, 5, 3))
    before = engine.learner.theta.clone()
    played = engine.play(plan)
    assert played.candidates.units.tolist() == [7 / 4, 1 / 4, 5 / 4, 3 / 4]
    engine.apply(plan, rule.select(state, played.candidates), played)
    # every micro-batch of the step sync would draw, once, in one process
    samples = engine.learner.batches(0, 4).reshape(16, -1)
    _, grads = world.task.grads(before, samples)
    expected = before - world.lr * grads.mean(dim=0)
    # float32 parameters: only the order of the sums differs
    torch.testing.assert_close(engine.learner.theta, expected, rtol=1e-5, atol=1e-7)
    # averaging the ranks' gradients equally instead would weigh rank 1's one micro-batch
    # as much as rank 0's seven: a different step
    owners = np.repeat(np.arange(4), [7, 1, 5, 3])
    per_rank = torch.stack([grads[torch.from_numpy(owners == r)].mean(0) for r in range(4)])
    unweighted = before - world.lr * per_rank.mean(dim=0)
    assert not torch.allclose(engine.learner.theta, unweighted, rtol=1e-5, atol=1e-7)


def test_a_persistent_slowdown_moves_the_shares_and_the_record_keeps_them():
    scenario = Scenario(
        task="none",
        workers=8,
        micro_batches=12,
        delay=NOISE,
        pattern="slowdown:at=0,fraction=0.5,factor=1.4",
        iterations=40,
    )
    record = simulate(scenario, parse_strategy("rebalance"), 0)
    sync = simulate(scenario, parse_strategy("sync"), 0)
    for row in record.steps:
        assert sum(row["shares"]) == 96 and min(row["shares"]) >= 1
        assert row["completed"] == row["shares"] and row["drop_rate"] == 0.0
    last = np.array(record.steps[-1]["shares"])
    assert sorted(last)[:4] == sorted(last[last < 12]) and (last < 12).sum() == 4
    late = slice(20, None)
    assert record.column("time")[-1] < sync.column("time")[-1]
    assert record.column("compute_time")[late].mean() < sync.column("compute_time")[late].mean()


def test_train_and_a_users_loop_refuse_it_before_anything_runs():
    from tailtrain.errors import UsageError
    from tailtrain.integrate.rounds import as_strategy

    with pytest.raises(UsageError, match="needs shares") as refused:
        as_strategy("rebalance")
    assert "\n" not in str(refused.value)


@settings(max_examples=40, deadline=None)
@given(
    st.integers(1, 6),
    st.integers(1, 5),
    st.sampled_from([0.0, 0.5, 1.5, 3.0, float("inf")]),
    st.booleans(),
    st.integers(0, 2**32 - 1),
    st.booleans(),
)
def test_equal_shares_stop_as_syncs_rounds_do(n, m, tau, preempt, seed, cuttable):
    """share_rule with every share M is stop_rule, for both stopping conventions and units
    that can or cannot be cut; a share counts only its own units, and one that cannot be cut
    ends at the end of its unit in flight, within its share."""
    times = np.random.default_rng(seed).exponential(0.5, (n, 3 * m))
    ours = share_rule(times[:, :m], np.full(n, m), m, tau, preempt, cuttable)
    theirs = stop_rule(times[:, :m], tau, preempt, cuttable)
    for field in ("done", "compute", "full"):
        np.testing.assert_array_equal(getattr(ours, field), getattr(theirs, field))
    shares = np.random.default_rng(seed + 1).integers(1, 3 * m + 1, n)
    uneven = share_rule(times, shares, m, tau, preempt, cuttable)
    assert (uneven.done <= shares).all()
    # each rank stops on its own units as a round of its share's length would
    for rank in range(n):
        alone = stop_rule(times[rank : rank + 1, : shares[rank]], tau, preempt, cuttable)
        assert uneven.done[rank] == alone.done[0]
        assert uneven.compute[rank] == pytest.approx(alone.compute[0], abs=1e-12)
    if tau == float("inf"):
        np.testing.assert_array_equal(uneven.done, shares)
        own = np.where(np.arange(3 * m) < shares[:, None], times, 0.0).sum(axis=1)
        np.testing.assert_allclose(uneven.compute, own)


# ---- dealt on demand (rebalance:deal=demand) ----------------------------------------------
def test_dealt_on_demand_every_micro_batch_of_the_stream_is_computed_once(monkeypatch):
    """Each step computes exactly N M micro-batches, the carried ones first; the unit each rank
    had in flight at the N M-th completion is carried, so over the run every micro-batch of
    sync's stream is computed exactly once but the last step's cut, still queued."""
    from tailtrain.tasks.stream import Draws
    from tailtrain.topology.allreduce import RoundData

    computed, kept = [], []
    original = RoundData.on_demand

    def spy(self, index, done, m):
        out = original(self, index, done, m)
        computed.extend(out[n, j].tolist() for n in range(len(done)) for j in range(done[n]))
        kept.append(self.carry.queue.tolist())
        return out

    monkeypatch.setattr(RoundData, "on_demand", spy)
    scenario = Scenario(
        task="logreg",
        workers=3,
        micro_batches=2,
        delay=NOISE,
        pattern="slowdown:at=0,fraction=0.34,factor=2",
        iterations=25,
    )
    record, _ = run("rebalance:deal=demand", scenario)
    for row in record.steps:
        assert sum(row["completed"]) == 6 and row["drop_rate"] == 0.0
        assert all(d - c in (0, 1) for d, c in zip(row["shares"], row["completed"], strict=True))
        assert row["deferred"] == sum(row["shares"]) - 6
    assert record.summary["dropped_micro_batches"] == record.steps[-1]["deferred"] == len(kept[-1])
    world = World.build(scenario, 0)
    stream = Draws(world.partition, 0, world.task.batch_size, 3)
    taken = len(computed) + len(kept[-1])
    rounds = -(-taken // 6)
    flat = np.concatenate([stream.round(r, 2).reshape(6, -1) for r in range(rounds)])[:taken]
    assert sorted(computed + kept[-1]) == sorted(flat.tolist())  # each once, none lost
    assert len(computed) == 25 * 6


def test_dealt_on_demand_the_update_is_sgd_on_the_computed_samples():
    """Weights C_n / M over N with sum_n C_n = N M: the update is single-process SGD on the
    step's computed micro-batches, whichever rank computed them."""
    scenario = Scenario(
        task="logreg", workers=3, micro_batches=2, delay="exp:rate=10", iterations=1
    )
    world = World.build(scenario, 1)
    engine = AllreduceEngine(world)
    rule = parse_strategy("rebalance:deal=demand")
    state = rule.init(Context(n_workers=3, micro_batches=2))
    plan = rule.plan(state)
    before = engine.learner.theta.clone()
    played = engine.play(plan)
    stops = played.detail[1]
    assert stops.done.sum() == 6 and stops.compute.tolist() == [stops.compute[0]] * 3
    first = engine.learner.carry.take(engine.learner.drawn, 3, 2, int(stops.dealt.sum()))
    engine.learner.carry.taken = 0  # the same micro-batches again for the engine's own deal
    engine.apply(plan, rule.select(state, played.candidates), played)
    index = played.detail[4][1]
    counted = index[(index >= 0) & (np.arange(index.shape[1]) < stops.done[:, None])]
    _, grads = world.task.grads(before, first[np.sort(counted)])
    expected = before - world.lr * grads.mean(dim=0)
    torch.testing.assert_close(engine.learner.theta, expected, rtol=1e-5, atol=1e-7)


def test_dealt_on_demand_without_stragglers_is_syncs_run():
    """Constant, equal micro-batch times: every rank completes its M at the same instants and
    nothing is cut: sync's clock, and sync's global batch each step. The asks are served
    rank by rank (rank 0 takes micro-batches 0 and N, not 0 and 1), so only the order of the
    float sums differs from sync's."""
    scenario = Scenario(
        task="logreg", workers=3, micro_batches=2, delay="const:value=0.1", iterations=6
    )
    record, theta = run("rebalance:deal=demand", scenario)
    base, base_theta = run("sync", scenario)
    assert all(row["shares"] == row["completed"] == [2] * 3 for row in record.steps)
    assert record.column("time").tolist() == base.column("time").tolist()
    np.testing.assert_allclose(record.column("loss"), base.column("loss"), rtol=1e-6)
    torch.testing.assert_close(theta, base_theta)
