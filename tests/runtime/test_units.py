"""A rank's units on the wall clock: tau between units, injected sleeps, Local-SGD's steps.

The injected seconds (40 ms a unit) dominate logreg's compute, and every partial sum lies
20 ms or more from tau = 60 ms, so a loaded machine does not change the count."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from tailtrain.runtime.grads import ModuleGrads
from tailtrain.runtime.units import compute, may_start
from tailtrain.strategies.base import AllreducePlan
from tailtrain.tasks import parse_task

UNIT, TAU = 0.04, 0.06


@pytest.fixture(scope="module")
def task():
    return parse_task("logreg", seed=0)


def units(task, plan: AllreducePlan, count: int = 3):
    """``count`` units of logreg from its initial model: the work, the model and the batches."""
    theta = torch.as_tensor(task.init_params(0))
    batches = np.random.default_rng(0).integers(0, 100, (count, task.batch_size))
    work = compute(ModuleGrads(task), theta, plan, batches, np.full(count, UNIT), 1, 0.1)
    return work, theta, batches


def test_between_units_a_unit_starts_iff_the_round_is_within_tau():
    assert may_start(0.06, 0.06, preempt=False) and not may_start(0.06, 0.06, preempt=True)
    assert may_start(0.05, 0.06, preempt=True) and not may_start(0.07, 0.06, preempt=False)


@pytest.mark.timeout(60)
def test_stop_between_starts_a_unit_up_to_tau_and_counts_it(task):
    """Units start at 0 and ~40 ms (<= tau); the third would start at ~80 ms."""
    work, _, _ = units(task, AllreducePlan(k=1, threshold=TAU, preempt=False))
    assert work.done == 2 and math.isnan(work.times[2]) and work.injected == pytest.approx(0.08)
    assert work.compute >= 0.08 and work.loss_sum > 0


@pytest.mark.timeout(60)
def test_preempting_counts_a_unit_only_if_it_ends_before_tau(task):
    """The second unit would end at ~80 ms: it sleeps only up to tau and does not count, so
    G_n is the first unit's gradient alone."""
    work, theta, batches = units(task, AllreducePlan(k=1, threshold=TAU, preempt=True))
    assert work.done == 1 and UNIT <= work.injected <= TAU  # the second sleep cut at tau
    _, first = ModuleGrads(task)(theta, batches[0])
    torch.testing.assert_close(work.grad, first)


@pytest.mark.timeout(60)
def test_without_tau_every_unit_counts_and_the_gradient_is_their_mean(task):
    work, theta, batches = units(task, AllreducePlan(k=1))
    mean = sum(ModuleGrads(task)(theta, b)[1] for b in batches) / 3
    assert work.done == 3 and not any(math.isnan(t) for t in work.times)
    torch.testing.assert_close(work.grad, mean)
