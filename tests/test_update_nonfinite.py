"""The shared update path drops a non-finite gradient as if it had not arrived."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from tailtrain.strategies.base import Selection, Weighting, arrival_keys
from tailtrain.update import NonFiniteGradient, WeightedUpdate, gradient_stats

KEYS = arrival_keys(np.array([0, 1, 2]), np.array([5, 5, 5]))
GRADS = torch.tensor([[1.0], [2.0], [math.nan]])


def selection(total=None):
    return Selection(Weighting(KEYS, np.ones(3), total))


def test_rule_normalised_weights_renormalise_over_the_finite_rows():
    update = WeightedUpdate(lr=1.0)
    d = update.direction(GRADS.clone(), KEYS, selection())
    assert d.tolist() == [1.5]  # mean of 1 and 2, as if worker 2 never arrived
    assert update.dropped.tolist() == [KEYS[2]]


def test_a_fixed_divisor_stays():
    d = WeightedUpdate(lr=1.0).direction(GRADS.clone(), KEYS, selection(total=3.0))
    assert d.tolist() == [1.0]  # (1 + 2) / 3


def test_raise_names_the_worker():
    update = WeightedUpdate(lr=1.0, on_nonfinite="raise")
    with pytest.raises(NonFiniteGradient, match="worker 2"):
        update.direction(GRADS.clone(), KEYS, selection())


def test_injection_poisons_only_the_named_weighed_worker():
    update = WeightedUpdate(lr=1.0)
    update.inject = (np.array([0]), np.array([math.inf]))
    grads = torch.tensor([[1.0], [2.0], [4.0]])
    d = update.direction(grads, KEYS, selection())
    assert d.tolist() == [3.0] and update.dropped.tolist() == [KEYS[0]]
    assert update.inject is None  # consumed


def test_gradient_stats_leave_out_non_finite_rows():
    stats = gradient_stats(torch.tensor([1.0, 3.0, math.nan]), GRADS)
    assert (stats.loss, stats.grad_sq_sum, stats.mean_grad_sq) == (2.0, 5.0, 2.25)
