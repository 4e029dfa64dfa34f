"""Analytic FLOPs agree with DeepSpeed's flops profiler (which counts 2 * MACs for matmuls)."""

from __future__ import annotations

import pytest
import torch

from avion_ds.models import create_model, model_flops, registered_arch


@pytest.mark.parametrize("backend,embed,pool", [("eager", "linear", "mean"), ("sdpa", "conv", "cls")])
def test_model_flops_matches_deepspeed_profiler(backend, embed, pool):
    from deepspeed.profiling.flops_profiler import get_model_profile

    model = create_model(
        "vit_test_small", attn_backend=backend, patch_embed=embed, pool=pool, heads={"v": 5, "n": 7}
    ).eval()
    with torch.no_grad():
        flops, macs, _ = get_model_profile(model, input_shape=(1, 3, 8, 64, 64), print_profile=False, as_string=False)
    ours = model_flops(model)
    # measured: -0.42% (the profiler also counts norms / softmax / GELU / adds, which we leave out)
    assert abs(ours - flops) / flops < 0.01, (ours, flops)
    assert ours == 2 * macs  # every matmul counted, as 2 * MACs, exactly


def test_model_flops_by_name_and_size_override():
    base = model_flops("vit_base_patch16_224")
    assert 3.4e11 < base < 3.8e11  # VideoMAE ViT-B 16x224: ~180 GMACs
    assert model_flops("vit_base_patch16_224", num_frames=8) < base / 2 + 1e10
    assert model_flops(registered_arch("vit_base_patch16_224")) == base
    assert model_flops(create_model("vit_test_tiny"), num_frames=8, img_size=64) == model_flops("vit_test_tiny", 8, 64)


def test_model_flops_rejects_other_objects():
    with pytest.raises(TypeError, match="model_flops"):
        model_flops(torch.nn.Linear(2, 2))
