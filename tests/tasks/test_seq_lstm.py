"""seq-lstm: heavy-tailed sequence lengths, masked LSTM gradients, training, spec errors."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tailtrain.cli import main
from tailtrain.errors import UsageError
from tailtrain.tasks import KNOWN_TASKS, Task, parse_partition, parse_task
from tailtrain.tasks.sequences import pareto_lengths

SMALL = "seq-lstm:n=96,test=24,features=3,hidden=5,classes=4,min-len=2,max-len=40,shape=1.2"
WORKERS = 3


@pytest.fixture(scope="module")
def small() -> Task:
    return parse_task(SMALL, seed=3)


def batches(task: Task, seed: int, batch: int = 6) -> np.ndarray:
    state = parse_partition("iid").assign(task, WORKERS, np.random.default_rng(seed))
    idx = task.sample_indices(np.random.default_rng(seed + 1), np.arange(WORKERS), state)
    return idx[:, :batch]


def survival(lengths: np.ndarray, x: int) -> float:
    return float((lengths >= x).mean())


def test_registered_with_shapes_and_masks(small: Task) -> None:
    assert "seq-lstm" in KNOWN_TASKS
    data = small.data
    assert data.x_train.shape == (96, 40, 4) and data.x_test.shape == (24, 40, 4)
    assert (small.n_classes, small.batch_size, small.metric_name) == (4, 32, "accuracy")
    assert small.dim == 4 * 5 * (3 + 5 + 2) + 4 * (5 + 1)  # LSTM (W_ih, W_hh, 2 biases), head
    for x, lengths in ((data.x_train, data.train_lengths), (data.x_test, data.test_lengths)):
        steps = torch.arange(40)
        valid = steps < lengths[:, None]
        assert torch.equal(x[..., -1], valid.float())  # the mask: a prefix of L ones
        assert not x[..., :-1][~valid].any()  # zero frames after the end
        assert bool((lengths >= 2).all() and (lengths <= 40).all())
    assert bool(torch.all(data.train_lengths[1:] >= data.train_lengths[:-1]))  # by length
    assert set(data.y_train.tolist()) <= set(range(4))


def test_same_seed_same_data(small: Task) -> None:
    again = parse_task(SMALL, seed=3)
    other = parse_task(SMALL, seed=4)
    assert torch.equal(again.data.x_train, small.data.x_train)
    assert torch.equal(again.data.y_test, small.data.y_test)
    assert not torch.equal(other.data.x_train, small.data.x_train)


def test_lengths_follow_the_clipped_pareto_law() -> None:
    """P(L ≥ x) = (min/x)^shape for min ≤ x ≤ max; checked within 4 binomial standard
    errors on the default task's 5,120 sequences, whose max/median ratio is then ≥ 10."""
    task = parse_task("seq-lstm", seed=0)
    lengths = np.concatenate([task.data.train_lengths.numpy(), task.data.test_lengths.numpy()])
    n = lengths.size
    for x in (8, 12, 16, 32, 64, 128, 256):
        p = (8 / x) ** 1.5
        assert abs(survival(lengths, x) - p) <= 4 * math.sqrt(p * (1 - p) / n) + 1e-12
    assert lengths.max() <= 256 and survival(lengths, 257) == 0
    assert lengths.max() / np.median(lengths) >= 10


def test_hill_estimate_recovers_the_tail_index() -> None:
    """Hill's estimator on the k largest of n Pareto draws has standard error ≈ shape/√k."""
    shape, k = 1.5, 2000
    lengths = pareto_lengths(np.random.default_rng(0), 40_000, 10_000, 10**12, shape)
    top = np.sort(lengths.astype(np.float64))[::-1][: k + 1]
    hill = k / np.log(top[:k] / top[k]).sum()
    assert abs(hill - shape) <= 4 * shape / math.sqrt(k)


def exact_length_grads(task: Task, thetas: list[torch.Tensor], idx: np.ndarray):
    """Reference from the definitions: each sequence run alone at its own length through
    ``nn.LSTM`` (no padding, no mask), the last output through the head, mean cross-entropy
    per worker, plain autograd."""
    losses, grads = [], []
    for w, theta in enumerate(thetas):
        module = task.module_at(theta)
        per = []
        for i in idx[w]:
            length = int(task.data.train_lengths[i])
            frames = task.data.x_train[i, :length, :-1]
            out, _ = module.lstm(frames[None])
            logits = module.head(out[0, -1])
            per.append(F.cross_entropy(logits[None], task.data.y_train[i][None]))
        loss = torch.stack(per).mean()
        params = list(module.parameters())
        g = torch.autograd.grad(loss, params)
        losses.append(loss.detach())
        grads.append(torch.cat([t.reshape(-1) for t in g]))
    return torch.stack(losses), torch.stack(grads)


@pytest.mark.filterwarnings("ignore:There is a performance drop:UserWarning")
@pytest.mark.parametrize("loop", [True, False], ids=["per-worker-loop", "vmap"])
def test_masked_gradients_equal_exact_length_gradients(small: Task, loop: bool) -> None:
    """Padding to the batch's longest sequence and masking must not change any gradient,
    in the loop the task uses and in the vmap path it replaces."""
    task = small if loop else dataclasses.replace(small, per_worker_loop=False)
    theta, idx = task.init_params(7), batches(task, seed=0)
    losses, grads = task.grads(theta, idx)
    ref_losses, ref_grads = exact_length_grads(task, [theta] * WORKERS, idx)
    torch.testing.assert_close(losses, ref_losses, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(grads, ref_grads, rtol=1e-4, atol=1e-6)
    thetas = task.init_params(1) + 0.05 * torch.randn(
        WORKERS, task.dim, generator=torch.Generator().manual_seed(0)
    )
    idx = batches(task, seed=4)
    losses, grads = task.grads_multi(thetas, idx)
    ref_losses, ref_grads = exact_length_grads(task, list(thetas), idx)
    torch.testing.assert_close(losses, ref_losses, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(grads, ref_grads, rtol=1e-4, atol=1e-6)


def test_padding_to_the_full_length_changes_nothing(small: Task) -> None:
    theta = small.init_params(2)
    module = small.module_at(theta)
    x, y = small.data.x_train[:7], small.data.y_train[:7]  # shortest first: much padding
    trimmed = small.data.trim(x)
    assert trimmed.shape[1] == int(small.data.train_lengths[:7].max()) < x.shape[1]
    full = torch.autograd.grad(F.cross_entropy(module(x), y), list(module.parameters()))
    short = torch.autograd.grad(F.cross_entropy(module(trimmed), y), list(module.parameters()))
    for a, b in zip(full, short, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


def test_each_worker_runs_at_its_own_longest_length(small: Task) -> None:
    """The compute of a gradient follows its own data: the LSTM sees T = the longest
    sequence of that worker's batch, not of the data set or of the other workers."""
    seen: list[int] = []

    def record(_, args) -> None:
        seen.append(args[0].shape[-2])

    hook = small.model.lstm.register_forward_pre_hook(record)
    try:
        idx = batches(small, seed=2)
        small.grads(small.init_params(0), idx)
    finally:
        hook.remove()
    assert seen == small.data.train_lengths[idx].amax(1).tolist()


def test_simulate_sync_lowers_the_train_loss(tmp_path, capsys) -> None:
    argv = ["simulate", "--task", "seq-lstm:n=1024,test=256", "--strategy", "sync",
            "--iterations", "60", "--workers", "4", "--eval-every", "60",
            "--out", str(tmp_path), "--json"]  # fmt: skip
    assert main(argv) == 0
    summary = json.loads(capsys.readouterr().out)
    evals = [json.loads(line) for line in (tmp_path / "evals.jsonl").read_text().splitlines()]
    assert evals[0]["step"] == 0 and evals[-1]["step"] == 60
    assert evals[-1]["train_loss"] < evals[0]["train_loss"] - 0.05
    assert summary["final_eval"] > 0.15  # 4x chance would need more steps; chance is 0.1


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("seq-lstm:classes=1", ">= 2"),
        ("seq-lstm:features=0", ">= 1"),
        ("seq-lstm:hidden=0", ">= 1"),
        ("seq-lstm:min-len=0", ">= 1"),
        ("seq-lstm:min-len=20,max-len=10", ">= 20"),
        ("seq-lstm:shape=0", "> 0"),
        ("seq-lstm:shape=x", "not a number"),
        ("seq-lstm:signal=-1", ">= 0"),
        ("seq-lstm:n=0", ">= 1"),
        ("seq-lstm:depth=2", "does not take"),
        ("seq-lstm:n=100000000", "GiB"),
    ],
)
def test_bad_specs_are_one_line_errors(spec: str, message: str, capsys) -> None:
    with pytest.raises(UsageError, match=message):
        parse_task(spec)
    assert main(["simulate", "--task", spec, "--iterations", "1", "--workers", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err
