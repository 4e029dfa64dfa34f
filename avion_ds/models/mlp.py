"""Transformer MLP that keeps one activation fewer: GELU's output is recomputed, not saved.

A plain ``fc1 -> GELU -> fc2`` saves three tensors per token for backward: fc1's input (D),
GELU's input (F) and fc2's input = GELU's output (F). GELU is elementwise and cheap, so
``GeluLinear`` (fc2 with the activation folded in) saves only GELU's input and recomputes its
output in backward: the block keeps D + F instead of D + 2F values per token (the saving is
measured in BENCHMARKS.md, bench/memory.py) for one extra elementwise pass. Outputs and
gradients are the same computation as timm's ``Mlp``. Parameter names stay ``fc1.*`` / ``fc2.*``
and fc2 is a real ``nn.Linear`` whose ``forward`` runs, so checkpoints load by name and ZeRO-3
gathers its weights through its usual module hooks.

The activation is ``gelu`` (exact erf GELU: VideoMAE, AVION's own towers) or ``quick_gelu``
(``x * sigmoid(1.702 x)``: what OpenAI / OpenCLIP weights were trained with); both are recomputed
the same way, so the saved-tensor count (and the memory planner's formula) does not depend on it.

Inside an activation-checkpointed block the fold is switched off (``GeluLinear.fold = False``, set by
``models/activation_checkpointing.py``): the checkpoint already re-runs the whole block in backward,
and folding would run the activation a third time for no memory saved.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

ACTIVATIONS = ("gelu", "quick_gelu")
_QUICK = 1.702


def activate(h: torch.Tensor, act: str) -> torch.Tensor:
    """``gelu`` (erf) or ``quick_gelu`` (``h * sigmoid(1.702 h)``) of ``h``."""
    if act == "gelu":
        return F.gelu(h)
    return h * torch.sigmoid(_QUICK * h)


def activation_backward(grad: torch.Tensor, h: torch.Tensor, act: str) -> torch.Tensor:
    """d act(h) / dh times ``grad``, from the activation's input alone."""
    if act == "gelu":
        return torch.ops.aten.gelu_backward(grad, h)
    s = torch.sigmoid(_QUICK * h)
    return grad * (s + _QUICK * h * s * (1 - s))


class _GeluLinearFn(torch.autograd.Function):
    """y = act(h) @ W^T + b, saving h (not act(h)) for backward."""

    @staticmethod
    def forward(ctx, h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, act: str) -> torch.Tensor:  # type: ignore[override]
        ctx.save_for_backward(h, weight)
        ctx.has_bias = bias is not None
        ctx.act = act
        return F.linear(activate(h, act), weight, bias)

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):  # type: ignore[override]
        h, weight = ctx.saved_tensors
        grad_h = grad_w = grad_b = None
        g2d = grad_out.reshape(-1, grad_out.shape[-1])
        if ctx.needs_input_grad[1]:
            a = activate(h, ctx.act)  # the recompute that replaces saving act(h)
            grad_w = g2d.t().mm(a.reshape(-1, a.shape[-1]))
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_b = g2d.sum(0)
        if ctx.needs_input_grad[0]:
            grad_a = grad_out.matmul(weight.to(grad_out.dtype))
            grad_h = activation_backward(grad_a, h, ctx.act)
        return grad_h, grad_w, grad_b, None


class GeluLinear(nn.Linear):
    """``nn.Linear`` applied to ``act(input)``, with the activation output recomputed in backward."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, act: str = "gelu") -> None:
        if act not in ACTIVATIONS:
            raise ValueError(f"mlp activation: expected one of {', '.join(ACTIVATIONS)}, got {act!r}")
        super().__init__(in_features, out_features, bias)
        self.act = act
        self.fold = True  # False: plain act -> linear (a checkpointed block recomputes act already)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        if not self.fold or not torch.is_grad_enabled() or not (h.requires_grad or self.weight.requires_grad):
            return F.linear(activate(h, self.act), self.weight, self.bias)
        return _GeluLinearFn.apply(h, self.weight, self.bias, self.act)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, act={self.act}"


class Mlp(nn.Module):
    """fc1 -> activation -> fc2 with the activation folded into fc2 (see module docstring)."""

    def __init__(self, dim: int, hidden: int, act: str = "gelu") -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = GeluLinear(hidden, dim, act=act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.fc1(x))
