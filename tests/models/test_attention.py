"""Attention backends: eager == sdpa (values and gradients), backend resolution rules."""

from __future__ import annotations

import logging

import pytest
import torch

from avion_ds.models import attention as attn_mod
from avion_ds.models import create_model
from avion_ds.models.attention import (
    Attention,
    attention,
    flash_available,
    resolve_backend,
)


def _pair(**kw):
    torch.manual_seed(0)
    a = create_model("vit_test_tiny", attn_backend="eager", **kw)
    b = create_model("vit_test_tiny", attn_backend="sdpa", **kw)
    b.load_state_dict(a.state_dict())
    return a, b


@pytest.mark.parametrize("pool", ["mean", "cls"])
def test_eager_and_sdpa_match_values_and_input_grads(pool):
    a, b = _pair(pool=pool, head_init_scale=1.0)
    x = torch.randn(2, 3, 4, 32, 32)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    ya, yb = a(xa), b(xb)
    torch.testing.assert_close(ya, yb, atol=1e-5, rtol=1e-5)
    (ya**2).sum().backward()
    (yb**2).sum().backward()
    torch.testing.assert_close(xa.grad, xb.grad, atol=1e-5, rtol=1e-5)
    for (n, pa), pb in zip(a.named_parameters(), b.parameters()):
        torch.testing.assert_close(pa.grad, pb.grad, atol=1e-5, rtol=1e-4, msg=n)


def test_eager_matches_softmax_reference():
    torch.manual_seed(0)
    qkv = torch.randn(2, 5, 3, 2, 8)
    q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))
    ref = (torch.softmax(q @ k.transpose(-2, -1) / 8**0.5, -1) @ v).transpose(1, 2).reshape(2, 5, 16)
    torch.testing.assert_close(attention(qkv, "eager"), ref)
    torch.testing.assert_close(attention(qkv, "sdpa"), ref, atol=1e-6, rtol=1e-5)


def test_causal_matches_masked_softmax_reference():
    """Token i attends to 0..i: the upper triangle of the logits is -inf before the softmax."""
    torch.manual_seed(0)
    qkv = torch.randn(2, 6, 3, 2, 8)
    q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))
    logits = q @ k.transpose(-2, -1) / 8**0.5
    logits = logits + torch.full((6, 6), float("-inf")).triu(1)
    ref = (torch.softmax(logits, -1) @ v).transpose(1, 2).reshape(2, 6, 16)
    torch.testing.assert_close(attention(qkv, "eager", causal=True), ref)
    torch.testing.assert_close(attention(qkv, "sdpa", causal=True), ref, atol=1e-6, rtol=1e-5)
    assert not torch.allclose(attention(qkv, "sdpa"), ref, atol=1e-3)


def test_fused_qkv_bias_with_k_bias():
    m = Attention(16, 2, qkv_bias=True, k_bias=True)
    assert {n for n, _ in m.named_parameters()} == {"qkv.weight", "qkv.bias", "proj.weight", "proj.bias"}


def test_qkv_bias_has_no_k_bias():
    m = Attention(16, 2, qkv_bias=True)
    names = {n for n, _ in m.named_parameters()}
    assert names == {"qkv.weight", "q_bias", "v_bias", "proj.weight", "proj.bias"}
    assert {n for n, _ in Attention(16, 2, qkv_bias=False).named_parameters()} == {
        "qkv.weight",
        "proj.weight",
        "proj.bias",
    }


def test_auto_resolves_to_sdpa_on_cpu_and_logs_once(caplog):
    attn_mod.resolve_cached.cache_clear()
    with caplog.at_level(logging.INFO, logger="avion_ds.models.attention"):
        assert resolve_backend("auto", "cpu", torch.float32, 32) == "sdpa"
        assert resolve_backend("auto", "cpu", torch.float32, 32) == "sdpa"
    msgs = [r.getMessage() for r in caplog.records if "auto -> sdpa" in r.getMessage()]
    assert len(msgs) == 1


def test_explicit_backends_pass_through():
    assert resolve_backend("eager", "cpu", torch.float32, 64) == "eager"
    assert resolve_backend("sdpa", "cpu", torch.bfloat16, 64) == "sdpa"


def test_flash_where_impossible_is_a_clear_error():
    if not flash_available():
        with pytest.raises(RuntimeError, match="flash-attn is not installed"):
            create_model("vit_test_tiny", attn_backend="flash")
    with pytest.raises(RuntimeError, match="attn_backend='flash' cannot run"):
        resolve_backend("flash", "cpu", torch.float32, 64)


def test_unknown_backend_rejected():
    with pytest.raises(ValueError, match="attn_backend"):
        resolve_backend("xformers", "cpu", torch.float32, 64)


def test_bf16_cpu_forward_runs_with_sdpa():
    model = create_model("vit_test_tiny", attn_backend="auto").to(torch.bfloat16)
    out = model(torch.randn(1, 3, 4, 32, 32, dtype=torch.bfloat16))
    assert out.dtype == torch.bfloat16 and torch.isfinite(out.float()).all()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or not flash_available(), reason="needs CUDA and flash-attn")
def test_flash_matches_sdpa_bf16_gpu():
    torch.manual_seed(0)
    a = create_model("vit_test_tiny", attn_backend="flash", head_init_scale=1.0).cuda().to(torch.bfloat16)
    b = create_model("vit_test_tiny", attn_backend="sdpa", head_init_scale=1.0).cuda().to(torch.bfloat16)
    b.load_state_dict(a.state_dict())
    x = torch.randn(2, 3, 4, 32, 32, device="cuda", dtype=torch.bfloat16)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    ya, yb = a(xa), b(xb)
    torch.testing.assert_close(ya.float(), yb.float(), atol=2e-2, rtol=2e-2)
    ya.float().square().sum().backward()
    yb.float().square().sum().backward()
    torch.testing.assert_close(xa.grad.float(), xb.grad.float(), atol=2e-2, rtol=5e-2)
    assert resolve_backend("auto", "cuda", torch.bfloat16, a.arch.head_dim) == "flash"


def test_flash_decision_rules_with_a_fake_flash_package(monkeypatch):
    """The decision logic for CUDA inputs, checked on CPU with flash-attn and the GPU faked."""
    import sys
    import types

    fake = types.ModuleType("flash_attn")  # a flash-attn package that imports (the library is faked, not our code)
    fake.flash_attn_qkvpacked_func = lambda *a, **k: None
    monkeypatch.setitem(sys.modules, "flash_attn", fake)
    attn_mod._flash_fn.cache_clear()  # the import is looked up once per process
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    attn_mod.resolve_cached.cache_clear()
    cuda = torch.device("cuda", 0)
    try:
        assert attn_mod.resolve_cached("auto", cuda, torch.bfloat16, 64) == "flash"
        assert attn_mod.resolve_cached("auto", cuda, torch.float32, 64) == "sdpa"  # needs fp16/bf16
        assert attn_mod.resolve_cached("auto", cuda, torch.float16, 100) == "sdpa"  # head dim % 8
        assert attn_mod.resolve_cached("auto", cuda, torch.float16, 88) == "flash"  # ViT-g head dim
        with pytest.raises(RuntimeError, match="head_dim=512"):
            attn_mod.resolve_cached("flash", cuda, torch.bfloat16, 512)
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))
        attn_mod.resolve_cached.cache_clear()
        with pytest.raises(RuntimeError, match="compute capability 7"):
            attn_mod.resolve_cached("flash", cuda, torch.bfloat16, 64)
    finally:
        attn_mod.resolve_cached.cache_clear()
        attn_mod._flash_fn.cache_clear()
