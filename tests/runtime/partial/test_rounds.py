"""The eager topology's agreed model (runtime.partial.rounds.Rule): each round's step once,
whatever the order in which the reducer thread applies a round and the main thread rebases
on an average."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from tailtrain.runtime.partial.rounds import Rule

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

    from tailtrain.runtime.partial import rounds as module

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


@pytest.mark.timeout(120)
def test_train_exports_every_second_of_a_ranks_steps(tmp_path, capfd):
    """Partial collective (eager-SGD, solo): every rank's every step (a job: compute, call,
    adopt) in five parts >= 0 that sum to its wall seconds (rank-steps.jsonl), the summary's
    means of them, and each job's noncompute in the trace: its step less its unit (issue 23)."""
    from tests.cli.helpers import trained_time_parts

    injected, means = trained_time_parts("eager:mode=solo", tmp_path / "run", capfd, [0, 1, 2])
    assert (injected > 0).all()  # the injected sleeps are measured as such
    assert means[1] == pytest.approx(injected.mean())


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
    rows = torch.zeros(0, 8).numpy()
    columns = Rule.shrink_columns(r, SimpleNamespace(rows=rows))
    assert columns["skipped"] == 32 + 1 * 32  # one parked gradient dropped, one rank lost
    assert columns["live"] == [0, 1, 3] and columns["dead"] == [2]
