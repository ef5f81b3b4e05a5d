"""Batched torch.func gradients against a per-worker autograd loop, for every task."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import tailtrain.tasks.task as task_module
from tailtrain.tasks import Task, parse_partition, parse_task

SPECS = [
    "digits-cnn",
    "digits-mlp:hidden=16",
    "logreg",
    "logreg:l2=0.05",
    "hyperplane:dim=12,n=64,batch=8",
    "mnist:batch=4",
    "cifar10:batch=3",
]
WORKERS = 5


@pytest.fixture(params=SPECS, scope="module")
def task(request, shared_data_dirs) -> Task:
    data = shared_data_dirs.get(request.param.split(":")[0])
    return parse_task(request.param, data=data, seed=3)


def batches(task: Task, seed: int = 0, workers: int = WORKERS) -> np.ndarray:
    state = parse_partition("iid").assign(task, workers, np.random.default_rng(seed))
    return task.sample_indices(np.random.default_rng(seed + 1), np.arange(workers), state)


def loop_grads(task: Task, thetas: list[torch.Tensor], idx: np.ndarray):
    """Reference: one ordinary autograd pass per worker on a real nn.Module."""
    losses, grads = [], []
    for w, theta in enumerate(thetas):
        module = task.module_at(theta)
        x, y = task.data.x_train[idx[w]], task.data.y_train[idx[w]]
        out = module(x)
        if task.metric_name == "mse":
            loss = F.mse_loss(out.squeeze(-1), y)
        else:
            loss = F.cross_entropy(out, y)
        params = list(module.parameters())
        loss = loss + 0.5 * task.l2 * sum((p * p).sum() for p in params)
        g = torch.autograd.grad(loss, params)
        losses.append(loss.detach())
        grads.append(torch.cat([t.reshape(-1) for t in g]))
    return torch.stack(losses), torch.stack(grads)


def test_shared_theta_matches_loop(task: Task) -> None:
    theta, idx = task.init_params(7), batches(task)
    losses, grads = task.grads(theta, idx)
    ref_losses, ref_grads = loop_grads(task, [theta] * WORKERS, idx)
    assert grads.shape == (WORKERS, task.dim) and grads.dtype == torch.float32
    torch.testing.assert_close(losses, ref_losses, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(grads, ref_grads, rtol=1e-4, atol=1e-6)


def test_per_worker_theta_matches_loop(task: Task) -> None:
    gen = torch.Generator().manual_seed(0)
    base = task.init_params(1)
    thetas = base + 0.05 * torch.randn(WORKERS, task.dim, generator=gen)
    idx = batches(task, seed=4)
    losses, grads = task.grads_multi(thetas, idx)
    ref_losses, ref_grads = loop_grads(task, list(thetas), idx)
    torch.testing.assert_close(losses, ref_losses, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(grads, ref_grads, rtol=1e-4, atol=1e-6)


def test_blocks_recombine_to_the_full_batch(task: Task) -> None:
    """LGC's s blocks of a mini-batch: the mean of s block gradients is the batch gradient."""
    blocks = 2
    theta = task.init_params(2)
    idx = np.random.default_rng(5).integers(0, task.n_train, (WORKERS, 2 * blocks))
    _, full = task.grads(theta, idx)
    _, parts = task.grads(theta, idx.reshape(WORKERS * blocks, -1))
    torch.testing.assert_close(parts.view(WORKERS, blocks, -1).mean(1), full, rtol=1e-4, atol=1e-6)
    _, single = task.grads(theta, idx[:, :1])  # B = 1 works too
    assert single.shape == (WORKERS, task.dim)


def test_chunked_calls_agree(task: Task, monkeypatch: pytest.MonkeyPatch) -> None:
    theta, idx = task.init_params(0), batches(task)
    losses, grads = task.grads(theta, idx)
    monkeypatch.setattr(task_module, "ELEMENT_BUDGET", 1)  # one worker per call
    chunk_losses, chunk_grads = task.grads(theta, idx)
    torch.testing.assert_close(chunk_grads, grads, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(chunk_losses, losses)


def test_loss_matches_grads_and_is_repeatable(task: Task) -> None:
    theta, idx = task.init_params(0), batches(task)
    losses, grads = task.grads(theta, idx)
    again = task.grads(theta, idx)
    assert torch.equal(again[1], grads) and torch.equal(again[0], losses)
    torch.testing.assert_close(task.loss(theta, idx), losses, rtol=1e-5, atol=1e-6)
    stacked = np.stack([idx, idx[::-1]], axis=1)  # (W, 2, B)
    assert task.loss(theta, stacked).shape == (WORKERS, 2)


def test_bad_shapes_are_refused() -> None:
    task = parse_task("logreg")
    theta = task.init_params(0)
    with pytest.raises(ValueError, match="theta"):
        task.grads(theta[:-1], np.zeros((2, 3), dtype=np.int64))
    with pytest.raises(ValueError, match="indices"):
        task.grads(theta, np.zeros(3, dtype=np.int64))
    with pytest.raises(ValueError, match="thetas"):
        task.grads_multi(theta[None].repeat(3, 1), np.zeros((2, 3), dtype=np.int64))
    losses, grads = task.grads(theta, np.zeros((0, 3), dtype=np.int64))
    assert losses.shape == (0,) and grads.shape == (0, task.dim)
