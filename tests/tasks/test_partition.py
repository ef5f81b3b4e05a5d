"""Partitions: iid shards, shared sampling, LGC's non-IID(c), and mini-batch sampling."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tailtrain.errors import UsageError
from tailtrain.tasks import Partition, parse_partition


@dataclass
class FakeData:
    """Just what a partition reads from a task."""

    labels: np.ndarray | None
    n: int
    classes: int | None

    @property
    def n_train(self) -> int:
        return self.n

    @property
    def n_classes(self) -> int | None:
        return self.classes

    def train_labels(self) -> np.ndarray | None:
        return self.labels


def labelled(n: int, k: int, seed: int = 0) -> FakeData:
    labels = np.random.default_rng(seed).permutation(np.arange(n) % k)
    return FakeData(labels, n, k)


def shards(state) -> list[np.ndarray]:
    return [state.shard(w) for w in range(state.n_workers)]


@given(n=st.integers(1, 300), workers=st.integers(1, 64), seed=st.integers(0, 2**32 - 1))
@settings(max_examples=60, deadline=None)
def test_iid_shards_are_a_disjoint_near_equal_cover(n: int, workers: int, seed: int) -> None:
    data = FakeData(None, n, None)
    part = parse_partition("iid")
    if workers > n:
        with pytest.raises(UsageError, match="without data"):
            part.assign(data, workers, np.random.default_rng(seed))
        return
    state = part.assign(data, workers, np.random.default_rng(seed))
    together = np.concatenate(shards(state))
    assert np.array_equal(np.sort(together), np.arange(n))
    assert state.sizes.max() - state.sizes.min() <= 1


def test_shared_gives_everyone_everything() -> None:
    data = FakeData(None, 40, None)
    state = parse_partition("shared").assign(data, 2048, np.random.default_rng(0))
    assert state.n_workers == 2048
    assert all(np.array_equal(state.shard(w), np.arange(40)) for w in (0, 777, 2047))


@given(
    workers=st.integers(1, 40),
    c=st.integers(1, 10),
    seed=st.integers(0, 2**32 - 1),
)
@settings(max_examples=60, deadline=None)
def test_noniid_each_worker_sees_exactly_c_classes(workers: int, c: int, seed: int) -> None:
    data = labelled(400, 10, seed=1)
    state = Partition("noniid", c, f"noniid:classes={c}").assign(
        data, workers, np.random.default_rng(seed)
    )
    assert state.classes is not None and state.classes.shape == (workers, c)
    for w, shard in enumerate(shards(state)):
        assert set(np.unique(data.labels[shard])) == set(state.classes[w])
    together = np.concatenate(shards(state))
    assert np.unique(together).size == together.size  # disjoint shards
    if workers * c >= 10:  # every class held by someone, so nothing is dropped
        assert together.size == data.n


def test_noniid_splits_a_class_evenly_among_its_holders() -> None:
    data = labelled(1000, 10)
    state = parse_partition("noniid:classes=2").assign(data, 10, np.random.default_rng(3))
    # 10 workers × 2 classes over 10 classes: each class has 2 holders, 50 examples each
    counts = np.array([[np.sum(data.labels[s] == k) for k in range(10)] for s in shards(state)])
    assert np.all(np.isin(counts, (0, 50)))
    assert np.all((counts > 0).sum(axis=0) == 2)


@pytest.mark.parametrize(
    ("text", "data", "workers", "message"),
    [
        ("noniid:classes=2", FakeData(None, 50, None), 4, "classification"),
        ("noniid:classes=11", labelled(100, 10), 4, "exceeds"),
        ("noniid:classes=1", labelled(20, 10), 30, "without data"),
        ("iid", FakeData(None, 10, None), 11, "without data"),
    ],
)
def test_partition_validates_against_the_task(text, data, workers, message) -> None:
    with pytest.raises(UsageError, match=message):
        parse_partition(text).assign(data, workers, np.random.default_rng(0))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("random", "known: iid, shared, noniid"),
        ("iid:classes=2", "does not take"),
        ("noniid", "classes"),
        ("noniid:classes=0", ">= 1"),
    ],
)
def test_parse_partition_errors(text: str, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        parse_partition(text)


def test_sampling_stays_in_each_shard_and_repeats_with_the_seed() -> None:
    data = labelled(300, 10)
    state = parse_partition("noniid:classes=3").assign(data, 12, np.random.default_rng(0))
    workers = np.array([3, 0, 11, 3])
    idx = state.sample(np.random.default_rng(9), workers, batch=7)
    assert idx.shape == (4, 7)
    for row, w in zip(idx, workers, strict=True):
        assert np.isin(row, state.shard(w)).all()
    many = state.sample(np.random.default_rng(9), workers, batch=7, count=5)
    assert many.shape == (4, 5, 7)
    assert np.array_equal(many, state.sample(np.random.default_rng(9), workers, 7, count=5))
    assert not np.array_equal(many, state.sample(np.random.default_rng(10), workers, 7, count=5))


def test_sampling_is_uniform_over_the_shard() -> None:
    """Counts per example match draws/size within 4 standard errors of a binomial count."""
    state = parse_partition("iid").assign(FakeData(None, 40, None), 8, np.random.default_rng(0))
    draws = 20000
    idx = state.sample(np.random.default_rng(1), np.array([5]), batch=draws)[0]
    shard = state.shard(5)
    counts = np.array([np.sum(idx == i) for i in shard])
    p = 1 / shard.size
    assert np.all(np.abs(counts - draws * p) <= 4 * np.sqrt(draws * p * (1 - p)))
