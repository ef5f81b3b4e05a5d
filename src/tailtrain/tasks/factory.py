"""A task from the user's own code: ``--task package.module:factory[:key=value,...]``.

The factory is a callable that returns a ``TaskParts``: a model, a per-example loss,
train and test tensors, and optionally a metric, a batch size and a learning rate. The keys
after it are passed to it as keyword arguments (each value an ``int``, else a ``float``,
else the string as written). It is called under ``torch.manual_seed(seed)``, so the model's
own initialisation is the run's θ_0 and a seed gives the same θ_0 on every run and rank.

``load_factory_task`` turns the parts into the same ``Task``
a built-in task is, so every engine (simulate, compare, train, the parameter server) runs it
unchanged. Everything is checked when the task is built, which ``simulate`` does before
its first step and ``train`` does in the parent before any rank starts: an import error, a
factory that raises, a part missing or of the wrong kind, a loss of the wrong shape and a
model whose training forward changes its buffers (batch-norm running statistics, which the
simulated workers would share) each get one line naming it.
"""

from __future__ import annotations

import importlib
import math
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any

import torch
from torch import nn

from tailtrain.errors import UsageError
from tailtrain.tasks.data import Dataset
from tailtrain.tasks.task import TRAIN_EVAL_SIZE, Task

#: the parts a factory must return; the others have defaults
REQUIRED_PARTS = ("model", "loss", "train", "test")
#: a loss maps (model outputs, targets) of a batch of B examples to their B losses
PerExampleLoss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass
class TaskParts:
    """What a task factory returns.

    Args:
        model: the network; its parameters at return (drawn under the run's seed) are θ_0.
            Buffers may be constants (a causal mask); a training forward must not change them.
        loss: ``loss(outputs, targets)`` -> the (B,) per-example losses of a batch (for
            example ``F.cross_entropy(..., reduction="none")``); the task averages them,
            LGC Eq. (2)'s mean over the mini-batch.
        train: ``(inputs, targets)``, the first dimension indexing examples.
        test: ``(inputs, targets)`` held out for evaluation.
        metric: optional ``metric(outputs, targets)`` -> a number for a batch (e.g. the
            accuracy); evaluations report it as ``eval``, or the test loss when absent.
        metric_name: what ``metric`` measures, for tables and plots.
        batch_size: each worker's mini-batch B.
        lr: the default learning rate when ``--lr`` is not given.
    """

    model: nn.Module
    loss: PerExampleLoss
    train: tuple[torch.Tensor, torch.Tensor]
    test: tuple[torch.Tensor, torch.Tensor]
    metric: Callable[[torch.Tensor, torch.Tensor], Any] | None = None
    metric_name: str = "metric"
    batch_size: int = 32
    lr: float | None = None


def is_factory_spec(text: str) -> bool:
    """``module:factory[:k=v,...]``: a second field without ``=`` names a factory, whereas a
    built-in task's spec (``digits-cnn:batch=64``) has only ``key=value`` after its name."""
    _, colon, rest = text.strip().partition(":")
    return bool(colon) and "=" not in rest.partition(":")[0] and bool(rest.strip())


def split_factory_spec(text: str) -> tuple[str, str, dict[str, Any]]:
    """``(module, factory, keyword arguments)`` of a factory spec."""
    module, _, rest = text.strip().partition(":")
    name, _, keys = rest.partition(":")
    module, name = module.strip(), name.strip()
    if not module or not name.isidentifier():
        raise UsageError(f"malformed task {text!r}: write it as package.module:factory[:k=v,...]")
    kwargs: dict[str, Any] = {}
    for item in keys.split(",") if keys.strip() else ():
        key, eq, value = (s.strip() for s in item.partition("="))
        if not eq or not key.isidentifier() or not value:
            raise UsageError(f"malformed task {text!r}: {item!r} should be key=value")
        if key in kwargs:
            raise UsageError(f"malformed task {text!r}: {key!r} is given twice")
        kwargs[key] = _value(value)
    return module, name, kwargs


def _value(text: str) -> int | float | str:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def import_factory(module: str, name: str) -> Callable[..., Any]:
    """The factory ``module.name``, imported from the current directory or the environment."""
    if "" not in sys.path and "." not in sys.path:
        sys.path.insert(0, "")  # the current directory, as `python -m` puts it first
    importlib.invalidate_caches()  # a module written since the last import is found
    try:
        mod = importlib.import_module(module)
    except Exception as exc:  # an import error, or any error the module raises on import
        raise UsageError(
            f"cannot import task module {module!r} ({type(exc).__name__}: {_line(exc)}); "
            "run from the folder that holds it or install it"
        ) from None
    factory = getattr(mod, name, None)
    if not callable(factory):
        raise UsageError(f"module {module!r} has no callable {name!r}: define def {name}(...)")
    return factory


def call_factory(text: str, seed: int) -> TaskParts:
    """Import and call the factory of ``text`` under the run's seed, and check its parts."""
    module, name, kwargs = split_factory_spec(text)
    factory = import_factory(module, name)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        try:
            parts = factory(**kwargs)
        except Exception as exc:
            raise UsageError(
                f"task factory {module}:{name} raised {type(exc).__name__}: {_line(exc)}"
            ) from None
    return check_parts(parts, f"{module}:{name}")


def check_parts(parts: Any, who: str) -> TaskParts:
    """``parts`` as a ``TaskParts`` (a mapping with its field names is accepted), each
    part of the right kind; one line naming the first part that is missing or wrong."""
    if isinstance(parts, Mapping):
        missing = [k for k in REQUIRED_PARTS if k not in parts]
        if missing:
            raise UsageError(f"task factory {who} returned no {missing[0]!r}: {_HINT}")
        unknown = sorted(set(parts) - {f.name for f in fields(TaskParts)})
        if unknown:
            raise UsageError(f"task factory {who} returned unknown part {unknown[0]!r}: {_HINT}")
        parts = TaskParts(**parts)
    if not isinstance(parts, TaskParts):
        raise UsageError(
            f"task factory {who} returned {type(parts).__name__}, not a TaskParts: {_HINT}"
        )
    if not isinstance(parts.model, nn.Module):
        raise UsageError(f"task factory {who}: model is {_kind(parts.model)}, not an nn.Module")
    if not any(True for _ in parts.model.parameters()):
        raise UsageError(f"task factory {who}: the model has no parameters to train")
    if not callable(parts.loss):
        raise UsageError(f"task factory {who}: loss is {_kind(parts.loss)}, not a callable")
    if parts.metric is not None and not callable(parts.metric):
        raise UsageError(f"task factory {who}: metric is {_kind(parts.metric)}, not a callable")
    for split in ("train", "test"):
        _check_split(getattr(parts, split), split, who)
    if isinstance(parts.batch_size, bool) or not isinstance(parts.batch_size, int):
        raise UsageError(f"task factory {who}: batch_size must be an int, got {parts.batch_size!r}")
    if parts.batch_size < 1:
        raise UsageError(f"task factory {who}: batch_size must be >= 1, got {parts.batch_size}")
    if parts.lr is not None and not (isinstance(parts.lr, float | int) and 0 < parts.lr < math.inf):
        raise UsageError(f"task factory {who}: lr must be a finite number > 0, got {parts.lr!r}")
    return parts


_HINT = "return TaskParts(model=..., loss=..., train=(x, y), test=(x, y))"


def _check_split(split: Any, name: str, who: str) -> None:
    ok = isinstance(split, tuple | list) and len(split) == 2
    if not ok or not all(isinstance(t, torch.Tensor) for t in split):
        raise UsageError(f"task factory {who}: {name} must be a pair of tensors (inputs, targets)")
    x, y = split
    if x.ndim == 0 or len(x) == 0 or len(x) != len(y):
        raise UsageError(
            f"task factory {who}: {name} inputs and targets must hold the same number (>= 1) "
            f"of examples, got {tuple(x.shape)} and {tuple(y.shape)}"
        )


def parts_dataset(parts: TaskParts) -> Dataset:
    """The parts' tensors as a ``Dataset``; class labels (for ``noniid``) when the
    targets are one integer per example."""
    (x_tr, y_tr), (x_te, y_te) = parts.train, parts.test
    labels = y_tr.ndim == 1 and not y_tr.is_floating_point() and not y_tr.is_complex()
    classes = int(max(y_tr.max(), y_te.max())) + 1 if labels else None
    return Dataset(x_tr, y_tr, x_te, y_te, n_classes=classes)


def probe(model: nn.Module, loss: PerExampleLoss, data: Dataset, who: str) -> bool:
    """Run the model and the loss on two train examples: the loss must give one value per
    example, and the forward must leave the buffers as they were. True when the training
    forward is random (dropout): two draws under different seeds differ."""
    before = {n: b.detach().clone() for n, b in model.named_buffers()}
    x, y = data.trim(data.x_train[:2]), data.y_train[:2]
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            out = model(x)
            losses = loss(out, y)
    except Exception as exc:
        raise UsageError(
            f"task {who}: model and loss fail on two train examples "
            f"({type(exc).__name__}: {_line(exc)})"
        ) from None
    if not isinstance(losses, torch.Tensor) or tuple(losses.shape) != (len(y),):
        shape = tuple(losses.shape) if isinstance(losses, torch.Tensor) else _kind(losses)
        raise UsageError(
            f"task {who}: loss must return one loss per example, shape ({len(y)},) for 2 "
            f"examples, got {shape}; use reduction='none' and average the rest"
        )
    for name, buffer in model.named_buffers():
        if name in before and not torch.equal(before[name], buffer.detach()):
            raise UsageError(
                f"task {who}: the training forward changes buffer {name!r} (batch-norm "
                "statistics?), which simulated workers would share; use LayerNorm/GroupNorm "
                "or BatchNorm(track_running_stats=False)"
            )
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        again = model(x)
    return not torch.equal(out, again)


def _kind(value: Any) -> str:
    return "None" if value is None else f"a {type(value).__name__}"


def _line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else "no message"


def task_from_parts(
    parts: TaskParts,
    *,
    name: str,
    text: str,
    seed: int,
    data: Dataset | None = None,
    eval_size: int | None = None,
) -> Task:
    """The ``Task`` of ``parts``: θ_0 is the model's parameters as
    returned, and the gradient method is chosen by the task (``Task.gradient_method``).
    ``data`` replaces the plain dataset of the parts (one that trims padding); ``eval_size``
    bounds the train examples each evaluation scores."""

    dataset = parts_dataset(parts) if data is None else data
    model = parts.model.train()
    random = probe(model, parts.loss, dataset, name)
    initial = torch.nn.utils.parameters_to_vector(model.parameters()).detach().clone()
    return Task(
        name=name,
        data=dataset,
        model=model,
        batch_size=parts.batch_size,
        objective="custom",
        seed=seed,
        text=text,
        loss_fn=parts.loss,
        metric_fn=parts.metric,
        metric_label=parts.metric_name if parts.metric is not None else "test_loss",
        initial=initial,
        default_lr=None if parts.lr is None else float(parts.lr),
        random=random,
        report_gradients=True,
        train_eval_size=TRAIN_EVAL_SIZE if eval_size is None else eval_size,
    )


def load_factory_task(text: str, *, seed: int = 0) -> Task:
    """The task of a ``module:factory[:k=v,...]`` spec, checked (see the module docstring)."""
    module, name, _ = split_factory_spec(text)
    parts = call_factory(text, seed)
    return task_from_parts(parts, name=f"{module}:{name}", text=text.strip(), seed=seed)
