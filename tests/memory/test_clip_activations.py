"""The memory planner covers the video-text dual encoder: its activation formula equals the exact
saved-tensor count on CPU (both towers, the CLIP layout, patch dropout, drop path, checkpointing)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from avion_ds.memory.activations import measure_activation_bytes
from avion_ds.memory.estimate import activation_bytes_per_clip, arch_info, estimate
from avion_ds.models import count_params, create_model, list_models, registered_arch


def _fast(name: str, **kw) -> nn.Module:
    """Uninitialised weights (values do not change saved bytes)."""
    with torch.device("meta"):
        model = create_model(name, **kw)
    return model.to_empty(device="cpu")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "kw",
    [{}, {"patch_dropout": 0.5, "drop_path_rate": 0.2, "depth": 3}, {"num_frames": 1, "text_depth": 3, "proj_dim": 24}],
    ids=["plain", "patch_dropout-drop_path", "one_frame"],
)
def test_dual_encoder_formula_is_exact(dtype: torch.dtype, kw: dict) -> None:
    model = _fast("clip_vit_test_tiny", **kw).to(dtype)
    info = arch_info(model)
    frames = model.num_frames
    once = 4  # the fp32 logit scale's exp: once per batch
    cases = ((False, None, "full"), (True, None, "full"), (2, None, "full"), (1, 1, "full"), (True, None, "selective"))
    for ckpt, first_n, policy in cases + ((2, None, "selective"),):
        for batch in (1, 2):
            measured = measure_activation_bytes(
                model, (frames, 32, batch), checkpointing=ckpt, first_n=first_n, policy=policy
            )
            predicted = batch * activation_bytes_per_clip(info, frames, 32, dtype, ckpt, first_n, policy=policy)
            assert measured == predicted - (batch - 1) * once, (ckpt, first_n, policy, batch, measured, predicted)


@pytest.mark.parametrize("name", [n for n in list_models() if n.startswith("clip_")])
def test_every_registered_dual_encoder_width_exact(name: str) -> None:
    """Depth-2 copies at each size's widths, heads and patch size (activations are linear in depth)."""
    arch = registered_arch(name)
    size = 4 * arch.patch_size
    model = _fast(name, depth=2, text_depth=2, num_frames=2, img_size=size)
    info = arch_info(model)
    for ckpt, policy in ((False, "full"), (1, "full"), (1, "selective")):
        measured = measure_activation_bytes(model, (2, size, 1), checkpointing=ckpt, policy=policy)
        predicted = activation_bytes_per_clip(info, 2, size, torch.float32, ckpt, policy=policy)
        assert measured == predicted, (name, ckpt, policy)


def test_estimate_by_name_counts_both_towers() -> None:
    name = "clip_vit_base_patch16_224"
    with torch.device("meta"):
        params = count_params(create_model(name, num_frames=8))
    info = arch_info(name, 8, 224)
    assert info.params == params and info.text is not None and info.text.context == 77
    e = estimate(name, 8, 224, 256, "bf16", 2, checkpointing=True, world_size=8)
    assert e.activations == 256 * activation_bytes_per_clip(info, 8, 224, "bf16", True)
    video_only = activation_bytes_per_clip(arch_info(create_model_meta_visual(name)), 8, 224, "bf16", True)
    assert e.activations > 256 * video_only  # the text tower's share is counted


def create_model_meta_visual(name: str) -> nn.Module:
    with torch.device("meta"):
        return create_model(name, num_frames=8).visual
