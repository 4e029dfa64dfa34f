"""The video ViT in the CLIP layout: parity with OpenCLIP's image tower, AVION's token layout, patch
dropout, checkpointing."""

from __future__ import annotations

import pytest
import torch

from avion_ds.models import apply_activation_checkpointing, registered_arch
from avion_ds.models.clip.weights import map_clip_key
from avion_ds.models.vit.model import VideoViT

open_clip = pytest.importorskip("open_clip")

OPENAI = {"act": "quick_gelu", "norm_eps": 1e-5, "proj_dim": 512}  # OpenAI CLIP ViT-B/16 exactly


def _visual_state(oc_state: dict, model: torch.nn.Module) -> dict:
    """OpenCLIP's ``visual.*`` through our key mapping, in our tower's shapes."""
    shapes = {k: v.shape for k, v in model.state_dict().items()}
    out = {}
    for k, v in oc_state.items():
        name = map_clip_key(k, "clip")
        if name and name.startswith("visual."):
            out[name.removeprefix("visual.")] = v.reshape(shapes[name.removeprefix("visual.")])
    return out


@pytest.mark.timeout(120)
def test_vit_b16_one_frame_equals_open_clip_encode_image() -> None:
    torch.manual_seed(0)
    ref = open_clip.create_model("ViT-B-16-quickgelu", pretrained=None).eval()
    with torch.no_grad():  # non-trivial values where OpenCLIP initialises constants
        for name, p in ref.visual.named_parameters():
            if name.startswith(("ln_", "transformer.resblocks.0.ln_")) or name.endswith("bias"):
                p.add_(0.1 * torch.randn_like(p))
    ours = VideoViT(registered_arch("clip_vit_base_patch16_224").vision.replace(num_frames=1, **OPENAI)).eval()
    assert ours.temporal_embed is None  # absent at T = 1
    result = ours.load_state_dict(_visual_state(ref.state_dict(), ours), strict=True)
    assert not result.missing_keys and not result.unexpected_keys
    x = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        want = ref.encode_image(x)
        got = ours(x.unsqueeze(2))  # (B, C, 1, H, W)
    assert got.shape == want.shape == (2, 512)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)


def _tiny(**kw) -> VideoViT:
    arch = registered_arch("clip_vit_test_tiny").vision.replace(**kw)
    return VideoViT(arch)


def test_tokens_follow_avion_layout_time_major() -> None:
    """AVION's VisionTransformer.forward (T > 1), written out: the class token gets
    positional_embedding[0] only; patch tokens get pos[1:] tiled over frames plus the temporal
    embedding repeated per patch, frame after frame; then ln_pre."""
    torch.manual_seed(0)
    m = _tiny(num_frames=3).eval()
    with torch.no_grad():
        m.temporal_embed.normal_()
    x = torch.randn(2, 3, 3, 32, 32)
    B, C, T, H, W = x.shape
    p = m.patch_size
    frames = x.permute(0, 2, 1, 3, 4).reshape(B * T, C, H, W)
    w = m.patch_embed.proj.weight.reshape(m.embed_dim, C, p, p)
    patches = torch.nn.functional.conv2d(frames, w, stride=p).flatten(2).transpose(1, 2).reshape(B, -1, m.embed_dim)
    pos = m.pos_embed[0]
    hw = pos.shape[0] - 1
    total = pos[1:].repeat(T, 1) + m.temporal_embed[0].repeat_interleave(hw, 0)
    tokens = torch.cat([m.cls_token.expand(B, -1, -1), patches], 1) + torch.cat([pos[:1], total])[None]
    with torch.no_grad():
        torch.testing.assert_close(m.forward_tokens(x), m.ln_pre(tokens), rtol=1e-5, atol=1e-5)


def test_temporal_embedding_zero_at_init_and_named() -> None:
    m = _tiny(num_frames=4)
    assert m.temporal_embed.shape == (1, 4, 64) and not m.temporal_embed.any()
    assert "temporal_embed" in m.no_weight_decay() and "pos_embed" in m.no_weight_decay()
    assert m.layer_id("temporal_embed") == 0 and m.layer_id("ln_pre.weight") == 0
    assert m.patch_embed.proj.bias is None and m.blocks[0].attn.qkv.bias is not None


def test_patch_dropout_keeps_class_token_and_only_in_training() -> None:
    torch.manual_seed(0)
    m = _tiny(patch_dropout=0.5)
    x = torch.randn(2, 3, 2, 32, 32)
    n = m.patch_embed.num_patches
    with torch.no_grad():
        train = m.train().forward_tokens(x)
        evald = m.eval().forward_tokens(x)
    assert train.shape[1] == 1 + n // 2 and evald.shape[1] == 1 + n
    torch.testing.assert_close(train[:, 0], evald[:, 0])  # the class token is never dropped
    # every kept token is one of the full sequence's tokens (the same position-encoded patch), no repeats
    dist = torch.cdist(train[:, 1:], evald[:, 1:], compute_mode="donot_use_mm_for_euclid_dist")
    assert dist.amin(-1).max() < 1e-5
    assert all(len(set(row.tolist())) == n // 2 for row in dist.argmin(-1))


def test_checkpointed_gradients_equal_plain_with_drop_path_and_patch_dropout() -> None:
    torch.manual_seed(0)
    m = _tiny(drop_path_rate=0.5, patch_dropout=0.25).train()
    x = torch.randn(2, 3, 2, 32, 32)

    def grads() -> dict:
        m.zero_grad(set_to_none=True)
        torch.manual_seed(1)
        m(x).square().sum().backward()
        return {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}

    ref = grads()
    apply_activation_checkpointing(m)
    got = grads()
    assert set(got) == set(ref)
    for n in ref:
        torch.testing.assert_close(got[n], ref[n], atol=1e-6, rtol=1e-5, msg=n)
