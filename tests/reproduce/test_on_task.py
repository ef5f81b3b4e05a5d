"""`tailtrain reproduce NAME --task SPEC`: a reproduction on a user's factory, and the one-line
refusals where it cannot run on another task."""

from __future__ import annotations

import sys
import textwrap

import pytest

from tailtrain.cli import main
from tailtrain.reproduce.runs import stand_in, task_with

MODULE = """
import torch
import torch.nn.functional as F
from torch import nn

from tailtrain import TaskParts


def make(batch=8):
    g = torch.Generator().manual_seed(0)
    centres = 2.0 * torch.randn(3, 6, generator=g)
    labels = torch.randint(0, 3, (200,), generator=g)
    points = centres[labels] + torch.randn(200, 6, generator=g)
    return TaskParts(
        model=nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3)),
        loss=lambda out, y: F.cross_entropy(out, y, reduction="none"),
        train=(points[:160], labels[:160]), test=(points[160:], labels[160:]),
        batch_size=batch, lr=0.2,
    )
"""


@pytest.fixture
def factory_module(tmp_path, monkeypatch):
    (tmp_path / "repro_factory.py").write_text(textwrap.dedent(MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "repro_factory:make"
    sys.modules.pop("repro_factory", None)


def test_a_reproduction_runs_on_a_factory_and_names_it(factory_module, tmp_path, capsys):
    # eager-fig12: the quickest reproduction that trains a model
    out = tmp_path / "fig12"
    assert (
        main(["reproduce", "eager-fig12", "--quick", "--out", str(out), "--task", factory_module])
        == 0
    )
    report = (out / "report.md").read_text()
    assert f"`{factory_module}" in report
    assert "digits-mlp" not in report
    assert "eta = None" not in report and "eta = the task default" in report
    assert f"--task {factory_module}`" in report  # the line that wrote it says how
    assert f"Run on `{factory_module}` in place of the experiment's own task" in report


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["dropcompute-fig1", "--task", "logreg"], "trains no model"),
        (["all", "--task", "logreg"], "one experiment at a time"),
        (["dbw-fig6", "--task", "no_such_module_27:make"], "cannot import task module"),
    ],
)
def test_task_where_it_cannot_apply_is_one_line_and_status_2(argv, says, tmp_path, capsys):
    assert main(["reproduce", *argv, "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and says in err
    assert not (tmp_path / "r").exists()


def test_task_with_adds_a_key_to_any_spec():
    assert task_with("logreg", "batch", 16) == "logreg:batch=16"
    assert task_with("digits-mlp:hidden=8", "batch", 16) == "digits-mlp:hidden=8,batch=16"
    assert task_with("pkg.mod:make", "batch", 16) == "pkg.mod:make:batch=16"
    assert task_with("pkg.mod:make:width=4", "batch", 16) == "pkg.mod:make:width=4,batch=16"


def test_only_the_digits_tasks_are_called_digits():
    assert stand_in("logreg", "MNIST") == "scikit-learn digits in place of MNIST"
    assert stand_in("digits-cnn:batch=8", "CIFAR-10") == "scikit-learn digits in place of CIFAR-10"
    assert stand_in("tiny-gpt", "CIFAR-10") == "in place of CIFAR-10"
    assert stand_in("pkg.mod:make:width=4", "MNIST") == "in place of MNIST"
