"""Tiny MNIST (IDX) and CIFAR-10 (pickle batch) files, written in the real formats."""

from __future__ import annotations

import gzip
import pickle
from pathlib import Path

import numpy as np
import pytest

MNIST_SIDE = 28  # the DBW net needs at least 16×16; real MNIST is 28×28
MNIST_TRAIN, MNIST_TEST = 30, 12
CIFAR_PER_BATCH, CIFAR_TEST = 6, 10


def idx_bytes(array: np.ndarray, type_code: int = 0x08) -> bytes:
    """Encode ``array`` as an IDX file: 0, 0, type code, ndim, big-endian dims, data."""
    header = bytes([0, 0, type_code, array.ndim]) + np.asarray(array.shape, ">u4").tobytes()
    return header + array.astype(array.dtype.newbyteorder(">")).tobytes()


def write_mnist(root: Path, rng: np.random.Generator, *, gz: bool = False) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    splits = {"train": MNIST_TRAIN, "t10k": MNIST_TEST}
    for prefix, n in splits.items():
        images = rng.integers(0, 256, (n, MNIST_SIDE, MNIST_SIDE), dtype=np.uint8)
        labels = (np.arange(n) % 10).astype(np.uint8)
        for kind, array in (("images-idx3", images), ("labels-idx1", labels)):
            name = f"{prefix}-{kind}-ubyte"
            raw = idx_bytes(array)
            if gz:
                (root / f"{name}.gz").write_bytes(gzip.compress(raw))
            else:
                (root / name).write_bytes(raw)
    return root


def cifar_batch(rng: np.random.Generator, n: int) -> dict:
    return {
        b"batch_label": b"synthetic",
        b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
        b"labels": [int(v) for v in np.arange(n) % 10],
    }


def write_cifar(root: Path, rng: np.random.Generator, *, protocol: int = 2) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    names = [f"data_batch_{i}" for i in range(1, 6)]
    for name in names:
        (root / name).write_bytes(pickle.dumps(cifar_batch(rng, CIFAR_PER_BATCH), protocol))
    (root / "test_batch").write_bytes(pickle.dumps(cifar_batch(rng, CIFAR_TEST), protocol))
    return root


@pytest.fixture
def mnist_dir(tmp_path: Path) -> Path:
    return write_mnist(tmp_path / "mnist", np.random.default_rng(0))


@pytest.fixture
def cifar_dir(tmp_path: Path) -> Path:
    return write_cifar(tmp_path / "cifar", np.random.default_rng(1))


@pytest.fixture
def idx_encode():
    return idx_bytes


@pytest.fixture
def cifar_writer():
    return write_cifar


@pytest.fixture
def mnist_writer():
    return write_mnist


@pytest.fixture(scope="session")
def shared_data_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Read-only MNIST and CIFAR-10 folders shared by the gradient tests."""
    root = tmp_path_factory.mktemp("data")
    return {
        "mnist": write_mnist(root / "mnist", np.random.default_rng(0)),
        "cifar10": write_cifar(root / "cifar", np.random.default_rng(1)),
    }
