"""ShareSampler deals each step's global batch by the step's current shares (issue 25): every
sample of an epoch once, each rank its share, read as each step is yielded; and a loop's
round refuses a count other than the rank's share, in one line, before any collective."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.integrate.ranks import join, run_ranks

from tailtrain import ShareSampler
from tailtrain.errors import UsageError
from tailtrain.integrate.rounds import Rounds


class Step:
    """What the sampler reads of a StragglerStep, with shares the test moves."""

    def __init__(self, rank: int, world_size: int, micro_batches: int, shares=None) -> None:
        self.rank, self.world_size, self.micro_batches, self.shares = (
            rank,
            world_size,
            micro_batches,
            shares,
        )


def shares_of(draw, n: int, m: int) -> tuple[int, ...]:
    cuts = sorted(draw(st.lists(st.integers(0, n * m - n), min_size=n - 1, max_size=n - 1)))
    sizes = np.diff([0, *cuts, n * m - n]) + 1  # n positive parts of n m
    return tuple(int(s) for s in sizes)


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 4), st.integers(1, 5), st.integers(1, 3), st.integers(0, 40), st.data())
def test_every_sample_of_an_epoch_is_dealt_once_by_the_shares_in_force(n, m, b, spare, data):
    size = 3 * n * m * b + spare
    steps = [Step(r, n, m) for r in range(n)]
    samplers = [ShareSampler(size, s, micro_batch_size=b, seed=7) for s in steps]
    for epoch in range(2):
        seen: list[int] = []
        for sampler in samplers:
            sampler.set_epoch(epoch)
        iterators = [iter(s) for s in samplers]
        for _ in range(len(samplers[0])):
            shares = shares_of(data.draw, n, m)  # moved by the previous call, on every rank
            for step in steps:
                step.shares = shares
            for rank, it in enumerate(iterators):
                mine = next(it)
                assert len(mine) == shares[rank] and all(len(u) == b for u in mine)
                seen += [i for u in mine for i in u]
        assert all(next(it, None) is None for it in iterators)
        assert len(seen) == len(set(seen)) == len(samplers[0]) * n * m * b
        assert set(seen) <= set(range(size))


def test_without_shares_each_rank_gets_m_micro_batches_of_its_own():
    steps = [Step(r, 2, 3) for r in range(2)]
    dealt = [list(ShareSampler(48, s, micro_batch_size=2)) for s in steps]
    assert [len(d) for d in dealt] == [4, 4]
    assert all(len(step) == 3 for d in dealt for step in d)
    mine, theirs = ({i for step in d for u in step for i in u} for d in dealt)
    assert not mine & theirs


def test_epochs_are_different_permutations_and_every_rank_sees_the_same():
    a, b = (ShareSampler(60, Step(0, 1, 2), micro_batch_size=3, seed=1) for _ in range(2))
    assert list(a) == list(b)
    a.set_epoch(1)
    assert list(a) != list(b)


@pytest.mark.parametrize(
    ("size", "micro_batches", "b", "words"),
    [(10, 2, 8, "holds no global batch"), (100, None, 2, "micro_batches=M"), (100, 2, 0, ">= 1")],
)
def test_bad_sampler_arguments_are_refused_in_one_line(size, micro_batches, b, words):
    with pytest.raises(UsageError, match=words) as refused:
        ShareSampler(size, Step(0, 2, micro_batches), micro_batch_size=b)
    assert "\n" not in str(refused.value)


def comm(rank: int, world_size: int) -> SimpleNamespace:
    return SimpleNamespace(rank=rank, world_size=world_size, device=torch.device("cpu"))


def test_a_round_takes_exactly_the_ranks_share_and_says_what_it_wants():
    rounds = Rounds("rebalance", comm(1, 2), micro_batches=6, does=frozenset({"shares"}))
    assert rounds.wants() == 6  # equal shares until the warm-up ends
    plan, m = rounds.plan(6)
    assert plan.shares == (6, 6) and m == 6
    with pytest.raises(UsageError, match="deals this rank 6 micro-batches") as refused:
        rounds.plan(5)
    assert "\n" not in str(refused.value)
    assert Rounds("sync", comm(1, 2)).wants() is None


def test_rebalance_in_a_loop_needs_syncs_m_and_the_ddp_hook_refuses_it():
    with pytest.raises(UsageError, match="micro_batches=M"):
        Rounds("rebalance", comm(0, 2), does=frozenset({"shares"}))
    with pytest.raises(UsageError, match="needs shares"):
        Rounds("rebalance", comm(0, 2), micro_batches=4)  # an entry that deals no shares


# ---- two real ranks: StragglerStep with rebalance, dealt by the sampler ----------------------
N, M, B, LR, D, C = 2, 4, 2, 0.1, 6, 3
X = torch.randn(40, D, generator=torch.Generator().manual_seed(0))
Y = torch.randint(0, C, (40,), generator=torch.Generator().manual_seed(1))
#: injected seconds a micro-batch takes on each rank: rank 1 twice as slow, 20 ms apart
SECONDS = (0.02, 0.04)
EPOCHS, SPEC = 3, "rebalance:warmup=2,window=3"


def model() -> torch.nn.Module:
    torch.manual_seed(3)
    return torch.nn.Linear(D, C)


def rank_main(rank: int, port: int, folder: str) -> None:
    import time

    import torch.distributed as dist
    import torch.nn.functional as F

    from tailtrain import StragglerStep

    join(rank, port, N)
    net = model()
    step = StragglerStep(net, torch.optim.SGD(net.parameters(), lr=LR), SPEC, micro_batches=M)
    sampler = ShareSampler(len(X), step, micro_batch_size=B, seed=4)

    def loss_fn(xy):
        time.sleep(SECONDS[rank])
        return F.cross_entropy(net(xy[0]), xy[1])

    records, wanted = [], [step.wants]
    for epoch in range(EPOCHS):
        sampler.set_epoch(epoch)
        for indices in sampler:
            assert len(indices) == wanted[-1]
            records.append(step([(X[i], Y[i]) for i in indices], loss_fn).as_dict())
            wanted.append(records[-1]["wants"])
    theta = torch.cat([p.detach().reshape(-1) for p in net.parameters()])
    torch.save({"theta": theta, "records": records}, f"{folder}/rank{rank}.pt")
    dist.destroy_process_group()


def sgd_on_the_epochs_global_batches() -> torch.Tensor:
    """Single-process SGD on each step's whole global batch, the sampler's permutation."""
    import torch.nn.functional as F

    net = model()
    size = N * M * B
    for epoch in range(EPOCHS):
        order = np.random.default_rng((4, epoch)).permutation(len(X))
        for s in range(len(X) // size):
            batch = order[s * size : (s + 1) * size]
            loss = F.cross_entropy(net(X[batch]), Y[batch])
            grads = torch.autograd.grad(loss, list(net.parameters()))
            with torch.no_grad():
                for p, g in zip(net.parameters(), grads, strict=True):
                    p -= LR * g
    return torch.cat([p.detach().reshape(-1) for p in net.parameters()])


@pytest.mark.timeout(120)
def test_a_loop_with_the_sampler_moves_the_shares_and_is_sgd_on_the_global_batch(tmp_path):
    ranks = run_ranks(rank_main, tmp_path, N)
    records = ranks[0]["records"]
    assert len(records) == EPOCHS * (len(X) // (N * M * B))
    assert all(sum(r["shares"]) == N * M and r["completed"] == r["shares"] for r in records)
    assert records[0]["shares"] == [M, M]
    last = records[-1]["shares"]
    assert last[1] < M < last[0]  # the slow rank's share shrank, the fast one's grew
    assert [r["wants"] for r in ranks[1]["records"][:-1]] == [
        r["shares"][1] for r in ranks[1]["records"][1:]
    ]
    assert torch.equal(ranks[0]["theta"], ranks[1]["theta"])
    torch.testing.assert_close(ranks[0]["theta"], sgd_on_the_epochs_global_batches())
