"""Allreduce rounds' data and gradients: the draws kept for later rounds, one rank's G_n."""

from __future__ import annotations

import numpy as np
import torch

from tailtrain.sim.allreduce.learner import RoundLearner
from tailtrain.tasks import parse_partition, parse_task
from tailtrain.tasks.stream import Draws, job_batches
from tailtrain.topology.allreduce import worker_grad, worker_grads


def test_draws_kept_for_later_rounds_equal_each_rounds_own_draw():
    task = parse_task("logreg")
    state = parse_partition("iid").assign(task, 3, np.random.default_rng(0))
    draws = Draws(state, 7, 16, 3)
    draws.ROUNDS = 4  # cross chunk boundaries within a few rounds
    # in order, across a boundary, a jump back, a change of units and back
    for index, units in [(0, 1), (1, 1), (3, 1), (4, 1), (9, 1), (2, 1), (2, 3), (5, 3), (6, 1)]:
        alone = job_batches(state, 7, 16, np.arange(3), np.full(3, index), units)
        assert np.array_equal(draws.round(index, units), alone), (index, units)


def test_a_learners_batches_put_requeued_units_first():
    task = parse_task("logreg")
    state = parse_partition("iid").assign(task, 2, np.random.default_rng(0))
    learner = RoundLearner(task, state, 0.1, 3, 2)
    first = learner.batches(0, 2).copy()
    learner.requeue(first, np.array([1, 2]))  # worker 0 dropped its second unit
    second = learner.batches(1, 2)
    fresh = job_batches(state, 3, task.batch_size, np.arange(2), np.full(2, 1), 2)
    assert np.array_equal(second[0], np.stack([first[0, 1], fresh[0, 0]]))
    assert np.array_equal(second[1], fresh[1])


def test_one_ranks_gradient_is_its_row_of_worker_grads():
    total = torch.randn(3, 5)
    done = np.array([3, 1, 0])
    for local_steps in (1, 2):
        rows = worker_grads(total, done, local_steps)
        for n in range(3):
            assert torch.equal(worker_grad(total[n], int(done[n]), local_steps), rows[n])
    one = torch.randn(5)
    assert worker_grad(one, 1, 1) is one  # nothing to scale: the sum itself
