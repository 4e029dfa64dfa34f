"""The GELU-recompute MLP equals timm's Mlp in outputs and gradients and saves fewer bytes."""

from __future__ import annotations

import torch
from timm.layers import Mlp as TimmMlp

from avion_ds.memory.activations import measure_activation_bytes
from avion_ds.models.mlp import Mlp


def _pair(dim: int = 24, hidden: int = 96) -> tuple[Mlp, TimmMlp]:
    torch.manual_seed(0)
    ours = Mlp(dim, hidden)
    ref = TimmMlp(dim, hidden, act_layer=torch.nn.GELU)
    ref.load_state_dict(ours.state_dict())
    return ours, ref


def test_matches_timm_mlp_outputs_and_grads() -> None:
    ours, ref = _pair()
    x = torch.randn(3, 7, 24, dtype=torch.float64, requires_grad=True)
    ours, ref = ours.double(), ref.double()
    x2 = x.detach().clone().requires_grad_(True)
    y1, y2 = ours(x), ref(x2)
    torch.testing.assert_close(y1, y2, rtol=0, atol=1e-12)
    g = torch.randn_like(y1)
    y1.backward(g)
    y2.backward(g)
    torch.testing.assert_close(x.grad, x2.grad, rtol=0, atol=1e-12)
    for (n, p1), p2 in zip(ours.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p1.grad, p2.grad, rtol=0, atol=1e-12, msg=n)


def test_gradcheck() -> None:
    ours, _ = _pair(6, 10)
    ours = ours.double()
    x = torch.randn(2, 3, 6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: ours(t), (x,))


def test_autocast_bf16_backward_runs() -> None:
    ours, ref = _pair()
    x = torch.randn(2, 5, 24, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = ours(x)
    y.float().sum().backward()
    assert ours.fc2.weight.grad.dtype == torch.float32 and x.grad is not None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y_ref = ref(x.detach())
    torch.testing.assert_close(y.float(), y_ref.float(), rtol=2e-2, atol=2e-2)


def test_saves_one_hidden_activation_fewer() -> None:
    ours, ref = _pair(dim=32, hidden=128)
    x = torch.randn(4, 10, 32)
    b_ours = measure_activation_bytes(ours, x)
    b_ref = measure_activation_bytes(ref, x)
    tokens = 4 * 10
    assert b_ref - b_ours == tokens * 128 * 4  # exactly one (tokens x hidden) fp32 tensor fewer


def test_quick_gelu_matches_reference_formula_and_saves_as_gelu() -> None:
    """OpenAI CLIP's QuickGELU, x * sigmoid(1.702 x), written out here as the reference."""
    torch.manual_seed(0)
    ours = Mlp(6, 10, act="quick_gelu").double()
    x = torch.randn(2, 3, 6, dtype=torch.float64, requires_grad=True)
    h = ours.fc1(x)
    ref = torch.nn.functional.linear(h * torch.sigmoid(1.702 * h), ours.fc2.weight, ours.fc2.bias)
    torch.testing.assert_close(ours(x), ref, rtol=0, atol=1e-12)
    assert torch.autograd.gradcheck(lambda t: ours(t), (x,))
    gelu, quick = Mlp(32, 128), Mlp(32, 128, act="quick_gelu")
    inp = torch.randn(4, 10, 32)
    assert measure_activation_bytes(quick, inp) == measure_activation_bytes(gelu, inp)
