"""MNIST IDX and CIFAR-10 pickle loaders on tiny files written in the real formats."""

from __future__ import annotations

import gzip
import os
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from tailtrain.errors import UsageError
from tailtrain.tasks import parse_task
from tailtrain.tasks.cifar10 import load_cifar10
from tailtrain.tasks.mnist import load_mnist, parse_idx


def test_idx_round_trip_of_every_type(idx_encode) -> None:
    for code, dtype in [(0x08, np.uint8), (0x09, np.int8), (0x0B, np.int16),
                        (0x0C, np.int32), (0x0D, np.float32), (0x0E, np.float64)]:  # fmt: skip
        array = (np.arange(24) - 5).astype(dtype).reshape(2, 3, 4)
        decoded = parse_idx(idx_encode(array, code), "x")
        assert decoded.shape == (2, 3, 4) and np.array_equal(decoded, array)


def test_mnist_loads_raw_and_gz(tmp_path: Path, mnist_writer) -> None:
    rng = np.random.default_rng(0)
    raw = load_mnist(mnist_writer(tmp_path / "raw", rng))
    gz = load_mnist(mnist_writer(tmp_path / "gz", np.random.default_rng(0), gz=True))
    assert raw.x_train.shape == (30, 1, 28, 28) and raw.x_test.shape == (12, 1, 28, 28)
    assert torch.equal(raw.x_train, gz.x_train) and torch.equal(raw.y_test, gz.y_test)
    assert raw.x_train.min() >= 0.0 and raw.x_train.max() <= 1.0
    assert raw.n_classes == 10 and raw.y_train.dtype == torch.int64


def test_mnist_in_torchvision_layout(tmp_path: Path, mnist_writer) -> None:
    mnist_writer(tmp_path / "MNIST" / "raw", np.random.default_rng(0))
    assert load_mnist(tmp_path).n_train == 30


def test_mnist_task_trains_on_the_files(mnist_dir: Path) -> None:
    task = parse_task("mnist:batch=5", data=mnist_dir)
    assert task.batch_size == 5 and task.n_train == 30
    report = task.evaluate(task.init_params(0))
    assert 0.0 <= report["eval"] <= 1.0 and np.isfinite(report["eval_loss"])


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda b: b"\x01" + b[1:], "magic"),
        (lambda b: b[:2] + b"\x07" + b[3:], "magic"),
        (lambda b: b[:-1], "truncated or corrupt"),
        (lambda b: b + b"\x00", "truncated or corrupt"),
        (lambda b: b[:6], "truncated IDX header"),
    ],
)
def test_corrupt_idx_names_the_file(mnist_dir: Path, damage, message: str) -> None:
    path = mnist_dir / "train-images-idx3-ubyte"
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(UsageError, match=message) as err:
        load_mnist(mnist_dir)
    assert "train-images-idx3-ubyte" in str(err.value)


def test_mnist_label_problems(mnist_dir: Path, idx_encode) -> None:
    labels = mnist_dir / "t10k-labels-idx1-ubyte"
    labels.write_bytes(idx_encode(np.zeros(5, np.uint8)))
    with pytest.raises(UsageError, match="one label per image"):
        load_mnist(mnist_dir)
    labels.write_bytes(idx_encode(np.full(12, 10, np.uint8)))
    with pytest.raises(UsageError, match=r"outside 0\.\.9"):
        load_mnist(mnist_dir)


def test_missing_mnist_file_and_bad_gzip(mnist_dir: Path) -> None:
    (mnist_dir / "t10k-images-idx3-ubyte").unlink()
    with pytest.raises(UsageError, match=r"t10k-images-idx3-ubyte.*not found"):
        load_mnist(mnist_dir)
    (mnist_dir / "t10k-images-idx3-ubyte.gz").write_bytes(b"not gzip at all")
    with pytest.raises(UsageError, match="cannot read MNIST file"):
        load_mnist(mnist_dir)
    with pytest.raises(UsageError, match="--data"):
        load_mnist(mnist_dir / "nowhere")


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_cifar_loads_every_pickle_protocol(tmp_path: Path, cifar_writer, protocol: int) -> None:
    data = load_cifar10(cifar_writer(tmp_path, np.random.default_rng(1), protocol=protocol))
    assert data.x_train.shape == (30, 3, 32, 32) and data.x_test.shape == (10, 3, 32, 32)
    assert torch.equal(data.y_train, torch.arange(30) % 6 % 10)
    # standardised per channel with train statistics
    torch.testing.assert_close(data.x_train.mean(dim=(0, 2, 3)), torch.zeros(3), atol=1e-4, rtol=0)
    torch.testing.assert_close(data.x_train.std(dim=(0, 2, 3), unbiased=False), torch.ones(3),
                               atol=1e-3, rtol=0)  # fmt: skip


def test_cifar_in_the_archive_folder(tmp_path: Path, cifar_writer) -> None:
    cifar_writer(tmp_path / "cifar-10-batches-py", np.random.default_rng(1))
    assert parse_task("cifar10", data=tmp_path).n_train == 30


def test_cifar_pixel_order_is_channel_major(tmp_path: Path, cifar_writer) -> None:
    root = cifar_writer(tmp_path, np.random.default_rng(1))
    batch = pickle.loads((root / "data_batch_1").read_bytes())
    data = load_cifar10(root)
    raw = batch[b"data"][0].astype(np.float64)
    # channel 0 of image 0 is the first 1024 bytes, row-major: compare after undoing the scaling
    x = data.x_train[0, 0].numpy().reshape(-1)
    assert np.corrcoef(x, raw[:1024])[0, 1] > 0.999


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"garbage", "not a readable pickle"),
        (pickle.dumps([1, 2, 3]), "lacks"),
        (pickle.dumps({b"data": np.zeros((2, 10), np.uint8), b"labels": [0, 1]}), "uint8 N×3072"),
        (pickle.dumps({b"data": np.zeros((2, 3072), np.uint8), b"labels": [0]}), "integer labels"),
        (pickle.dumps({b"data": np.zeros((1, 3072), np.uint8), b"labels": [12]}), "outside"),
        (pickle.dumps(os.system), "refusing to load"),
    ],
)
def test_corrupt_cifar_names_the_file(cifar_dir: Path, content: bytes, message: str) -> None:
    (cifar_dir / "data_batch_3").write_bytes(content)
    with pytest.raises(UsageError, match=message) as err:
        load_cifar10(cifar_dir)
    assert "data_batch_3" in str(err.value)


def test_missing_cifar_file(cifar_dir: Path) -> None:
    (cifar_dir / "data_batch_5").unlink()
    with pytest.raises(UsageError, match="data_batch_5 not found"):
        load_cifar10(cifar_dir)
    with pytest.raises(UsageError, match="--data"):
        load_cifar10(cifar_dir / "absent")


def test_gz_helper_is_real_gzip(tmp_path: Path, mnist_writer) -> None:
    root = mnist_writer(tmp_path, np.random.default_rng(0), gz=True)
    raw = gzip.decompress((root / "train-labels-idx1-ubyte.gz").read_bytes())
    assert raw[:4] == bytes([0, 0, 8, 1])
