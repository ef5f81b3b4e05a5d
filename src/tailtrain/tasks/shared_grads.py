"""Per-worker gradients at one shared θ from ONE ordinary forward and backward pass.

Each simulated worker i needs the gradient of its mean mini-batch loss (LGC Eq. (2):
g_i = (1/B) Σ_{ξ ∈ ξ_i} ∇ℓ(θ; ξ)), all at the same θ. For a layer z = W a + b the
chain rule gives ∂ℓ/∂W = δ aᵀ and ∂ℓ/∂b = δ with δ = ∂ℓ/∂z, so the gradient of a sum
of losses is a sum of outer products over its samples (the per-example gradient
identity of Goodfellow, "Efficient per-example gradient computations", 2015). We run the
W·B samples through the network once, record every parametrised layer's input a and,
with one ``torch.autograd.grad`` call, its output gradient δ, and then contract a and δ
over each worker's own samples: a ``bmm`` per Linear layer and, after an im2col of the
input, a ``bmm`` per Conv2d layer (the conv weight gradient is Σ over samples and output
positions of δ ⊗ patch). Biases sum δ. The loss is the sum of the workers' MEAN losses,
so every δ already carries the 1/B of LGC Eq. (2); the L2 term adds l2·θ.

Only the layer types of the built-in models are handled (Linear; Conv2d with groups=1,
zero and numeric padding; ReLU, MaxPool2d, Flatten in between): :func:`supports` says
whether a model qualifies, and :class:`Task` falls back to ``torch.func.vmap`` otherwise.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from tailtrain.tasks.flat import FlatLayout

PerSample = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
#: parameter-free layers that map each sample on its own (so the pass stays per-sample)
_FREE = (nn.ReLU, nn.MaxPool2d, nn.Flatten)


def supports(model: nn.Module | None) -> bool:
    """True when ``model`` is an ``nn.Sequential`` of layers :class:`SharedGrads` handles."""
    return isinstance(model, nn.Sequential) and all(_layer_ok(m) for m in model)


def _layer_ok(layer: nn.Module) -> bool:
    kind = type(layer)  # exact types: a subclass may override forward
    if kind is nn.Conv2d:
        numeric = not isinstance(layer.padding, str)
        return layer.groups == 1 and layer.padding_mode == "zeros" and numeric
    if kind is nn.ReLU:
        return not layer.inplace  # an in-place ReLU would overwrite the recorded z
    return kind is nn.Linear or kind in _FREE


# Hand-written: vmap's grouped-conv weight backward is several times slower on CPU.
class SharedGrads:
    """``(theta (D,), x (W, B, ...), y (W, B)) -> (grads (W, D), losses (W,))``: the
    contract of ``vmap(grad_and_value(loss), in_dims=(None, 0, 0))``, where ``loss`` is
    ``per_sample(model(x), y).mean() + (l2/2)·‖θ‖²``."""

    def __init__(
        self, model: nn.Sequential, layout: FlatLayout, per_sample: PerSample, l2: float
    ) -> None:
        if not supports(model):
            raise ValueError("SharedGrads needs a Sequential of Linear/Conv2d/ReLU/MaxPool2d")
        self.layers = list(model)
        self.layout = layout
        self.per_sample = per_sample
        self.l2 = l2
        ends = itertools.accumulate(layout.sizes)
        pairs = zip(layout.names, layout.sizes, ends, strict=True)
        self._slices = {n: slice(e - s, e) for n, s, e in pairs}

    def __call__(
        self, theta: torch.Tensor, x: torch.Tensor, y: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        workers, batch = y.shape[:2]
        with torch.enable_grad():  # like torch.func.grad, work under an outer no_grad too
            params = self.layout.unflatten(theta.detach().requires_grad_())
            out, inputs, outputs = self._forward(params, x.flatten(0, 1))
            losses = self.per_sample(out, y.flatten(0, 1)).view(workers, batch).mean(1)
            deltas = torch.autograd.grad(losses.sum(), outputs)
        grads = torch.empty(workers, self.layout.dim, dtype=theta.dtype, device=theta.device)
        for i, a, d in zip(self._param_layers(), inputs, deltas, strict=True):
            self._store(grads, i, *self._layer_grads(self.layers[i], a.detach(), d, workers))
        losses = losses.detach()
        if self.l2:
            grads.add_(theta.detach(), alpha=self.l2)
            losses = losses + 0.5 * self.l2 * theta.detach().dot(theta.detach())
        return grads, losses

    def _param_layers(self) -> list[int]:
        return [i for i, m in enumerate(self.layers) if isinstance(m, (nn.Linear, nn.Conv2d))]

    def _forward(
        self, params: dict[str, torch.Tensor], x: torch.Tensor
    ) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
        """Network output, and each parametrised layer's input a and output z."""
        inputs, outputs = [], []
        for i, layer in enumerate(self.layers):
            if isinstance(layer, (nn.Linear, nn.Conv2d)):
                inputs.append(x)
                weight, bias = params[f"{i}.weight"], params.get(f"{i}.bias")
                if isinstance(layer, nn.Linear):
                    x = F.linear(x, weight, bias)
                else:
                    x = F.conv2d(x, weight, bias, layer.stride, layer.padding, layer.dilation)
                outputs.append(x)
            else:
                x = layer(x)
        return x, inputs, outputs

    def _layer_grads(
        self, layer: nn.Module, a: torch.Tensor, d: torch.Tensor, workers: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-worker weight and bias gradients, (W, *weight.shape) and (W, out)."""
        if isinstance(layer, nn.Linear):
            a = a.reshape(workers, -1, a.shape[-1])
            d = d.reshape(workers, -1, d.shape[-1])
            return torch.bmm(d.transpose(1, 2), a), d.sum(1)
        return conv_weight_grads(layer, a, d, workers), d.unflatten(0, (workers, -1)).sum((1, 3, 4))

    def _store(self, grads: torch.Tensor, i: int, weight: torch.Tensor, bias: torch.Tensor) -> None:
        grads[:, self._slices[f"{i}.weight"]] = weight.reshape(len(grads), -1)
        if f"{i}.bias" in self._slices:
            grads[:, self._slices[f"{i}.bias"]] = bias


def conv_weight_grads(
    layer: nn.Conv2d, a: torch.Tensor, d: torch.Tensor, workers: int
) -> torch.Tensor:
    """Σ over each worker's samples and output positions of δ ⊗ input patch: (W, O, C, kh, kw).

    ``a`` is the layer input (N, C, H, W) and ``d`` = ∂ℓ/∂z (N, O, Ho, Wo), N = workers·B.
    The im2col copy keeps the longer contiguous run innermost (channels when C ≥ Wo, image
    rows otherwise): on CPU that copy, not the matmul, dominates the cost.
    """
    ph, pw = layer.padding
    if ph or pw:
        a = F.pad(a, (pw, pw, ph, ph))
    n, out_ch, ho, wo = d.shape
    delta = d.reshape(workers, n // workers, out_ch, ho * wo).transpose(1, 2)
    delta = delta.reshape(workers, out_ch, -1)  # (W, O, B·L), L = Ho·Wo
    if a.shape[1] >= wo:
        cols = _patches_channels_last(layer, a, (ho, wo), workers)
        kh, kw = layer.kernel_size
        grad = torch.bmm(delta, cols).view(workers, out_ch, kh, kw, -1)
        return grad.permute(0, 1, 4, 2, 3)
    cols = _patches_rows(layer, a, (ho, wo), workers)
    return torch.bmm(delta, cols.transpose(1, 2)).view(workers, out_ch, -1, *layer.kernel_size)


def _patches_channels_last(
    layer: nn.Conv2d, a: torch.Tensor, out_hw: tuple[int, int], workers: int
) -> torch.Tensor:
    """im2col as (W, B·L, kh·kw·C), channels innermost."""
    a = a.permute(0, 2, 3, 1).contiguous()  # (N, H, W, C)
    sn, sh, sw, sc = a.stride()
    (kh, kw), (st_h, st_w), (dl_h, dl_w) = layer.kernel_size, layer.stride, layer.dilation
    shape = (a.shape[0], *out_hw, kh, kw, a.shape[3])
    patches = a.as_strided(shape, (sn, st_h * sh, st_w * sw, dl_h * sh, dl_w * sw, sc))
    return patches.reshape(workers, -1, math.prod(shape[3:]))


def _patches_rows(
    layer: nn.Conv2d, a: torch.Tensor, out_hw: tuple[int, int], workers: int
) -> torch.Tensor:
    """im2col as (W, C·kh·kw, B·L), output rows innermost."""
    a = a.contiguous()
    sn, sc, sh, sw = a.stride()
    (kh, kw), (st_h, st_w), (dl_h, dl_w) = layer.kernel_size, layer.stride, layer.dilation
    batch = a.shape[0] // workers
    shape = (workers, a.shape[1], kh, kw, batch, *out_hw)
    strides = (batch * sn, sc, dl_h * sh, dl_w * sw, sn, st_h * sh, st_w * sw)
    return a.as_strided(shape, strides).reshape(workers, math.prod(shape[1:4]), -1)
