"""Run-length tokenization's GPU paths: packed clips through PyTorch's varlen flash kernel (bf16), SDPA clip
by clip (float32) and flash-attn's varlen kernel where it imports give the CPU reference's output and
gradients (clip-by-clip SDPA, float32), with and without activation checkpointing. Skipped without CUDA;
``bench/gpu_suite.sh`` part ``rlt`` runs them on a GPU."""

from __future__ import annotations

import pytest
import torch

from avion_ds.models import create_model
from avion_ds.models.attention import _torch_varlen_fn, flash_varlen_available, packed_attention, sdpa_clip_by_clip
from avion_ds.models.rlt import PackedClips
from tests.models.test_rlt import normalised, piecewise_static

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
GEOMETRY = {"num_frames": 8, "img_size": 32}
# float32 on the GPU without TF32 vs the CPU: summation order only; bf16 vs float32: bf16's 8-bit mantissa
# over 2 blocks on unit-scale features (outputs), and each parameter's gradient as a whole: its relative error
# norm (bf16 on the CPU measured 0.3-1.2 %)
TOL = {torch.float32: {"rtol": 1e-4, "atol": 1e-4}, torch.bfloat16: {"rtol": 5e-2, "atol": 5e-2}}
GRAD_REL = {torch.float32: 1e-4, torch.bfloat16: 3e-2}


@pytest.fixture(autouse=True)
def _no_tf32():
    old = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


def _clips() -> torch.Tensor:
    """Four normalised clips whose kept counts all differ (every patch, some, the first tubelet's only)."""
    frames = piecewise_static(4, 8, seed=11, p_static=0.85)
    frames[0] = torch.randint(0, 256, frames[0].shape, generator=torch.Generator().manual_seed(3), dtype=torch.uint8)
    frames[2] = frames[2, :, :1].expand_as(frames[2])
    return normalised(frames)


def _step(model: torch.nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model.zero_grad()
    out = model(x)
    out.float().pow(2).sum().backward()
    return out.detach().float().cpu().clone(), {n: p.grad.float().cpu().clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("checkpointing", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_packed_clips_on_cuda_give_the_cpu_reference(dtype: torch.dtype, checkpointing: bool) -> None:
    from avion_ds.models.activation_checkpointing import apply_activation_checkpointing

    torch.manual_seed(0)
    model = create_model("vit_test_tiny", **GEOMETRY, num_classes=5, rlt_threshold=0.1, attn_backend="sdpa")
    with torch.no_grad():
        model.rlt_embed.table.weight.normal_(std=0.5)  # run lengths matter
    model.train()
    x = _clips()
    kept = model.rlt_keep(x).flatten(1).sum(1)
    assert len(set(kept.tolist())) >= 3, kept
    want, want_grads = _step(model, x)  # CPU: clip-by-clip SDPA, float32
    gpu = model.to("cuda", dtype)
    if checkpointing:
        apply_activation_checkpointing(gpu, impl="torch", policy="full")
    got, grads = _step(gpu, x.to("cuda", dtype))
    torch.testing.assert_close(got, want, **TOL[dtype])
    errors = {n: float((grads[n] - g).norm() / g.norm()) for n, g in want_grads.items()}
    assert max(errors.values()) < GRAD_REL[dtype], errors


def _packed_qkv() -> tuple[torch.Tensor, PackedClips]:
    g = torch.Generator().manual_seed(2)
    keep = torch.rand(3, 40, generator=g) > 0.4
    keep[:, 0] = True
    packed = PackedClips.from_keep(keep)
    qkv = torch.randn(int(keep.sum()), 3, 4, 64, generator=g).to("cuda", torch.bfloat16)
    return qkv, packed


@pytest.mark.skipif(_torch_varlen_fn() is None, reason="this torch has no torch.nn.attention.varlen")
def test_torch_varlen_equals_sdpa_clip_by_clip() -> None:
    qkv, packed = _packed_qkv()
    varlen = packed_attention(qkv, packed.offsets.to("cuda"), packed.max_len, "sdpa", packed.lengths)
    torch.testing.assert_close(varlen.float(), sdpa_clip_by_clip(qkv, packed.lengths).float(), rtol=2e-2, atol=2e-2)


@pytest.mark.skipif(not flash_varlen_available(), reason="needs flash-attn's varlen kernel")
def test_flash_varlen_equals_sdpa_clip_by_clip() -> None:
    qkv, packed = _packed_qkv()
    flash = packed_attention(qkv, packed.offsets.to("cuda"), packed.max_len, "flash", packed.lengths)
    torch.testing.assert_close(flash.float(), sdpa_clip_by_clip(qkv, packed.lengths).float(), rtol=2e-2, atol=2e-2)
