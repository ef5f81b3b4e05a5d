"""``--task package.module:factory``: a user's model through simulate, compare and train,
bit-identical records for a seed, and one line with exit 2 for every malformed factory."""

from __future__ import annotations

import json
import sys
import textwrap

import pytest
from tests.cli.helpers import run

from tailtrain.core.capacity import check_fits
from tailtrain.errors import UsageError
from tailtrain.tasks import parse_task

MODULE = '''
import torch
import torch.nn.functional as F
from torch import nn

from tailtrain import TaskParts


def blobs():
    g = torch.Generator().manual_seed(0)
    centres = 2.0 * torch.randn(3, 6, generator=g)
    labels = torch.randint(0, 3, (400,), generator=g)
    points = centres[labels] + torch.randn(400, 6, generator=g)
    return (points[:320], labels[:320]), (points[320:], labels[320:])


def per_example(out, y):
    return F.cross_entropy(out, y, reduction="none")


def make(hidden=8, act="tanh", drop=0.0):
    train, test = blobs()
    layer = {"tanh": nn.Tanh(), "relu": nn.ReLU()}[act]
    layers = [nn.Linear(6, hidden), layer, nn.Linear(hidden, 3)]
    if drop:
        layers.insert(2, nn.Dropout(drop))
    return TaskParts(
        model=nn.Sequential(*layers), loss=per_example, train=train, test=test,
        metric=lambda o, y: (o.argmax(-1) == y).float().mean(), metric_name="accuracy",
        batch_size=8, lr=0.2,
    )


class Branchy(nn.Module):
    """Data-dependent control flow: torch.func cannot vmap it, a loop can."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(6, 3)

    def forward(self, x):
        return self.lin(x) if x.sum().item() > -1e9 else -self.lin(x)


def branchy():
    train, test = blobs()
    return TaskParts(model=Branchy(), loss=per_example, train=train, test=test)


def missing():
    train, test = blobs()
    return {"model": nn.Linear(6, 3), "train": train, "test": test}


def wrong_type():
    train, test = blobs()
    return TaskParts(model="a model", loss=per_example, train=train, test=test)


def raises():
    raise RuntimeError("no data here")


def mean_loss():
    train, test = blobs()
    return TaskParts(model=nn.Linear(6, 3), loss=F.cross_entropy, train=train, test=test)


def batch_norm():
    train, test = blobs()
    model = nn.Sequential(nn.Linear(6, 4), nn.BatchNorm1d(4), nn.Linear(4, 3))
    return TaskParts(model=model, loss=per_example, train=train, test=test)
'''

COMMON = ["--workers", "4", "--iterations", "6", "--eval-every", "3", "--delay", "const:value=0.03"]


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """A module ``usertask_<n>`` in a temporary folder that is the current directory."""
    name = f"usertask_{abs(hash(tmp_path)) % 10**8}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(MODULE))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    yield name
    sys.modules.pop(name, None)


def simulate(spec: str, out, capsys, seed: str = "1") -> dict:
    argv = ["simulate", "--task", spec, "--strategy", "k-sync:k=3", *COMMON, "--seed", seed]
    code, stdout, err = run([*argv, "--out", str(out), "--json", "--no-progress"], capsys)
    assert code == 0, err
    return json.loads(stdout)


@pytest.mark.timeout(180)
def test_a_user_factory_runs_through_simulate_compare_and_train(user_module, tmp_path, capfd):
    spec = f"{user_module}:make:hidden=12,drop=0.2"
    first = simulate(spec, tmp_path / "a", capfd)
    simulate(spec, tmp_path / "b", capfd)
    for name in ("steps.jsonl", "evals.jsonl"):  # dropout is seeded: the same seed, same bytes
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    assert first["gradients"] == "vmap" and first["eval_metric"] == "accuracy"
    assert first["final_loss"] < 1.0  # ln 3 = 1.1 at the start: it learns
    code, out, err = run(
        ["compare", "--task", spec, "--strategies", "sync,dbw", *COMMON, "--seeds", "0",
         "--out", str(tmp_path / "cmp"), "--json", "--no-progress"],
        capfd,
    )  # fmt: skip
    assert code == 0, err
    assert len(json.loads(out)["results"]) == 2
    code, out, err = run(
        ["train", "--task", spec, "--strategy", "sync", "--workers", "2", "--iterations", "4",
         "--eval-every", "4", "--out", str(tmp_path / "train"), "--json"],
        capfd,
    )  # fmt: skip
    assert code == 0, err
    assert json.loads(out)["iterations"] == 4


@pytest.mark.parametrize(
    ("factory", "says"),
    [
        ("missing", "returned no 'loss'"),
        ("wrong_type", "model is a str, not an nn.Module"),
        ("raises", "raised RuntimeError: no data here"),
        ("mean_loss", "one loss per example"),
        ("batch_norm", "changes buffer '1.running_mean'"),
        ("absent", "has no callable 'absent'"),
    ],
)
def test_a_malformed_factory_gets_one_line_and_exit_2(user_module, capsys, factory, says):
    code, _, err = run(["simulate", "--task", f"{user_module}:{factory}", *COMMON], capsys)
    assert code == 2 and says in err and err.count("\n") == 1, err


def test_an_unimportable_module_gets_one_line_and_exit_2_before_train_starts_ranks(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "broken_task_mod.py").write_text("import not_a_module_anywhere\n")
    for command in ("simulate", "train"):
        argv = [command, "--task", "broken_task_mod:make", *COMMON, "--strategy", "sync"]
        code, _, err = run(argv, capsys)
        assert code == 2 and "cannot import task module 'broken_task_mod'" in err, err
        assert err.count("\n") == 1
    sys.modules.pop("broken_task_mod", None)


def test_the_gradient_method_is_chosen_by_what_the_model_allows(user_module):
    assert parse_task(f"{user_module}:make:act=relu").gradient_method == (
        "shared-pass; per-worker θ: vmap"
    )
    assert parse_task(f"{user_module}:make").gradient_method == "vmap"
    assert parse_task(f"{user_module}:branchy").gradient_method == "loop"


def test_every_gradient_method_gives_the_same_gradients(user_module):
    import numpy as np
    import torch

    vmapped = parse_task(f"{user_module}:make")
    theta = vmapped.init_params(0)
    idx = np.random.default_rng(0).integers(0, vmapped.n_train, (5, 8))
    g_vmap = vmapped.grads(theta, idx)[1]
    g_loop = vmapped._batched(vmapped._loop_grads, theta, idx)[1]
    torch.testing.assert_close(g_vmap, g_loop)
    shared = parse_task(f"{user_module}:make:act=relu")
    g_shared = shared.grads(theta, idx)[1]
    g_multi = shared.grads_multi(theta.expand(5, -1).contiguous(), idx)[1]
    torch.testing.assert_close(g_shared, g_multi, rtol=1e-5, atol=1e-6)


def test_the_memory_check_says_how_many_workers_would_fit():
    with pytest.raises(UsageError, match=r"at most \d+ workers fit") as refused:
        check_fits(1 << 20, None, 10**9)
    assert "\n" not in str(refused.value)


def test_a_built_in_task_with_a_malformed_key_is_not_taken_for_a_factory():
    with pytest.raises(UsageError, match="'dim' should be key=value"):
        parse_task("hyperplane:dim")


def test_the_readme_example_factory_builds(monkeypatch):
    """examples/my_model.py, as docs/your-model.md runs it from the repository's root."""
    from pathlib import Path

    monkeypatch.chdir(Path(__file__).parents[2])
    monkeypatch.setattr(sys, "path", list(sys.path))
    task = parse_task("examples.my_model:make:channels=4,dropout=0.1")
    assert task.gradient_method == "vmap" and task.random  # dropout: no shared pass
    assert parse_task("examples.my_model:make").gradient_method.startswith("shared-pass")
    assert task.metric_name == "accuracy" and task.batch_size == 32
