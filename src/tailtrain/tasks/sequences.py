"""Synthetic variable-length sequences whose lengths follow a heavy-tailed law.

eager-SGD §2.1 motivates load imbalance that comes from the data itself: an LSTM's cost is
proportional to the number of frames, and UCF101's training videos range from 29 to 1,776
frames. This generator gives a small, download-free stand-in for that workload.

Lengths are a clipped, floored Pareto law, L = min(max_len, ⌊min_len · U^(-1/shape)⌋) with
U ~ U(0, 1], so that P(L ≥ x) = (min_len / x)^shape for every integer min_len ≤ x ≤ max_len
and L never exceeds max_len. The defaults, 8 to 256 with shape 1.5, put the median at 12
and the mean near 20; the longest sequence of a 32-sequence batch has its median near 100,
and one batch in six holds a sequence clipped to 256. They are not fitted to UCF101, whose
lengths are less skewed (mean 187, std 97 frames).

Sequence i with class c_i has frames x_t = signal · μ_{c_i} + ε_t for t < L_i, where the
class means μ_c are random unit vectors and ε_t ~ N(0, I): the class is recoverable by
averaging the frames, more reliably the longer the sequence. Each stored sample is
(max_len, features + 1): the frames, zero-padded, and a last channel that is 1 on the L_i
valid steps and 0 after. Both splits are stored in order of length, like the length buckets
of variable-length training (eager-SGD §2.1), so that evaluation chunks are trimmed well;
every sampler draws indices at random, so the order does not reach training.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from tailtrain.errors import UsageError
from tailtrain.tasks.data import Dataset

#: refuse data sets above this many float32 elements (1 GiB) with a usage error
MAX_ELEMENTS = 1 << 28


@dataclass(frozen=True)
class SequenceDataset(Dataset):
    """A :class:`Dataset` of padded sequences with a validity mask as the last channel."""

    train_lengths: torch.Tensor
    test_lengths: torch.Tensor

    def trim(self, x: torch.Tensor) -> torch.Tensor:
        """Drop the trailing steps that are padding in every sequence of ``x`` (..., T, C),
        so that a batch costs time in proportion to its longest sequence."""
        steps = x.shape[-2]
        if x.numel() == 0:
            return x
        longest = int(x[..., -1].reshape(-1, steps).amax(0).sum())  # masks are prefixes
        return x[..., :longest, :]


@dataclass(frozen=True)
class SequenceSpec:
    """Parameters of :func:`make_sequences` (the ``seq-lstm`` spec keys)."""

    classes: int = 10
    features: int = 8
    min_len: int = 8
    max_len: int = 256
    shape: float = 1.5
    n_train: int = 4096
    n_test: int = 1024
    signal: float = 1.0


def pareto_lengths(
    rng: np.random.Generator, count: int, min_len: int, max_len: int, shape: float
) -> np.ndarray:
    """``count`` lengths with P(L ≥ x) = (min_len / x)^shape, clipped to ``max_len``."""
    u = 1.0 - rng.random(count)  # in (0, 1]: no division by zero
    raw = np.floor(min_len * u ** (-1.0 / shape))
    return np.minimum(raw, max_len).astype(np.int64)


def make_sequences(spec: SequenceSpec, seed: int) -> SequenceDataset:
    """Both splits of the synthetic sequence task, a pure function of ``spec`` and ``seed``."""
    n = spec.n_train + spec.n_test
    elements = n * spec.max_len * (spec.features + 1)
    if elements > MAX_ELEMENTS:
        raise UsageError(
            f"seq-lstm data would hold {elements * 4 / 2**30:.1f} GiB; "
            "lower n, test, max-len or features"
        )
    rng = np.random.default_rng(seed)
    means = rng.standard_normal((spec.classes, spec.features))
    means /= np.linalg.norm(means, axis=1, keepdims=True)
    labels = rng.integers(0, spec.classes, n)
    lengths = pareto_lengths(rng, n, spec.min_len, spec.max_len, spec.shape)
    valid = np.arange(spec.max_len) < lengths[:, None]  # (n, T), row-major: sample by sample
    x = np.zeros((n, spec.max_len, spec.features + 1), dtype=np.float32)
    frames = spec.signal * np.repeat(means[labels], lengths, axis=0)
    x[valid, :-1] = frames + rng.standard_normal(frames.shape)
    x[..., -1] = valid
    tr, te = _by_length(lengths[: spec.n_train]), spec.n_train + _by_length(lengths[spec.n_train :])
    return SequenceDataset(
        x_train=torch.from_numpy(x[tr]),
        y_train=torch.from_numpy(labels[tr]),
        x_test=torch.from_numpy(x[te]),
        y_test=torch.from_numpy(labels[te]),
        n_classes=spec.classes,
        train_lengths=torch.from_numpy(lengths[tr]),
        test_lengths=torch.from_numpy(lengths[te]),
    )


def _by_length(lengths: np.ndarray) -> np.ndarray:
    return np.argsort(lengths, kind="stable")
