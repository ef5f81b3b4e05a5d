"""MNIST from local IDX files (LeCun's format), optionally gzip-compressed.

IDX layout: two zero bytes, a type code, the number of dimensions, then one big-endian
uint32 per dimension, then the data in big-endian order.
"""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np

from tailtrain.errors import UsageError
from tailtrain.tasks.data import Dataset, classification

FILES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}
# IDX type code -> big-endian numpy dtype
_IDX_TYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def parse_idx(raw: bytes, name: str) -> np.ndarray:
    """Decode one IDX file's bytes; ``name`` only labels the error messages."""
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_TYPES:
        raise UsageError(
            f"{name} is not an IDX file (bad magic number); re-extract the MNIST files"
        )
    ndim = raw[3]
    header = 4 + 4 * ndim
    if ndim == 0 or len(raw) < header:
        raise UsageError(f"{name} has a truncated IDX header; re-extract the MNIST files")
    dims = tuple(int(d) for d in np.frombuffer(raw, dtype=">u4", count=ndim, offset=4))
    dtype = np.dtype(_IDX_TYPES[raw[2]])
    expected = int(np.prod(dims)) * dtype.itemsize
    if len(raw) - header != expected:
        raise UsageError(
            f"{name} holds {len(raw) - header} data bytes but its header {dims} needs "
            f"{expected}; the file is truncated or corrupt"
        )
    return np.frombuffer(raw, dtype=dtype, offset=header).reshape(dims)


def find_file(root: Path, stem: str) -> Path:
    """The file ``stem`` or ``stem.gz`` in ``root`` or in torchvision's ``root/MNIST/raw``."""
    for folder in (root, root / "MNIST" / "raw"):
        for candidate in (folder / stem, folder / f"{stem}.gz"):
            if candidate.is_file():
                return candidate
    raise UsageError(f"--data {root}: MNIST file {stem} (or {stem}.gz) not found there")


def read_idx(path: Path) -> np.ndarray:
    """Read and decode one IDX file, decompressing ``.gz``."""
    try:
        raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    except (OSError, EOFError, gzip.BadGzipFile) as exc:
        raise UsageError(f"cannot read MNIST file {path}: {exc}") from None
    return parse_idx(raw, str(path))


def _read_split(root: Path, images_key: str, labels_key: str) -> tuple[np.ndarray, np.ndarray]:
    images_path = find_file(root, FILES[images_key])
    labels_path = find_file(root, FILES[labels_key])
    images, labels = read_idx(images_path), read_idx(labels_path)
    if images.ndim != 3 or images.dtype != np.uint8:
        raise UsageError(f"{images_path} must hold uint8 images N×rows×cols, got {images.shape}")
    if labels.ndim != 1 or labels.shape[0] != images.shape[0]:
        raise UsageError(
            f"{labels_path} must hold one label per image ({images.shape[0]}), got {labels.shape}"
        )
    if labels.size and (labels.min() < 0 or labels.max() > 9):
        raise UsageError(f"{labels_path} has labels outside 0..9; the file is corrupt")
    return images, labels


def load_mnist(root: str | Path) -> Dataset:
    """MNIST train and t10k splits from IDX files in ``root``; pixels scaled to [0, 1]."""
    root = Path(root)
    if not root.is_dir():
        raise UsageError(f"--data {root} is not a folder holding the MNIST IDX files")
    x_tr, y_tr = _read_split(root, "train_images", "train_labels")
    x_te, y_te = _read_split(root, "test_images", "test_labels")
    if x_tr.shape[1:] != x_te.shape[1:]:
        raise UsageError(
            f"--data {root}: train images {x_tr.shape[1:]} and test images "
            f"{x_te.shape[1:]} differ in size"
        )
    scale = np.float32(1 / 255)
    return classification(x_tr[:, None] * scale, y_tr, x_te[:, None] * scale, y_te, 10)
