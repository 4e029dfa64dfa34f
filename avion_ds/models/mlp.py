"""Transformer MLP that keeps one activation fewer: GELU's output is recomputed, not saved.

A plain ``fc1 -> GELU -> fc2`` saves three tensors per token for backward: fc1's input (D),
GELU's input (F) and fc2's input = GELU's output (F). GELU is elementwise and cheap, so
``GeluLinear`` (fc2 with the activation folded in) saves only GELU's input and recomputes its
output in backward: the block keeps D + F instead of D + 2F values per token (the saving is
measured in BENCHMARKS.md, bench/memory.py) for one extra elementwise pass. Outputs and
gradients are the same computation as timm's ``Mlp``. Parameter names stay ``fc1.*`` / ``fc2.*``
and fc2 is a real ``nn.Linear`` whose ``forward`` runs, so checkpoints load by name and ZeRO-3
gathers its weights through its usual module hooks.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class _GeluLinearFn(torch.autograd.Function):
    """y = gelu(h) @ W^T + b, saving h (not gelu(h)) for backward."""

    @staticmethod
    def forward(ctx, h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:  # type: ignore[override]
        ctx.save_for_backward(h, weight)
        ctx.has_bias = bias is not None
        return F.linear(F.gelu(h), weight, bias)

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):  # type: ignore[override]
        h, weight = ctx.saved_tensors
        grad_h = grad_w = grad_b = None
        g2d = grad_out.reshape(-1, grad_out.shape[-1])
        if ctx.needs_input_grad[1]:
            a = F.gelu(h)  # the recompute that replaces saving gelu(h)
            grad_w = g2d.t().mm(a.reshape(-1, a.shape[-1]))
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_b = g2d.sum(0)
        if ctx.needs_input_grad[0]:
            grad_a = grad_out.matmul(weight.to(grad_out.dtype))
            grad_h = torch.ops.aten.gelu_backward(grad_a, h)
        return grad_h, grad_w, grad_b


class GeluLinear(nn.Linear):
    """``nn.Linear`` applied to ``gelu(input)``, with the GELU output recomputed in backward."""

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        if not torch.is_grad_enabled() or not (h.requires_grad or self.weight.requires_grad):
            return F.linear(F.gelu(h), self.weight, self.bias)
        return _GeluLinearFn.apply(h, self.weight, self.bias)


class Mlp(nn.Module):
    """fc1 -> GELU -> fc2 with GELU folded into fc2 (see module docstring)."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = GeluLinear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.fc1(x))
