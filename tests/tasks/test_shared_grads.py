"""The one-pass shared-θ gradients against the vmap path and a per-worker autograd loop."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import tailtrain.tasks.task as task_module
from tailtrain.tasks import Task, parse_task
from tailtrain.tasks.data import load_digits_data
from tailtrain.tasks.shared_grads import SharedGrads, supports

SPECS = [
    "digits-cnn",
    "digits-mlp:hidden=16",
    "logreg",
    "logreg:l2=0.05",
    "digits-cnn:l2=0.01",
    "hyperplane:dim=16,n=64",
    "mnist",
    "cifar10",
]
RTOL, ATOL = 1e-5, 1e-6  # float32: only the summation order differs between the paths


@pytest.fixture(params=SPECS, scope="module")
def task(request, shared_data_dirs) -> Task:
    data = shared_data_dirs.get(request.param.split(":")[0])
    return parse_task(request.param, data=data, seed=3)


def loop_grads(task: Task, theta: torch.Tensor, idx: np.ndarray):
    """Reference: one ordinary autograd pass per worker on a real nn.Module."""
    module = task.module_at(theta)
    params = list(module.parameters())
    losses, grads = [], []
    for row in idx:
        out, y = module(task.data.x_train[row]), task.data.y_train[row]
        mse = task.metric_name == "mse"
        loss = F.mse_loss(out.squeeze(-1), y) if mse else F.cross_entropy(out, y)
        loss = loss + 0.5 * task.l2 * sum((p * p).sum() for p in params)
        losses.append(loss.detach())
        grads.append(torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, params)]))
    return torch.stack(losses), torch.stack(grads)


def vmap_grads(task: Task, theta: torch.Tensor, idx: np.ndarray):
    """Reference: the general torch.func.vmap path (per-worker θ, all equal)."""
    return task.grads_multi(theta.expand(len(idx), -1).contiguous(), idx)


@pytest.mark.parametrize(("workers", "batch"), [(1, 1), (1, 3), (4, 1), (3, 3), (5, 8)])
def test_one_pass_matches_vmap_and_loop(task: Task, workers: int, batch: int) -> None:
    assert supports(task.model)  # every built-in model takes the one-pass path
    theta = task.init_params(workers + batch)
    idx = np.random.default_rng(batch).integers(0, task.n_train, (workers, batch))
    losses, grads = task.grads(theta, idx)
    assert grads.shape == (workers, task.dim) and grads.dtype == torch.float32
    for ref_losses, ref_grads in (vmap_grads(task, theta, idx), loop_grads(task, theta, idx)):
        torch.testing.assert_close(losses, ref_losses, rtol=RTOL, atol=ATOL)
        torch.testing.assert_close(grads, ref_grads, rtol=RTOL, atol=ATOL)


def test_chunks_and_no_grad_give_the_same_result(monkeypatch: pytest.MonkeyPatch) -> None:
    task = parse_task("digits-cnn:l2=0.1")
    theta = task.init_params(0)
    idx = np.random.default_rng(0).integers(0, task.n_train, (6, 5))
    losses, grads = task.grads(theta, idx)
    with torch.no_grad():
        torch.testing.assert_close(task.grads(theta, idx)[1], grads, rtol=0, atol=0)
    monkeypatch.setattr(task_module, "ELEMENT_BUDGET", 1)  # one worker per call
    chunk_losses, chunk_grads = task.grads(theta, idx)
    torch.testing.assert_close(chunk_grads, grads, rtol=RTOL, atol=ATOL)
    torch.testing.assert_close(chunk_losses, losses, rtol=RTOL, atol=ATOL)
    assert not theta.requires_grad


def conv_task(conv: nn.Conv2d, tail: list[nn.Module]) -> Task:
    model = nn.Sequential(conv, nn.ReLU(), *tail, nn.Flatten()).to("meta")
    out = model(torch.zeros(1, 1, 8, 8, device="meta")).shape[1]
    model = nn.Sequential(*model, nn.Linear(out, 10, bias=False)).to("meta")
    return Task("conv", load_digits_data(image=True), model, 4, "cross_entropy", l2=0.02)


@pytest.mark.parametrize(
    ("conv", "second"),
    [  # a first conv has C = 1 < Wo (row-major im2col); the second, C >= Wo (channels last)
        (nn.Conv2d(1, 4, 3, stride=2, padding=1), nn.Conv2d(4, 8, 2, padding=1)),
        (nn.Conv2d(1, 3, (3, 2), dilation=(2, 1), padding=(2, 0), bias=False),
         nn.Conv2d(3, 5, (2, 3), stride=(2, 1), dilation=(1, 2), padding=(1, 0))),
        (nn.Conv2d(1, 6, 3, padding=1), nn.Conv2d(6, 5, 3, stride=2, dilation=2, padding=1)),
    ],
)  # fmt: skip
def test_conv_options_match_the_loop(conv: nn.Conv2d, second: nn.Conv2d) -> None:
    task = conv_task(conv, [second, nn.MaxPool2d(2)])
    assert supports(task.model)
    theta = task.init_params(1)
    idx = np.random.default_rng(2).integers(0, task.n_train, (3, 4))
    losses, grads = task.grads(theta, idx)
    ref_losses, ref_grads = loop_grads(task, theta, idx)
    torch.testing.assert_close(losses, ref_losses, rtol=RTOL, atol=ATOL)
    torch.testing.assert_close(grads, ref_grads, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize(
    "layer",
    [nn.Tanh(), nn.ReLU(inplace=True), nn.Conv2d(4, 4, 3, padding="same"),
     nn.Conv2d(4, 4, 3, groups=2), nn.Conv2d(4, 4, 3, padding=1, padding_mode="reflect")],
)  # fmt: skip
def test_other_layers_fall_back_to_vmap(layer: nn.Module) -> None:
    task = conv_task(nn.Conv2d(1, 4, 3), [nn.Conv2d(4, 4, 1), layer])
    assert not supports(task.model) and not isinstance(task._shared_fn, SharedGrads)
    with pytest.raises(ValueError, match="Sequential"):
        SharedGrads(task.model, task.layout, F.cross_entropy, 0.0)
    theta = task.init_params(0)
    idx = np.random.default_rng(0).integers(0, task.n_train, (2, 3))
    torch.testing.assert_close(
        task.grads(theta, idx)[1], loop_grads(task, theta, idx)[1], rtol=RTOL, atol=ATOL
    )
