"""One rank's gradient by plain autograd equals the task's own, into a buffer or not."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tailtrain.runtime.grads import ModuleGrads
from tailtrain.tasks import parse_task


@pytest.mark.parametrize("text", ["logreg", "digits-cnn:batch=8"])
def test_a_ranks_gradient_is_the_tasks_and_lands_in_the_buffer_given(text):
    task = parse_task(text)
    theta = torch.as_tensor(task.init_params(3))
    batch = np.arange(8)
    losses, grads = task.grads(theta, batch[None, :])
    grad_of = ModuleGrads(task)
    loss, grad = grad_of(theta, batch)
    assert loss == pytest.approx(float(losses[0]), rel=1e-5)
    torch.testing.assert_close(grad, grads[0], rtol=1e-4, atol=1e-6)
    out = torch.full_like(theta, float("nan"))
    loss_out, into = grad_of(theta, batch, out)
    if not task.l2:  # with an l2 term the penalty's gradient makes a new tensor
        assert into is out
    torch.testing.assert_close(into, grad)
    assert loss_out == loss
