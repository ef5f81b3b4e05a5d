"""The partial collective's rule on the reducer thread (runtime.partial.rule.Rule): the agreed
model takes each round's step once, whatever the order in which the reducer thread applies a
round and the main thread rebases on an average; a screened-out gradient is left out by its
``screened`` column."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from tailtrain.runtime.partial.rule import Rule, measured_round_row
from tailtrain.runtime.partial.wire import pack_round, row, slot_width, unpack_round
from tailtrain.strategies.eager import Collective, RoundPlan

LR = 0.5


def rule() -> Rule:
    world = SimpleNamespace(
        context=SimpleNamespace(n_workers=1),
        scenario=SimpleNamespace(comm_time=None),
        seed=0,
        lr=LR,
    )
    strategy = SimpleNamespace(init=lambda context: None)
    keeper = SimpleNamespace(completed=lambda *args, **kwargs: None)
    return Rule(world, strategy, 0, False, torch.zeros(2), keeper)


def record(r: Rule, index: int, total: list[float]) -> tuple[torch.Tensor, float, float]:
    """What after_round does before the agreed model takes the step: the step is known."""
    step = (torch.tensor(total), 1.0, 1.0)
    r.steps[index] = step
    return step


def test_a_rebase_between_a_rounds_step_and_its_application_applies_it_once():
    r = rule()
    r.keep(0, record(r, 0, [1.0, 0.0]), average=True)  # round 0 ends with a model average
    late = record(r, 1, [0.0, 2.0])  # the reducer has round 1's step, not yet applied...
    average = torch.tensor([10.0, 10.0])
    r.rebase(0, average)  # ...when the main thread learns round 0's average
    r.keep(1, late, average=False)
    # theta_1 = average - lr * g_1: round 1 on the average, once
    torch.testing.assert_close(r.agreed, average - LR * torch.tensor([0.0, 2.0]))
    assert r.pending is None


def test_a_rebase_after_later_rounds_replays_them_on_the_average():
    r = rule()
    r.keep(0, record(r, 0, [1.0, 0.0]), average=True)
    r.keep(1, record(r, 1, [0.0, 2.0]), average=False)
    r.keep(2, record(r, 2, [4.0, 0.0]), average=False)
    average = torch.tensor([10.0, 10.0])
    r.rebase(0, average)
    torch.testing.assert_close(r.agreed, average - LR * torch.tensor([4.0, 2.0]))


def test_a_frozen_rule_draws_no_communication_time_and_draws_under_its_lock(monkeypatch):
    """handover_state captures the communication stream under the lock; an aborted reducer
    thread's after_round must neither draw once frozen nor draw outside the lock."""
    import threading

    from tailtrain.runtime.partial import rule as module

    r = rule()
    monkeypatch.setattr(module, "uniform_weight", lambda selection, keys: (1.0, 1.0))
    r.arrivals = lambda result: SimpleNamespace(keys=None)
    r.stats = lambda result, arrivals: None
    r.driver = SimpleNamespace(select=lambda arrivals: None)
    held: list[bool] = []

    def free_elsewhere() -> bool:  # whether another thread could take the lock now
        got: list[bool] = []

        def probe() -> None:
            got.append(r.lock.acquire(blocking=False))
            if got[0]:
                r.lock.release()

        thread = threading.Thread(target=probe)
        thread.start()
        thread.join()
        return got[0]

    def draw() -> float:
        held.append(not free_elsewhere())
        r.freeze_for_regroup()  # the main thread freezes the rule as the reducer sleeps
        return 0.0

    r.comm = SimpleNamespace(next=draw)
    plan = SimpleNamespace(average_models=False, lr_scale=1.0)
    result = SimpleNamespace(plan=plan, index=0, total=torch.zeros(2))
    assert r.after_round(result) is None  # frozen after the draw: counts nowhere
    assert held == [True] and r.done == 0
    assert r.after_round(result) is None and held == [True]  # frozen before: no draw


def test_a_lost_ranks_shard_is_skipped_one_mini_batch_a_round_whatever_m():
    """A partial job is one mini-batch (``batch``), its M micro-batches only the delay's
    shape: a round without a lost rank skips that one mini-batch's samples, not M of them
    (as the parked gradients a regroup drops count one mini-batch each)."""
    world = SimpleNamespace(
        scenario=SimpleNamespace(workers=4, micro_batches=8), task=SimpleNamespace(batch_size=32)
    )
    r = SimpleNamespace(
        world=world, members=[0, 1, 3], rank=0, base=0, carried=set(), lost=[2], skipped=32,
        joined=[], generation=1,
    )  # fmt: skip
    rows = torch.zeros(0, 9).numpy()
    columns = Rule.shrink_columns(r, SimpleNamespace(rows=rows, screened=rows[:, 8] > 0))
    assert columns["skipped"] == 32 + 1 * 32  # one parked gradient dropped, one rank lost
    assert columns["live"] == [0, 1, 3] and columns["dead"] == [2]


def test_the_screened_column_not_the_loss_leaves_a_gradient_out_of_its_round():
    """Round 0 of two ranks, both fresh; rank 1's gradient was screened out (zeros in the sum)
    yet carries a finite loss: its flag alone keeps it out of the loss, ``used`` and the
    row's ``workers``, and the row counts it in ``nonfinite`` (it arrived: NAP 2)."""
    dim, procs, width = 2, 2, slot_width(1)
    plan = RoundPlan(k=2, collective=Collective.QUORUM)
    mine = [row(0, 0, 0.0, 0.1, 0.5, 2.0)]
    theirs = [row(0, 0, 0.0, 0.2, 0.7, 0.0, screened=True)]
    payload = pack_round(dim, procs, width, 0, [(torch.ones(2), True)], [1, 0.0, 0.1, 1, 0], mine)
    payload += pack_round(dim, procs, width, 1, [(torch.zeros(2), True)], [0, 0, 0.2, 1, 0], theirs)
    result = unpack_round(0, plan, payload, dim, procs, done=0.3)
    assert result.screened.tolist() == [False, True]
    host = SimpleNamespace(world=SimpleNamespace(lr=LR), origin=0.0, base=0)
    arrivals = Rule.arrivals(host, result)
    stats = Rule.stats(host, result, arrivals)
    assert stats.loss == 0.5 and stats.grad_sq_sum == 2.0
    assert stats.used.tolist() == arrivals.keys[:1].tolist()
    measured = measured_round_row(result, stats)
    assert measured["workers"] == [0] and measured["nonfinite"] == 1 and measured["nap"] == 2
