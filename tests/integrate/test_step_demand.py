"""``StragglerStep("rebalance:deal=demand")`` in a plain job (no shrink): two gloo ranks deal
each step's pool of N M positions of one stream from the job's store, rank 1 sleeping in
every unit it computes. Every position of a step is computed once, the fast rank computes
more of them, the update is SGD on the pool (a single-process reference over the positions
each rank computed), and the step's state keeps the stream's place."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from tests.integrate.ranks import join, run_ranks

from tailtrain.errors import UsageError
from tailtrain.integrate import StragglerStep

N, M, STEPS, LR = 2, 3, 4, 0.1
#: seconds rank 1 sleeps in each unit: far above a unit's compute, so the deal, not the
#: machine, decides who computes more
SLOW = 0.05


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Linear(4, 3)


def stream_item(position: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Position ``position`` of the job's stream, the same on every rank."""
    g = torch.Generator().manual_seed(position)
    return torch.randn(5, 4, generator=g), torch.randint(0, 3, (5,), generator=g)


class Stream:
    def __getitem__(self, position: int) -> tuple[torch.Tensor, torch.Tensor]:
        return stream_item(position)


def rank_main(rank: int, port: int, folder: str) -> None:
    join(rank, port, N)
    # deal=demand deals from the job's store: env://, as torchrun sets it (here the tcp:// one)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    net = make_model()
    step = StragglerStep(
        net, torch.optim.SGD(net.parameters(), lr=LR), "rebalance:deal=demand", micro_batches=M
    )

    def loss_fn(batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        if rank == 1:
            time.sleep(SLOW)
        return F.cross_entropy(net(batch[0]), batch[1])

    records = [step(Stream(), loss_fn).as_dict() for _ in range(STEPS)]
    state = step.state_dict()
    step.close()
    torch.save(
        {"records": records, "model": net.state_dict(), "state": state, "shares": step.shares},
        Path(folder) / f"rank{rank}.pt",
    )
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return run_ranks(rank_main, tmp_path_factory.mktemp("demand"), N)


@pytest.mark.timeout(120)
def test_every_position_once_the_fast_rank_more_and_the_update_sgd_on_the_pool(results):
    records = results[0]["records"]
    assert results[1]["records"] == records  # every rank agrees on every record
    pool = N * M
    for r in records:
        dealt = sorted(p for positions in r["dealt"] for p in positions)
        assert dealt == list(range(r["step"] * pool, (r["step"] + 1) * pool))
        assert r["completed"] == [len(p) for p in r["dealt"]] and r["drop_rate"] == 0.0
    fast, slow = (sum(r["completed"][n] for r in records) for n in (0, 1))
    assert fast > slow  # rank 1 sleeps in every unit it takes
    net = make_model()
    optimizer = torch.optim.SGD(net.parameters(), lr=LR)
    for r in records:  # SGD on sum_n w_n G_n, G_n over the positions rank n computed
        total = [torch.zeros_like(p) for p in net.parameters()]
        for n in r["ranks"]:
            net.zero_grad()
            for p in r["dealt"][n]:
                x, y = stream_item(p)
                F.cross_entropy(net(x), y).backward()
            for t, p in zip(total, net.parameters(), strict=True):
                t.add_(p.grad, alpha=r["weights"][n] / len(r["dealt"][n]))
        for p, t in zip(net.parameters(), total, strict=True):
            p.grad = t
        optimizer.step()
    for rank in range(N):
        for name, value in net.state_dict().items():
            torch.testing.assert_close(results[rank]["model"][name], value, rtol=1e-5, atol=1e-6)


@pytest.mark.timeout(120)
def test_the_state_keeps_the_stream_s_place_and_no_shares_are_named(results):
    assert results[0]["state"]["stream"] == {"taken": STEPS * N * M}
    assert results[0]["shares"] is None  # dealt on demand a rank takes what it asks for


@pytest.fixture
def alone(monkeypatch):
    """This process as a one-rank job with its rendezvous store (env://), where a step dealt
    on demand opens its dealer."""
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    store = dist.TCPStore("127.0.0.1", 0, 1, is_master=True, wait_for_workers=False)
    monkeypatch.setenv("MASTER_PORT", str(store.port))
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.mark.timeout(30)
def test_a_state_of_another_deal_is_refused_in_one_line(alone):
    """A checkpoint of a step dealt on demand does not load into one that is not (the
    stream's place would be lost), nor the other way round."""
    net = make_model()
    optimizer = torch.optim.SGD(net.parameters(), lr=LR)
    demand = StragglerStep(net, optimizer, "rebalance:deal=demand", micro_batches=M)
    plain = StragglerStep(net, optimizer, "sync")
    with pytest.raises(UsageError, match="saved by a step dealt on demand"):
        plain.load_state_dict(demand.state_dict())
    with pytest.raises(UsageError, match="not dealt on demand"):
        demand.load_state_dict(plain.state_dict())
    demand.close()


@pytest.mark.timeout(30)
def test_a_refused_stream_spends_nothing_and_a_closed_step_refuses_in_one_line(alone):
    """A stream that is not indexed by position is refused before any deal, and the step
    goes on with the next call's stream; once closed, a call is refused in one line."""
    net = make_model()
    step = StragglerStep(
        net, torch.optim.SGD(net.parameters(), lr=LR), "rebalance:deal=demand",
        micro_batches=M,
    )  # fmt: skip
    loss = lambda b: F.cross_entropy(net(b[0]), b[1])  # noqa: E731
    with pytest.raises(UsageError, match="indexed by position"):
        step(iter([stream_item(0)]), loss)
    record = step(Stream(), loss)
    assert record.dealt == [list(range(M))] and step.next_step == 1
    step.close()
    with pytest.raises(UsageError, match="was closed"):
        step(Stream(), loss)
