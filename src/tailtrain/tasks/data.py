"""In-memory datasets: the container every task trains on, and the built-in generators.

Nothing is downloaded: digits ships inside scikit-learn and the hyperplane data is synthetic.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

#: seed of the fixed digits train/test split; independent of the run seed so every run
#: of every seed is evaluated on the same held-out images
DIGITS_SPLIT_SEED = 0
DIGITS_TEST_FRACTION = 0.2


@dataclass(frozen=True)
class Dataset:
    """Train and held-out tensors. ``n_classes`` is None for regression (float targets)."""

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    n_classes: int | None

    @property
    def n_train(self) -> int:
        return int(self.x_train.shape[0])

    @property
    def sample_numel(self) -> int:
        """Number of input elements per sample (sizes the chunks of a batched call)."""
        return int(self.x_train[0].numel())

    def train_labels(self) -> np.ndarray | None:
        """Class labels of the train split as numpy (for partitioning), None for regression."""
        return None if self.n_classes is None else self.y_train.numpy()

    def trim(self, x: torch.Tensor) -> torch.Tensor:
        """Inputs as a model call should see them: unchanged here; sequence data drops the
        steps that are padding everywhere (:class:`tailtrain.tasks.sequences.SequenceDataset`)."""
        return x


def classification(
    x_train: np.ndarray, y_train: np.ndarray, x_test: np.ndarray, y_test: np.ndarray, n: int
) -> Dataset:
    """Wrap numpy arrays (inputs already scaled) into a classification :class:`Dataset`."""
    return Dataset(
        x_train=torch.from_numpy(np.ascontiguousarray(x_train, dtype=np.float32)),
        y_train=torch.from_numpy(np.asarray(y_train, dtype=np.int64)),
        x_test=torch.from_numpy(np.ascontiguousarray(x_test, dtype=np.float32)),
        y_test=torch.from_numpy(np.asarray(y_test, dtype=np.int64)),
        n_classes=n,
    )


def load_digits_data(*, image: bool) -> Dataset:
    """scikit-learn's bundled 8×8 digits, pixels scaled by 1/16 to [0, 1].

    A stratified 80/20 train/test split with a fixed seed. ``image=True`` shapes inputs
    as 1×8×8 images for a CNN, otherwise as 64-vectors.
    """
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    x = x.astype(np.float32) / 16.0
    if image:
        x = x.reshape(-1, 1, 8, 8)
    x_tr, x_te, y_tr, y_te = train_test_split(
        x, y, test_size=DIGITS_TEST_FRACTION, stratify=y, random_state=DIGITS_SPLIT_SEED
    )
    return classification(x_tr, y_tr, x_te, y_te, 10)


def make_hyperplane(dim: int, n_train: int, n_test: int, noise: float, seed: int) -> Dataset:
    """Synthetic hyperplane regression, eager-SGD §7.2.1: y = a_0 x_0 + … + a_{d-1} x_{d-1} + noise.

    The paper does not give the distributions; we draw x ~ N(0, I_d), coefficients
    a ~ N(0, 1/d) (so Var(a·x) ≈ 1 whatever d is) and Gaussian noise with std ``noise``.
    Train and validation points come from the same hyperplane.
    """
    rng = np.random.default_rng(seed)
    coef = rng.standard_normal(dim, dtype=np.float32) / np.float32(np.sqrt(dim))
    x = rng.standard_normal((n_train + n_test, dim), dtype=np.float32)
    y = x @ coef + np.float32(noise) * rng.standard_normal(n_train + n_test, dtype=np.float32)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    return Dataset(xt[:n_train], yt[:n_train], xt[n_train:], yt[n_train:], n_classes=None)
