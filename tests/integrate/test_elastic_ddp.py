"""The DDP comm hook's state under ``tailtrain launch --on-rank-loss shrink``
(``integrate.elastic_ddp``) on one gloo rank, its regroup stood in for: a shrinking round
reduces as the hook does; a broken round is reduced again from the same local gradients, or
is the lead's with nothing left to step; a rank started again passes the steps already taken;
the stand-in default group of a rank started again (``integrate.default_group``); and the
one-line refusals. The end-to-end drill (two nodes, one killed and healed) is
test_shrink_ddp.py."""

from __future__ import annotations

import copy
import dataclasses
import datetime

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data.distributed import DistributedSampler

from tailtrain import StragglerHookState, init_process_group, weighted_allreduce_hook
from tailtrain.errors import UsageError
from tailtrain.integrate.membership import StepCall
from tailtrain.runtime.elastic.shrink import Census
from tailtrain.runtime.reduce import PeerFailure

M = 2


@pytest.fixture
def alone():
    """A process group of this process alone (gloo)."""
    dist.init_process_group(
        "gloo", store=dist.HashStore(), rank=0, world_size=1,
        timeout=datetime.timedelta(seconds=10),
    )  # fmt: skip
    yield
    dist.destroy_process_group()


@pytest.fixture
def launched(alone, monkeypatch):
    """As ``tailtrain launch --on-rank-loss shrink`` starts a rank: its store and option."""
    monkeypatch.setenv("TAILTRAIN_ON_RANK_LOSS", "shrink")
    monkeypatch.delenv("TAILTRAIN_REJOIN", raising=False)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    store = dist.TCPStore("127.0.0.1", 0, 1, is_master=True, wait_for_workers=False)
    monkeypatch.setenv("MASTER_PORT", str(store.port))
    return store


def job(on_rank_loss: str | None = None):
    """A DDP model with the hook, its optimizer and the hook's state (healed under shrink)."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
    ddp = DDP(net)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    state = StragglerHookState("dropcompute", on_rank_loss=on_rank_loss)
    ddp.register_comm_hook(state, weighted_allreduce_hook)
    state.heal(ddp, optimizer)
    return ddp, optimizer, state


def batches(step: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(step)
    return [(torch.randn(4, 3, generator=g), torch.randn(4, 2, generator=g)) for _ in range(M)]


def call(ddp, optimizer, state, step: int) -> int:
    """One step of the loop ``advise --for ddp`` prints; the micro-batches computed."""
    optimizer.zero_grad()
    computed = 0
    for x, y in state.micro_batches(ddp, batches(step)):
        F.mse_loss(ddp(x), y).backward()
        computed += 1
    if not state.last.empty:
        optimizer.step()
    return computed


def reference(steps: int) -> dict[str, torch.Tensor]:
    """The same steps through DDP's own reduce and the comm hook (``on_rank_loss="stop"``)."""
    ddp, optimizer, state = job("stop")
    for step in range(steps):
        call(ddp, optimizer, state, step)
    return copy.deepcopy(ddp.module.state_dict())


def assert_equal(model: torch.nn.Module, expected: dict[str, torch.Tensor]) -> None:
    for name, value in model.state_dict().items():
        torch.testing.assert_close(value, expected[name], msg=name)


@pytest.mark.timeout(60)
def test_a_shrinking_round_reduces_as_the_comm_hook_does(launched):
    """Under shrink DDP's reducer stays idle and the state reduces over the live generation:
    the same update as the hook's own reduce, and records that name the live ranks."""
    expected = reference(3)
    ddp, optimizer, state = job()  # on_rank_loss follows the launch: shrink
    assert state.elastic is not None
    for step in range(3):
        assert call(ddp, optimizer, state, step) == M
        assert (state.last.step, state.last.live, state.elastic.call) == (
            step, [0], StepCall.COMPLETED,
        )  # fmt: skip
    assert_equal(ddp.module, expected)


@pytest.mark.timeout(60)
def test_a_round_broken_in_its_last_gather_is_reduced_again_from_the_same_gradients(
    launched, monkeypatch
):
    """A peer dies in the closing gather, after the reduce: nobody completed the round, the
    survivors reduce it again from the local gradients, which the broken reduce left as they
    were; nothing is computed twice and the update is the unbroken one."""
    expected = reference(2)
    ddp, optimizer, state = job()
    call(ddp, optimizer, state, 0)
    timing, broken = state.rounds.timing, []

    def breaks(*args):
        if not broken:
            broken.append(True)
            raise PeerFailure("all_gather failed, a peer may have died: drill")
        return timing(*args)

    def regroup(old, mine, rows, sync):  # nobody completed it: it is reduced again
        return old, Census([0], {0: mine}, {0: 0}, [])

    monkeypatch.setattr(state.rounds, "timing", breaks)
    monkeypatch.setattr(state.elastic.membership.shrinker, "regroup", regroup)
    assert call(ddp, optimizer, state, 1) == M  # computed once
    assert broken and state.last.redone and state.last.step == 1
    assert state.elastic.call is StepCall.COMPLETED
    assert_equal(ddp.module, expected)


@pytest.mark.timeout(60)
def test_a_round_the_lead_completed_is_its_record_and_leaves_nothing_to_step(launched, monkeypatch):
    """The lead completed the round this rank broke in, and this rank took its state (whose
    update holds the round): the call returns the lead's record, and with no gradient the
    loop's ``optimizer.step()`` moves nothing."""
    ddp, optimizer, state = job()
    call(ddp, optimizer, state, 0)
    lead = dataclasses.replace(state.last, step=1, lost=[1], redone=True)
    membership = state.elastic.membership

    def weighted_sum(*args):  # the round's first collective: its rows ride in it
        raise PeerFailure("all_reduce failed, a peer may have died: drill")

    def regroup(old, mine, rows, sync):  # the lead's sync: one round ahead
        state.rounds.step, membership.last = mine + 1, lead
        return old, Census([0], {0: mine + 1}, {0: 0}, [1])

    monkeypatch.setattr(state.rounds.comm, "weighted_sum", weighted_sum)
    monkeypatch.setattr(membership.shrinker, "regroup", regroup)
    before = copy.deepcopy(ddp.module.state_dict())
    call(ddp, optimizer, state, 1)
    assert state.last is lead and state.elastic.call is StepCall.TAKEN
    assert all(p.grad is None for p in ddp.module.parameters())
    assert_equal(ddp.module, before)
    assert state.elastic.calls == 2


@pytest.mark.timeout(60)
def test_a_rank_started_again_passes_the_steps_the_live_ranks_took(launched):
    """It took the live ranks' state at step 2: its loop, run from its start, passes calls 0
    and 1 without computing (skipped, empty: no update), and computes from step 2 on."""
    ddp, optimizer, state = job()
    state.rounds.step = 2  # as the lead's sync leaves it
    for step in range(2):
        assert call(ddp, optimizer, state, step) == 0
        assert state.last.skipped and state.last.empty and state.last.step == step
        assert all(p.grad is None for p in ddp.module.parameters())
    assert call(ddp, optimizer, state, 2) == M
    assert state.last.step == 2 and not state.last.skipped


@pytest.mark.timeout(60)
def test_shrinking_is_refused_in_one_line_where_it_cannot_work(alone, monkeypatch):
    monkeypatch.delenv("TAILTRAIN_ON_RANK_LOSS", raising=False)
    with pytest.raises(UsageError, match="tailtrain launch") as caught:
        job("shrink")  # heal() without the launch
    assert "\n" not in str(caught.value)
    ddp, optimizer, state = job()  # not launched: stop, heal does nothing
    assert state.elastic is None
    monkeypatch.setenv("TAILTRAIN_ON_RANK_LOSS", "shrink")
    state = StragglerHookState("dropcompute")  # launched with shrink, and no heal
    with pytest.raises(UsageError, match=r"call state.heal\(ddp_model, optimizer\)"):
        call(ddp, optimizer, state, 0)
    with pytest.raises(UsageError, match="on_rank_loss must be one of stop, shrink"):
        StragglerHookState("dropcompute", on_rank_loss="grow")


@pytest.mark.timeout(60)
def test_a_model_whose_buffers_ddp_broadcasts_is_refused_under_shrink(launched):
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    with pytest.raises(UsageError, match=r"forward_sync_buffers=False") as caught:
        StragglerHookState("dropcompute").heal(DDP(net), optimizer)
    assert "\n" not in str(caught.value)
    state = StragglerHookState("dropcompute")
    state.heal(DDP(net, forward_sync_buffers=False), optimizer)
    assert state.elastic is not None


@pytest.mark.timeout(60)
def test_a_grad_scalers_propagation_is_refused_under_shrink_in_one_line(launched):
    with pytest.raises(UsageError, match=r"StragglerStep\(\.\.\., scaler=scaler") as caught:
        StragglerHookState("dropcompute", on_nonfinite="propagate")  # the launch shrinks
    assert "\n" not in str(caught.value)
    StragglerHookState("dropcompute", on_nonfinite="propagate", on_rank_loss="stop")


@pytest.mark.timeout(60)
def test_a_restarted_rank_gets_a_stand_in_default_group_of_its_job_rank(monkeypatch):
    """``DistributedSampler(dataset)`` deals it its shard of the job, DDP builds over it, and
    a collective it cannot answer says so in one line."""
    monkeypatch.setenv("TAILTRAIN_RESTART", "1")
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "4")
    init_process_group("gloo")
    try:
        assert (dist.get_rank(), dist.get_world_size()) == (2, 4)
        assert list(DistributedSampler(list(range(8)), shuffle=False)) == [2, 6]
        DDP(torch.nn.Linear(3, 2))
        with pytest.raises(RuntimeError, match="holds no peers") as caught:
            dist.all_reduce(torch.ones(1))
        assert "\n" not in str(caught.value)
    finally:
        dist.destroy_process_group()
    monkeypatch.delenv("TAILTRAIN_RESTART")  # a rank of the job: torch's own
    init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        assert dist.get_backend() == "gloo"
    finally:
        dist.destroy_process_group()
