"""One flat float32 vector θ ∈ R^D for all of a module's parameters, and back."""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class FlatLayout:
    """Names and shapes of a module's parameters, in ``named_parameters`` order."""

    names: tuple[str, ...]
    shapes: tuple[torch.Size, ...]

    @classmethod
    def of(cls, module: nn.Module) -> FlatLayout:
        pairs = list(module.named_parameters())
        return cls(tuple(n for n, _ in pairs), tuple(p.shape for _, p in pairs))

    @property
    def sizes(self) -> tuple[int, ...]:
        return tuple(math.prod(s) for s in self.shapes)

    @property
    def dim(self) -> int:
        return sum(self.sizes)

    def unflatten(self, theta: torch.Tensor) -> dict[str, torch.Tensor]:
        """Views of θ shaped like the parameters (works inside ``vmap``)."""
        parts = torch.split(theta, self.sizes)
        return {n: p.view(s) for n, p, s in zip(self.names, parts, self.shapes, strict=True)}

    def init(self, seed: int) -> torch.Tensor:
        """θ drawn like PyTorch's default Linear/Conv init, U(±1/√fan_in) for weights and
        biases alike, from an explicit generator instead of the global one."""
        fan_in = 1
        bounds = []
        for shape in self.shapes:
            if len(shape) >= 2:  # a weight: its fan-in also bounds the bias that follows
                fan_in = math.prod(shape[1:])
            bounds.append(1.0 / math.sqrt(fan_in))
        bound = torch.repeat_interleave(torch.tensor(bounds), torch.tensor(self.sizes))
        gen = torch.Generator().manual_seed(seed)
        u = torch.rand(self.dim, generator=gen, dtype=torch.float32)
        return ((2 * u - 1) * bound).to(torch.float32)

    def module_at(self, meta_module: nn.Module, theta: torch.Tensor) -> nn.Module:
        """A real module (CPU, or θ's device) whose parameters are a copy of θ; a real
        module (a factory's task) keeps its buffers, which a meta one does not have."""
        module = copy.deepcopy(meta_module)
        if any(p.is_meta for p in module.parameters()):
            module = module.to_empty(device=theta.device)
        else:
            module = module.to(theta.device)
        torch.nn.utils.vector_to_parameters(theta.detach().clone(), module.parameters())
        return module
