"""``parse_task``: from a spec such as ``digits-cnn:batch=64`` to a ready :class:`Task`.

Defaults follow the papers where they say: hyperplane d = 8,192 with 32,768 points and
2,048/8 = 256 per worker (eager-SGD Table 1), MNIST B = 500 (DBW §5), CIFAR-10 B = 32
(LGC §III-A); the digits tasks and ``seq-lstm`` use 32 (eager-SGD's UCF101 LSTM uses 128/8
= 16 per process, Table 1).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from tailtrain.errors import UsageError
from tailtrain.spec import Spec, parse_spec
from tailtrain.tasks import models
from tailtrain.tasks.cifar10 import load_cifar10
from tailtrain.tasks.corpus import TokenDataset
from tailtrain.tasks.data import load_digits_data, make_hyperplane
from tailtrain.tasks.factory import is_factory_spec, load_factory_task, task_from_parts
from tailtrain.tasks.gpt import make_tiny_gpt
from tailtrain.tasks.mnist import load_mnist
from tailtrain.tasks.sequences import SequenceSpec, make_sequences
from tailtrain.tasks.task import Task

DataPath = str | Path | None
_COMMON = ("batch", "l2")


def _model_task(spec: Spec, seed: int, default_batch: int, extra: tuple[str, ...] = ()) -> dict:
    """Validate the spec's keys and read the options every model task takes."""
    spec.require_known(_COMMON + extra)
    return {
        "name": spec.name,
        "batch_size": spec.get_int("batch", default_batch, minimum=1),
        "l2": spec.get_float("l2", 0.0, minimum=0.0),
        "seed": seed,
        "text": spec.text,
    }


def _digits_cnn(spec: Spec, data: DataPath, seed: int) -> Task:
    opts = _model_task(spec, seed, 32)
    return Task(
        data=load_digits_data(image=True),
        model=models.digits_cnn(),
        objective="cross_entropy",
        **opts,
    )


def _digits_mlp(spec: Spec, data: DataPath, seed: int) -> Task:
    opts = _model_task(spec, seed, 32, ("hidden",))
    hidden = spec.get_int("hidden", 64, minimum=1)
    return Task(
        data=load_digits_data(image=False),
        model=models.mlp(64, hidden, 10),
        objective="cross_entropy",
        **opts,
    )


def _logreg(spec: Spec, data: DataPath, seed: int) -> Task:
    """Multinomial logistic regression on the digits: convex (strongly so with l2 > 0)."""
    opts = _model_task(spec, seed, 32)
    return Task(
        data=load_digits_data(image=False),
        model=models.linear(64, 10),
        objective="cross_entropy",
        **opts,
    )


def _hyperplane(spec: Spec, data: DataPath, seed: int) -> Task:
    opts = _model_task(spec, seed, 256, ("dim", "n", "test", "noise"))
    dim = spec.get_int("dim", 8192, minimum=1)
    n = spec.get_int("n", 4 * dim, minimum=1)
    test = spec.get_int("test", max(1, n // 4), minimum=1)
    noise = spec.get_float("noise", 0.1, minimum=0.0)
    dataset = make_hyperplane(dim, n, test, noise, seed)
    return Task(data=dataset, model=models.linear(dim, 1), objective="mse", **opts)


def _seq_lstm(spec: Spec, data: DataPath, seed: int) -> Task:
    """An LSTM classifier over heavy-tailed variable-length sequences (eager-SGD §2.1)."""
    keys = ("classes", "features", "hidden", "min-len", "max-len", "shape", "n", "test")
    opts = _model_task(spec, seed, 32, (*keys, "signal"))
    d = SequenceSpec()
    min_len = spec.get_int("min-len", d.min_len, minimum=1)
    seq = SequenceSpec(
        classes=spec.get_int("classes", d.classes, minimum=2),
        features=spec.get_int("features", d.features, minimum=1),
        min_len=min_len,
        max_len=spec.get_int("max-len", max(d.max_len, min_len), minimum=min_len),
        shape=spec.get_float("shape", d.shape, positive=True),
        n_train=spec.get_int("n", d.n_train, minimum=1),
        n_test=spec.get_int("test", d.n_test, minimum=1),
        signal=spec.get_float("signal", d.signal, minimum=0.0),
    )
    hidden = spec.get_int("hidden", 32, minimum=1)
    return Task(
        data=make_sequences(seq, seed),
        model=models.lstm_classifier(seq.features, hidden, seq.classes),
        objective="cross_entropy",
        per_worker_loop=True,
        **opts,
    )


def _mnist(spec: Spec, data: DataPath, seed: int) -> Task:
    opts = _model_task(spec, seed, 500)
    dataset = load_mnist(data)
    side = int(dataset.x_train.shape[-1])
    return Task(data=dataset, model=models.mnist_cnn(side), objective="cross_entropy", **opts)


def _cifar10(spec: Spec, data: DataPath, seed: int) -> Task:
    opts = _model_task(spec, seed, 32)
    return Task(
        data=load_cifar10(data), model=models.cifar_cnn(), objective="cross_entropy", **opts
    )


def _tiny_gpt(spec: Spec, data: DataPath, seed: int) -> Task:
    """A small decoder-only transformer on the standard library's source (``tasks.gpt``)."""
    spec.require_known(
        ("batch", "layers", "width", "heads", "context", "dropout", "n", "test", "lr")
    )
    d = {"layers": 2, "width": 128, "heads": 4, "context": 128, "batch": 2, "test": 64}
    opts = {k: spec.get_int(k, v, minimum=1) for k, v in d.items()}
    if opts["width"] % opts["heads"]:
        raise UsageError(
            f"tiny-gpt: width {opts['width']} must be a multiple of heads {opts['heads']}"
        )
    dropout = spec.get_float("dropout", 0.0, minimum=0.0)
    if dropout >= 1:
        raise UsageError(f"tiny-gpt: dropout must be < 1, got {dropout:g}")
    n = spec.get_int("n", 0, minimum=1) if spec.has("n") else None
    lr = spec.get_float("lr", 0.1, positive=True)
    with torch.random.fork_rng(devices=[]):  # the model's own init, under the run's seed
        torch.manual_seed(seed)
        parts = make_tiny_gpt(**opts, dropout=dropout, n=n, lr=lr)
    (x_tr, y_tr), (x_te, y_te) = parts.train, parts.test
    dataset = TokenDataset(x_tr, y_tr, x_te, y_te, n_classes=None)
    return task_from_parts(
        parts, name="tiny-gpt", text=spec.text, seed=seed, data=dataset, eval_size=opts["test"]
    )


def _none(spec: Spec, data: DataPath, seed: int) -> Task:
    """Timing only: no data, no model, dim 0."""
    spec.require_known(())
    return Task(
        name="none",
        data=None,
        model=None,
        batch_size=0,
        objective="none",
        seed=seed,
        text=spec.text,
    )


_BUILDERS: dict[str, Callable[[Spec, DataPath, int], Task]] = {
    "digits-cnn": _digits_cnn,
    "digits-mlp": _digits_mlp,
    "logreg": _logreg,
    "hyperplane": _hyperplane,
    "seq-lstm": _seq_lstm,
    "tiny-gpt": _tiny_gpt,
    "none": _none,
    "mnist": _mnist,
    "cifar10": _cifar10,
}
KNOWN_TASKS = tuple(_BUILDERS)
NEEDS_DATA = ("mnist", "cifar10")


def parse_task(text: str, *, data: DataPath = None, seed: int = 0) -> Task:
    """Build the task named by ``text``; ``mnist`` and ``cifar10`` read files from ``data``.

    ``package.module:factory[:key=value,...]`` builds a task from the user's factory
    (:mod:`tailtrain.tasks.factory`): the same kind of :class:`Task` as a built-in one."""
    if is_factory_spec(text) and text.partition(":")[0].strip() not in _BUILDERS:
        if data is not None:
            raise UsageError(f"task {text!r} is built by its factory and takes no --data")
        return load_factory_task(text, seed=seed)
    spec = parse_spec(text, what="task")
    builder = _BUILDERS.get(spec.name)
    if builder is None:
        raise UsageError(
            f"unknown task {spec.name!r}; known tasks: {', '.join(KNOWN_TASKS)}, or your own "
            "as package.module:factory"
        )
    if spec.name in NEEDS_DATA and data is None:
        raise UsageError(f"task {spec.name!r} reads local files: give --data PATH")
    if spec.name not in NEEDS_DATA and data is not None:
        raise UsageError(
            f"task {spec.name!r} is built in and takes no --data; drop --data "
            f"or use one of {', '.join(NEEDS_DATA)}"
        )
    return builder(spec, data, seed)
