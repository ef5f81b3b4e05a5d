"""The shared update path drops a non-finite gradient as if it had not arrived."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tailtrain.core.update import (
    NonFiniteGradient,
    WeightedUpdate,
    finite_rows,
    gradient_stats,
    isin,
    screen_own,
)
from tailtrain.strategies.base import Selection, Weighting, arrival_keys

KEYS = arrival_keys(np.array([0, 1, 2]), np.array([5, 5, 5]))
GRADS = torch.tensor([[1.0], [2.0], [math.nan]])


def selection(total=None):
    return Selection(Weighting(KEYS, np.ones(3), total))


def test_rule_normalised_weights_renormalise_over_the_finite_rows():
    update = WeightedUpdate(lr=1.0)
    d = update.direction(GRADS.clone(), KEYS, selection())
    assert d.tolist() == [1.5]  # mean of 1 and 2, as if worker 2 never arrived
    assert update.dropped.tolist() == [KEYS[2]]


def test_the_screened_keys_are_taken_once():
    # the parameter server's step that applies nothing must not report the last step's NaN
    update = WeightedUpdate(lr=1.0)
    update.direction(GRADS.clone(), KEYS, selection())
    assert update.take_dropped().tolist() == [KEYS[2]]
    assert update.take_dropped().size == 0


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


def test_a_row_whose_sum_overflows_is_still_finite():
    big = torch.full((2, 4), 3e38)  # every value finite, each row's sum is inf in float32
    big[1, 2] = math.nan
    assert finite_rows(big).tolist() == [True, False]
    row = torch.tensor([[1.0, -math.inf, math.inf, 0.0]])  # inf - inf: a NaN sum, not finite
    assert finite_rows(row).tolist() == [False]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(0, 6), max_size=90),
    st.lists(st.integers(0, 6), max_size=90),
)
@example(list(range(7)) * 10, [1, 3] * 35)  # 70 x 70 > SMALL_ISIN: np.isin's branch
def test_isin_is_numpys_for_small_and_large_key_sets(values, among):
    values, among = np.array(values, dtype=np.int64), np.array(among, dtype=np.int64)
    assert isin(values, among).tolist() == [v in set(among.tolist()) for v in values.tolist()]


def test_the_statistics_of_one_gradient_are_its_squared_norm():
    g = torch.tensor([[3.0, 4.0]])
    stats = gradient_stats(torch.tensor([0.5]), g)
    assert (stats.loss, stats.grad_sq_sum, stats.mean_grad_sq) == (0.5, 25.0, 25.0)


@pytest.mark.parametrize(
    ("values", "screened"),
    [
        ([1.0, -2.0], False),
        ([3e38, 3e38], False),  # finite, though its sum of squares overflows float32
        ([1.0, math.nan], True),
        ([math.inf, 1.0], True),
        ([-math.inf, math.inf], True),
    ],
)
def test_screen_own_passes_every_finite_gradient_and_only_those(values, screened):
    grad = torch.tensor(values, dtype=torch.float32)
    out, loss, bad, sq_norm = screen_own(grad, 0.5, "skip", 3, 7)
    assert bad is screened
    if screened:
        assert not out.any() and math.isnan(loss) and sq_norm == 0.0
    else:
        assert out is grad and loss == 0.5 and sq_norm == float(grad @ grad)


def test_screen_own_raise_names_the_worker_and_step():
    with pytest.raises(NonFiniteGradient, match="3"):
        screen_own(torch.tensor([math.nan]), 0.5, "raise", 3, 7)


def test_the_weighted_sum_screens_in_one_pass_and_equals_the_plain_product():
    # every row weighed now and finite: d_t is now @ grads bit for bit, every row finite
    grads = torch.randn(3, 50)
    update = WeightedUpdate(lr=1.0)
    d = update.direction(grads, KEYS, selection())
    now = torch.tensor(selection().now.over(KEYS), dtype=torch.float32)
    assert torch.equal(d, now @ grads)
    assert update.finite.tolist() == [True] * 3 and update.dropped.size == 0


def test_a_non_finite_row_with_zero_weight_is_still_dropped():
    # a zero weight hides the row from the weighted sum: screened row by row instead
    update = WeightedUpdate(lr=1.0)
    weights = Selection(Weighting(KEYS, np.array([1.0, 1.0, 0.0])))
    d = update.direction(GRADS.clone(), KEYS, weights)
    assert d.tolist() == [1.5] and update.dropped.tolist() == [KEYS[2]]
    assert update.finite.tolist() == [True, True, False]


def test_a_weighted_sum_that_overflows_is_not_taken_for_a_non_finite_gradient():
    grads = torch.full((3, 2), 3e38)  # finite rows whose sum overflows float32
    update = WeightedUpdate(lr=1.0)
    d = update.direction(grads, KEYS, selection(total=1.0))
    assert update.dropped.size == 0 and update.finite.all() and torch.isinf(d).all()


def test_gradient_stats_without_moments_give_the_loss_only():
    stats = gradient_stats(torch.tensor([1.0, 3.0]), torch.ones(2, 4), moments=False)
    assert stats.loss == 2.0
    assert math.isnan(stats.grad_sq_sum) and math.isnan(stats.mean_grad_sq)
