"""parse_task, parameters, evaluation, training progress and the timing-only task."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tailtrain.errors import UsageError
from tailtrain.tasks import KNOWN_TASKS, parse_partition, parse_task


@pytest.fixture(scope="module")
def cnn():
    return parse_task("digits-cnn")


def test_unknown_task_lists_the_known_ones() -> None:
    with pytest.raises(UsageError) as err:
        parse_task("resnet50")
    for name in KNOWN_TASKS:
        assert name in str(err.value)


@pytest.mark.parametrize(
    ("text", "data", "message"),
    [
        ("mnist", None, "--data"),
        ("cifar10", None, "--data"),
        ("digits-cnn", "/tmp", "takes no --data"),
        ("digits-cnn:hidden=3", None, "does not take"),
        ("logreg:batch=0", None, ">= 1"),
        ("hyperplane:dim=0", None, ">= 1"),
        ("hyperplane:dim=4,noise=-1", None, ">= 0"),
        ("none:batch=4", None, "does not take"),
    ],
)
def test_parse_task_errors(text: str, data, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        parse_task(text, data=data)


def test_descriptions_and_defaults(cnn) -> None:
    # DBW's widths on 8×8: conv 1→10 3×3, conv 10→20 3×3, fc 320→50, fc 50→10
    assert cnn.dim == (10 * 9 + 10) + (20 * 90 + 20) + (320 * 50 + 50) + (50 * 10 + 10)
    assert (cnn.metric_name, cnn.batch_size, cnn.has_model) == ("accuracy", 32, True)
    assert cnn.n_train + cnn.data.x_test.shape[0] == 1797  # all of sklearn's digits
    logreg = parse_task("logreg:batch=7")
    assert (logreg.dim, logreg.batch_size) == (64 * 10 + 10, 7)
    plane = parse_task("hyperplane:dim=6,n=40")
    assert (plane.dim, plane.metric_name, plane.n_train, plane.batch_size) == (7, "mse", 40, 256)
    assert parse_task("digits-mlp:hidden=5").dim == 64 * 5 + 5 + 5 * 10 + 10


def test_init_is_deterministic_and_follows_the_default_law(cnn) -> None:
    a, b, c = cnn.init_params(11), cnn.init_params(11), cnn.init_params(12)
    assert torch.equal(a, b) and not torch.equal(a, c) and a.dtype == torch.float32
    fc1 = a[1920 : 1920 + 320 * 50]  # fc 320→50 weights: U(±1/√320)
    bound = 1 / math.sqrt(320)
    assert fc1.abs().max() <= bound
    # variance of U(±b) is b²/3; the sample variance's std is b²·√(4/45/n)
    se = bound**2 * math.sqrt(4 / 45 / fc1.numel())
    assert abs(float(fc1.var()) - bound**2 / 3) <= 4 * se


def test_module_at_matches_the_functional_model(cnn) -> None:
    theta = cnn.init_params(0)
    module = cnn.module_at(theta)
    assert next(cnn.model.parameters()).is_meta  # the task's own model is untouched
    x = cnn.data.x_test[:9]
    torch.testing.assert_close(module(x), cnn._forward(theta, x))


def test_evaluate_agrees_with_a_reference_computation(cnn) -> None:
    theta = cnn.init_params(4)
    report = cnn.evaluate(theta)
    assert set(report) == {"train_loss", "eval", "eval_loss"}
    module = cnn.module_at(theta)
    with torch.no_grad():
        out = module(cnn.data.x_test)
        train = F.cross_entropy(module(cnn.data.x_train), cnn.data.y_train)  # all 1437 < 4096
    acc = (out.argmax(1) == cnn.data.y_test).float().mean()
    assert report["eval"] == pytest.approx(float(acc))
    assert report["eval_loss"] == pytest.approx(float(F.cross_entropy(out, cnn.data.y_test)), 1e-5)
    assert report["train_loss"] == pytest.approx(float(train), rel=1e-5)


def test_hyperplane_evaluate_reports_test_mse() -> None:
    task = parse_task("hyperplane:dim=5,n=50,test=20,l2=0.1", seed=2)
    theta = task.init_params(0)
    report = task.evaluate(theta)
    w, b = theta[:5], theta[5]
    mse = ((task.data.x_test @ w + b - task.data.y_test) ** 2).mean()
    assert report["eval"] == pytest.approx(float(mse), rel=1e-5) == report["eval_loss"]
    train = ((task.data.x_train @ w + b - task.data.y_train) ** 2).mean() + 0.05 * theta.dot(theta)
    assert report["train_loss"] == pytest.approx(float(train), rel=1e-5)


def test_hyperplane_noise_matches_the_spec() -> None:
    """Least-squares residuals estimate the noise variance; chi-square standard error."""
    dim, n, noise = 8, 4000, 0.5
    task = parse_task(f"hyperplane:dim={dim},n={n},noise={noise}", seed=5)
    x = task.data.x_train.double().numpy()
    y = task.data.y_train.double().numpy()
    _, rss, _, _ = np.linalg.lstsq(x, y, rcond=None)
    estimate = float(rss[0]) / (n - dim)
    assert abs(estimate - noise**2) <= 4 * noise**2 * math.sqrt(2 / (n - dim))
    again = parse_task(f"hyperplane:dim={dim},n={n},noise={noise}", seed=5)
    assert torch.equal(again.data.x_train, task.data.x_train)
    assert not torch.equal(parse_task("hyperplane:dim=8,n=40", seed=6).data.y_train[:40],
                           task.data.y_train[:40])  # fmt: skip


def test_full_batch_gradient_descent_decreases_the_loss(cnn) -> None:
    """Each full-batch step θ ← θ - η∇L must meet Armijo's sufficient decrease
    L(θ') ≤ L(θ) - ½η‖∇L‖², which holds for a small step only if the gradient is right."""
    theta, lr = cnn.init_params(0), 0.2
    everything = np.arange(600)[None]  # a fixed full batch: 600 of the train examples
    loss, grad = cnn.grads(theta, everything)
    first = float(loss[0])
    for _ in range(12):
        theta = theta - lr * grad[0]
        new_loss, new_grad = cnn.grads(theta, everything)
        assert float(new_loss[0]) <= float(loss[0]) - 0.5 * lr * float(grad[0].square().sum())
        loss, grad = new_loss, new_grad
    assert float(loss[0]) < first


def test_sampling_through_the_task_is_seeded(cnn) -> None:
    state = parse_partition("iid").assign(cnn, 16, np.random.default_rng(0))
    a = cnn.sample_indices(np.random.default_rng(1), np.arange(16), state)
    b = cnn.sample_indices(np.random.default_rng(1), np.arange(16), state)
    assert a.shape == (16, 32) and np.array_equal(a, b)
    assert cnn.sample_indices(np.random.default_rng(1), np.arange(3), state, count=2).shape == (
        3, 2, 32)  # fmt: skip


def test_none_task_is_timing_only() -> None:
    task = parse_task("none")
    assert (task.dim, task.has_model, task.metric_name) == (0, False, "none")
    assert task.init_params(0).shape == (0,)
    state = parse_partition("shared").assign(task, 2048, np.random.default_rng(0))
    assert state.n_workers == 2048
    idx = np.zeros((2, 1), dtype=np.int64)
    for call in (
        lambda: task.grads(torch.zeros(0), idx),
        lambda: task.grads_multi(torch.zeros(2, 0), idx),
        lambda: task.loss(torch.zeros(0), idx),
        lambda: task.evaluate(torch.zeros(0)),
        lambda: task.sample_indices(np.random.default_rng(0), np.arange(2), state),
        lambda: task.module_at(torch.zeros(0)),
    ):
        with pytest.raises(UsageError, match="'none' has no model"):
            call()
