"""One rank's gradient: plain autograd on the task's ``nn.Module``, as DDP computes it."""

from __future__ import annotations

import numpy as np
import torch


class ModuleGrads:
    """One rank's mini-batch loss and flat gradient by plain autograd on an ``nn.Module``, as
    DDP computes them. The task's batched ``torch.func`` gradients serve many simulated
    workers at once; for one worker they cost a rank 10-20% more (bench_runtime.py)."""

    def __init__(self, task) -> None:
        self.task = task
        self.module = task.module_at(task.init_params(0))
        self.params = list(self.module.parameters())
        # the parameters become views of one flat tensor, so that loading theta is one copy_
        # instead of vector_to_parameters' Python work per parameter (checks, view, re-point)
        self.flat = torch.nn.utils.parameters_to_vector(self.params).detach().clone()
        offset = 0
        for param in self.params:
            param.data = self.flat[offset : offset + param.numel()].view_as(param)
            offset += param.numel()

    def __call__(
        self, theta: torch.Tensor, indices: np.ndarray, out: torch.Tensor | None = None
    ) -> tuple[float, torch.Tensor]:
        """Mean loss and gradient at ``theta`` over the samples ``indices`` (B,); the gradient
        is written into ``out`` when given (the round's reduce buffer: no copy later)."""
        task, data = self.task, self.task.data
        self.flat.copy_(theta)
        index = torch.as_tensor(indices)
        with torch.enable_grad():
            logits = self.module(data.trim(data.x_train[index]))
            loss = task._per_sample(logits, data.y_train[index]).mean()
            grads = torch.autograd.grad(loss, self.params)
        grad, loss = torch.cat([g.reshape(-1) for g in grads], out=out), loss.detach()
        if task.l2:  # (l2/2) ||theta||^2, as Task's loss adds it
            return float(loss) + float(task._penalty(theta)), grad + task.l2 * theta
        return float(loss), grad
