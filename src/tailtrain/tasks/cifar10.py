"""CIFAR-10 from the local "python version" pickle batches.

Each of ``data_batch_1`` … ``data_batch_5`` and ``test_batch`` is a pickled dict with
``b"data"`` (uint8, N×3072, channel-major 3×32×32 rows) and ``b"labels"`` (N ints in 0..9).
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import numpy as np

from tailtrain.errors import UsageError
from tailtrain.tasks.data import Dataset, classification

TRAIN_FILES = tuple(f"data_batch_{i}" for i in range(1, 6))
TEST_FILE = "test_batch"
PIXELS = 3 * 32 * 32

# Only what a CIFAR batch needs: unpickling is code execution, so refuse anything else.
_ALLOWED = {
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.numeric", "_frombuffer"),
    ("numpy._core.numeric", "_frombuffer"),
    ("_codecs", "encode"),
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
}


class _BatchUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in _ALLOWED:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name}")
        return super().find_class(module, name)


def read_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """One pickle batch as (uint8 images N×3×32×32, int64 labels N), validated."""
    try:
        with path.open("rb") as f:
            batch = _BatchUnpickler(f, encoding="bytes").load()
    except FileNotFoundError:
        raise UsageError(f"--data: CIFAR-10 file {path} not found") from None
    except (OSError, EOFError, pickle.UnpicklingError, ValueError, TypeError) as exc:
        raise UsageError(f"CIFAR-10 file {path} is not a readable pickle batch: {exc}") from None
    if not isinstance(batch, dict) or b"data" not in batch or b"labels" not in batch:
        raise UsageError(f"CIFAR-10 file {path} lacks the b'data'/b'labels' entries")
    data = np.asarray(batch[b"data"])
    labels = np.asarray(batch[b"labels"])
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != PIXELS:
        raise UsageError(
            f"CIFAR-10 file {path}: data must be uint8 N×{PIXELS}, got {data.dtype} {data.shape}"
        )
    if labels.shape != (data.shape[0],) or not np.issubdtype(labels.dtype, np.integer):
        raise UsageError(f"CIFAR-10 file {path}: needs {data.shape[0]} integer labels")
    if labels.size and (labels.min() < 0 or labels.max() > 9):
        raise UsageError(f"CIFAR-10 file {path} has labels outside 0..9; the file is corrupt")
    return data.reshape(-1, 3, 32, 32), labels.astype(np.int64)


def batch_folder(root: Path) -> Path:
    """``root`` itself or the ``cifar-10-batches-py`` folder the official archive unpacks to."""
    if not root.is_dir():
        raise UsageError(f"--data {root} is not a folder holding the CIFAR-10 python batches")
    nested = root / "cifar-10-batches-py"
    return nested if (nested / TEST_FILE).is_file() else root


def load_cifar10(root: str | Path) -> Dataset:
    """CIFAR-10, inputs standardised per channel with the train split's mean and std."""
    folder = batch_folder(Path(root))
    parts = [read_batch(folder / name) for name in TRAIN_FILES]
    x_tr = np.concatenate([p[0] for p in parts]).astype(np.float32) / 255
    y_tr = np.concatenate([p[1] for p in parts])
    x_te, y_te = read_batch(folder / TEST_FILE)
    mean = x_tr.mean(axis=(0, 2, 3), keepdims=True)
    std = x_tr.std(axis=(0, 2, 3), keepdims=True) + np.float32(1e-6)  # guards a constant channel
    x_te = (x_te.astype(np.float32) / 255 - mean) / std
    return classification((x_tr - mean) / std, y_tr, x_te, y_te, 10)
