"""Rebalance for a DDP job: ``rebalance_loader``'s deal, ``sample_weighted_hook``'s update.

The deal is checked against a reference written from the definitions, without processes:
the ``DistributedSampler``'s permutation (``torch.randperm`` seeded ``seed + epoch``, as that
sampler documents), cut into global batches of N B; sync gives rank k the positions
k, k + N, ... of each, and rank n gets the b_n samples after the first sum_{k<n} b_k of that
rank-major batch. The update is checked on three real gloo ranks with unequal shares against
single-process SGD on the concatenated global batch.
"""

from __future__ import annotations

import inspect
import pickle

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.integrate.ranks import join, run_ranks
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, IterableDataset, TensorDataset

import tailtrain
from tailtrain.errors import UsageError
from tailtrain.integrate import ShareBatchSampler, rebalance_loader, sample_weighted_hook
from tailtrain.integrate.share_loader import CARRIED


def loaders(size: int, n: int, b: int, *, seed: int = 0, shuffle: bool = True, **options):
    """Each rank's ``DataLoader(batch_size=b, sampler=DistributedSampler)`` over 0..size-1."""
    data = TensorDataset(torch.arange(size))
    samplers = [
        DistributedSampler(data, num_replicas=n, rank=r, shuffle=shuffle, seed=seed)
        for r in range(n)
    ]
    return [DataLoader(data, batch_size=b, sampler=s, **options) for s in samplers], samplers


def batches(loader: DataLoader) -> list[list[int]]:
    return [x.tolist() for (x,) in loader]


def permutation(size: int, seed: int, epoch: int, shuffle: bool) -> list[int]:
    if not shuffle:
        return list(range(size))
    return torch.randperm(size, generator=torch.Generator().manual_seed(seed + epoch)).tolist()


def expected(size, shares, b, seed, epoch, shuffle) -> list[list[list[int]]]:
    """[rank][step] -> indices, from the definitions (module docstring)."""
    n = len(shares)
    order, first = permutation(size, seed, epoch, shuffle), np.cumsum([0, *shares])
    out: list[list[list[int]]] = [[] for _ in range(n)]
    for s in range(size // (n * b)):
        chunk = order[s * n * b : (s + 1) * n * b]
        rank_major = [chunk[j * n + k] for k in range(n) for j in range(b)]
        for r in range(n):
            out[r].append(rank_major[first[r] : first[r + 1]])
    return out


@st.composite
def jobs(draw):
    n, b = draw(st.integers(1, 5)), draw(st.integers(1, 6))
    cuts = sorted(draw(st.lists(st.integers(1, n * b - 1), min_size=n - 1, max_size=n - 1,
                                unique=True))) if n > 1 else []  # fmt: skip
    shares = np.diff([0, *cuts, n * b]).tolist()
    size = draw(st.integers(n * b, 4 * n * b + 7))
    return n, b, shares, size


# ---- (1) the sampler alone --------------------------------------------------------------------
@settings(max_examples=80, deadline=None)
@given(jobs(), st.integers(0, 3), st.integers(0, 3), st.booleans())
def test_each_rank_gets_its_share_of_the_distributed_samplers_global_batch(
    job, seed, epoch, shuffle
):
    n, b, shares, size = job
    plain, samplers = loaders(size, n, b, seed=seed, shuffle=shuffle)
    dealt = [rebalance_loader(loader, shares) for loader in plain]
    for s in samplers:
        s.set_epoch(epoch)  # after rebalance_loader: read at each __iter__
    got = [batches(loader) for loader in dealt]
    assert got == expected(size, shares, b, seed, epoch, shuffle)
    assert {len(loader) for loader in dealt} == {size // (n * b)}
    seen = [i for rank in got for step in rank for i in step]
    assert len(seen) == len(set(seen)) == len(dealt[0]) * n * b  # each sample at most once


@settings(max_examples=40, deadline=None)
@given(jobs(), st.integers(0, 3))
def test_equal_shares_give_every_rank_its_distributed_samplers_batches(job, seed):
    n, b, _, size = job
    plain, _ = loaders(size, n, b, seed=seed)
    for loader in plain:
        dealt = batches(rebalance_loader(loader, [b] * n))
        assert dealt == batches(loader)[: len(dealt)]


def test_set_epoch_moves_every_rank_to_the_same_new_permutation():
    n, b, shares, size = 3, 4, [7, 4, 1], 60
    plain, samplers = loaders(size, n, b, seed=11)
    dealt = [rebalance_loader(loader, shares) for loader in plain]
    before = [batches(loader) for loader in dealt]
    for s in samplers:
        s.set_epoch(1)
    after = [batches(loader) for loader in dealt]
    assert before != after
    assert after == expected(size, shares, b, 11, 1, True)
    assert before == expected(size, shares, b, 11, 0, True)


def test_the_loaders_sampler_is_still_the_users_distributed_sampler():
    # PyTorch's DDP tutorial calls self.train_data.sampler.set_epoch(epoch) on its loader
    plain, samplers = loaders(60, 3, 4, seed=11)
    dealt = [rebalance_loader(loader, [7, 4, 1]) for loader in plain]
    assert all(d.sampler is s for d, s in zip(dealt, samplers, strict=True))
    for d in dealt:
        d.sampler.set_epoch(1)
    assert [batches(d) for d in dealt] == expected(60, [7, 4, 1], 4, 11, 1, True)


@pytest.mark.parametrize(
    "shares",
    [[4, 4], [4, 4, 3], [5, 5, 3], [12, 0, 0], [6.0, 4, 2], "6,4,2", None, [-1, 7, 6]],
    ids=str,
)
def test_bad_shares_are_refused_in_one_line(shares):
    plain, _ = loaders(40, 3, 4)
    with pytest.raises(UsageError, match="one int >= 1 per rank") as err:
        rebalance_loader(plain[0], shares)
    assert "\n" not in str(err.value) and "N*B = 3*4 = 12" in str(err.value)


class Stream(IterableDataset):
    def __iter__(self):
        return iter(range(8))


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: DataLoader(Stream(), batch_size=2), "IterableDataset"),
        (lambda: DataLoader(TensorDataset(torch.arange(40)), batch_size=4, shuffle=True),
         "DistributedSampler"),
        (lambda: loaders(40, 2, 4)[0][0], None),
        (lambda: loaders(7, 2, 4)[0][0], "holds no global batch"),
    ],
    ids=["iterable", "no-distributed-sampler", "fine", "too-small"],
)  # fmt: skip
def test_what_cannot_be_carried_is_refused_in_one_line(make, match):
    if match is None:
        assert len(rebalance_loader(make(), [5, 3])) == 5
        return
    with pytest.raises(UsageError, match=match) as err:
        rebalance_loader(make(), [5, 3])
    assert "\n" not in str(err.value)


def collate(items):
    return torch.stack([x for (x,) in items]) * 10


def test_the_loaders_options_carry_over_and_its_workers_deal_the_same():
    options = dict(
        num_workers=1, collate_fn=collate, pin_memory=False, persistent_workers=True,
        prefetch_factor=3, timeout=30, worker_init_fn=lambda _: None,
        generator=torch.Generator().manual_seed(5),
    )  # fmt: skip
    plain, _ = loaders(30, 2, 4, seed=2, **options)
    dealt = rebalance_loader(plain[1], [6, 2])
    for name, value in options.items():
        assert getattr(dealt, name) is value or getattr(dealt, name) == value, name
    assert [x.tolist() for x in dealt] == [
        [10 * i for i in s] for s in expected(30, [6, 2], 4, 2, 0, True)[1]
    ]
    # every DataLoader option is carried or replaced by the batch sampler (a new one fails)
    replaced = {"self", "dataset", "batch_size", "shuffle", "sampler", "batch_sampler", "drop_last"}
    assert set(inspect.signature(DataLoader).parameters) - replaced == set(CARRIED)


def test_a_rebalanced_loader_takes_new_shares_on_the_same_sampler():
    plain, _ = loaders(50, 2, 5, seed=4)
    again = rebalance_loader(rebalance_loader(plain[0], [9, 1]), [3, 7])
    assert batches(again) == batches(rebalance_loader(plain[0], [3, 7]))


def test_the_face_exports_both_lines():
    assert tailtrain.rebalance_loader is rebalance_loader
    assert tailtrain.sample_weighted_hook is sample_weighted_hook


# ---- (3) checkpoints --------------------------------------------------------------------------
def test_state_dict_round_trips_without_pickle_and_without_the_group(tmp_path):
    plain, _ = loaders(50, 3, 4, seed=3)
    state = rebalance_loader(plain[2], [6, 4, 2]).batch_sampler
    state.screened = 2
    torch.save(state.state_dict(), tmp_path / "share.pt")
    loaded = torch.load(tmp_path / "share.pt", weights_only=True)
    fresh = rebalance_loader(plain[2], [4, 4, 4]).batch_sampler
    fresh.load_state_dict(loaded)
    assert loaded == {"shares": [6, 4, 2], "batch_size": 4, "screened": 2}
    assert fresh.state_dict() == loaded and list(fresh) == list(state)
    with pytest.raises(UsageError, match="batch size 4"):
        rebalance_loader(loaders(50, 3, 3)[0][2], [3, 3, 3]).batch_sampler.load_state_dict(loaded)
    with pytest.raises(UsageError, match="one int >= 1 per rank"):
        fresh.load_state_dict({**loaded, "shares": [6, 6]})


def test_pickling_leaves_the_process_group_out():
    plain, samplers = loaders(50, 2, 4, seed=3)
    state = ShareBatchSampler(samplers[1], [5, 3], 4, process_group=object())  # not picklable
    back = pickle.loads(pickle.dumps(state))
    assert back.process_group is None and back.state_dict() == state.state_dict()
    assert list(back) == list(state) == batches(rebalance_loader(plain[1], [5, 3]))


# ---- (2) the update on real ranks ---------------------------------------------------------------
N, B, SHARES, LR, SIZE, D, C, SEED, EPOCH, STEPS = 3, 4, [6, 4, 2], 0.1, 50, 5, 3, 7, 1, 2
X = torch.randn(SIZE, D, generator=torch.Generator().manual_seed(0))
Y = torch.randint(0, C, (SIZE,), generator=torch.Generator().manual_seed(1))


def model() -> nn.Module:
    torch.manual_seed(3)
    return nn.Linear(D, C)


def flat(m: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in m.parameters()])


def train_ranks(rank: int, loader: DataLoader, state, nan_rank: int | None = None):
    """The user's loop with the two lines: one batch a step, the loss a mean over it."""
    ddp = DistributedDataParallel(model())
    ddp.register_comm_hook(state, sample_weighted_hook)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=LR)
    loader.batch_sampler.sampler.set_epoch(EPOCH)
    seen, thetas = [], []
    for step, (x, y, i) in enumerate(loader):
        if step == STEPS:
            break
        loss = F.cross_entropy(ddp(x), y)
        (loss * torch.nan if rank == nan_rank else loss).backward()
        optimizer.step()
        optimizer.zero_grad()
        seen.append(i.tolist())
        thetas.append(flat(ddp.module))
    return {"seen": seen, "thetas": thetas, "screened": state.screened, "steps": len(loader)}


def rank_main(rank: int, port: int, folder: str) -> None:
    join(rank, port, N)
    data = TensorDataset(X, Y, torch.arange(SIZE))
    sampler = DistributedSampler(data, seed=SEED)
    loader = rebalance_loader(DataLoader(data, batch_size=B, sampler=sampler), SHARES)
    unpickled = pickle.loads(pickle.dumps(loader.batch_sampler))  # reduces on the default group
    plain = DataLoader(data, batch_size=B, sampler=sampler)
    propagating = rebalance_loader(plain, SHARES, on_nonfinite="propagate")
    try:
        wrong = DistributedSampler(data, num_replicas=2, rank=rank % 2)
        rebalance_loader(DataLoader(data, batch_size=B, sampler=wrong), [4, 4])
        refused = ""
    except UsageError as exc:
        refused = str(exc)
    out = {
        "hook": train_ranks(rank, loader, loader.batch_sampler),
        "nan": train_ranks(rank, loader, unpickled, nan_rank=2),
        "propagated": train_ranks(rank, propagating, propagating.batch_sampler, nan_rank=2),
        "refused": refused,
    }
    torch.save(out, f"{folder}/rank{rank}.pt")
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    folder = tmp_path_factory.mktemp("share_loader")
    return run_ranks(rank_main, folder, N)


def sgd(steps: list[list[list[int]]]) -> list[torch.Tensor]:
    """Single-process SGD, each step on the ranks' batches concatenated (``steps[s][rank]``)."""
    net, out = model(), []
    for parts in steps:
        idx = torch.tensor([i for part in parts for i in part])
        loss = F.cross_entropy(net(X[idx]), Y[idx])
        grads = torch.autograd.grad(loss, list(net.parameters()))
        with torch.no_grad():
            for p, g in zip(net.parameters(), grads, strict=True):
                p -= LR * g
        out.append(flat(net))
    return out


def global_batches() -> list[list[list[int]]]:
    per_rank = expected(SIZE, SHARES, B, SEED, EPOCH, True)
    return [[per_rank[r][s] for r in range(N)] for s in range(STEPS)]


@pytest.mark.timeout(120)
def test_the_update_is_sgd_on_the_concatenated_global_batch(results):
    reference = sgd(global_batches())
    for r, result in enumerate(results):
        hook = result["hook"]
        assert hook["steps"] == SIZE // (N * B) and hook["screened"] == 0
        assert hook["seen"] == [parts[r] for parts in global_batches()]
        for theta, want in zip(hook["thetas"], reference, strict=True):
            torch.testing.assert_close(theta, want)


@pytest.mark.timeout(120)
def test_ddps_plain_average_would_differ(results):
    """The shares matter: the mean of the ranks' mean gradients (DDP's default) is not the
    reference, so the test above can fail."""
    net, parts = model(), global_batches()[0]
    grads = []
    for part in parts:
        loss = F.cross_entropy(net(X[part]), Y[part])
        grads.append(
            torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, list(net.parameters()))])
        )
    plain = flat(net) - LR * torch.stack(grads).mean(0)
    assert not torch.allclose(plain, results[0]["hook"]["thetas"][0], atol=1e-5)


@pytest.mark.timeout(120)
def test_a_non_finite_bucket_joins_with_weight_zero(results):
    """Rank 2's loss is NaN every step: the update is ranks 0 and 1's sample-weighted mean,
    i.e. SGD on their samples alone, and rank 2 counts its screened buckets."""
    reference = sgd([parts[:2] for parts in global_batches()])
    for result in results:
        for theta, want in zip(result["nan"]["thetas"], reference, strict=True):
            torch.testing.assert_close(theta, want)
    assert [r["nan"]["screened"] for r in results][:2] == [0, 0]
    assert results[2]["nan"]["screened"] >= STEPS  # at least one bucket a step


@pytest.mark.timeout(120)
def test_a_non_finite_bucket_propagated_reaches_every_rank_as_under_ddp(results):
    """``on_nonfinite="propagate"`` (with a GradScaler, which would skip the step): rank 2's
    NaN enters the sum, so every rank's update holds it, and nothing is counted screened."""
    for result in results:
        assert result["propagated"]["screened"] == 0
        assert not torch.isfinite(result["propagated"]["thetas"][0]).any()


@pytest.mark.timeout(120)
def test_a_sampler_of_another_world_is_refused_in_one_line(results):
    for result in results:
        assert "rank" in result["refused"] and "of 2, but" in result["refused"]
        assert "\n" not in result["refused"]
