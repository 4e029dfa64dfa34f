"""Registry, shapes, parameter counts and bad-input errors."""

from __future__ import annotations

import pytest
import torch

from avion_ds.models import (
    ClipArch,
    MAEArch,
    VideoViT,
    ViTArch,
    count_params,
    create_model,
    list_models,
    pretrain_arch,
    registered_arch,
)
from avion_ds.models.listing import video_transformer_arch


def test_list_models_has_all_sizes():
    names = list_models()
    for n in (
        "vit_test_tiny",
        "vit_small_patch16_224",
        "vit_base_patch16_224",
        "vit_large_patch16_224",
        "vit_huge_patch16_224",
        "vit_giant_patch14_224",
    ):
        assert n in names
    assert list_models("vit_giant") == ["vit_giant_patch14_224"]
    assert list_models("pretrain_videomae_giant") == ["pretrain_videomae_giant_patch14_224"]


@pytest.mark.parametrize(
    "name,expected_m",
    [
        ("vit_base_patch16_224", 87),
        ("vit_large_patch16_224", 304),
        ("vit_huge_patch16_224", 633),
        ("vit_giant_patch14_224", 1010),
    ],
)
def test_param_counts_match_published(name, expected_m):
    with torch.device("meta"):
        model = create_model(name, num_classes=400)
    n = count_params(model) / 1e6
    assert abs(n - expected_m) / expected_m < 0.01, f"{name}: {n:.1f}M vs {expected_m}M"


def test_giant_architecture():
    arch = registered_arch("vit_giant_patch14_224")
    assert (arch.embed_dim, arch.depth, arch.num_heads, arch.patch_size, arch.mlp_hidden) == (1408, 40, 16, 14, 6144)
    assert arch.grid == (8, 16, 16)


def test_single_head_shape_and_attributes():
    model = create_model("vit_test_tiny", num_classes=7)
    x = torch.randn(2, 3, 4, 32, 32)
    assert model(x).shape == (2, 7)
    assert model.forward_features(x).shape == (2, 64)
    assert isinstance(model, VideoViT)
    assert (model.embed_dim, model.depth, model.num_heads, model.num_frames, model.img_size) == (64, 2, 2, 4, 32)
    assert (model.patch_size, model.tubelet_size, len(model.blocks)) == (16, 2, 2)
    assert model.heads_spec is None and model.arch.name == "vit_test_tiny"


def test_multi_head_dict_output():
    model = create_model("vit_test_tiny", heads={"verb": 97, "noun": 300}, head_drop_rate=0.5)
    out = model.eval()(torch.randn(2, 3, 4, 32, 32))
    assert set(out) == {"verb", "noun"}
    assert out["verb"].shape == (2, 97) and out["noun"].shape == (2, 300)
    assert model.heads_spec == {"verb": 97, "noun": 300}


@pytest.mark.parametrize("pool,pos", [("cls", "learned"), ("mean", "learned"), ("cls", "sincos")])
def test_pool_and_pos_variants(pool, pos):
    model = create_model("vit_test_tiny", pool=pool, pos_embed=pos, num_frames=8, img_size=48, tubelet_size=1)
    assert model(torch.randn(1, 3, 8, 48, 48)).shape == (1, 10)
    assert ("pos_embed" in dict(model.named_parameters())) == (pos == "learned")
    assert ("cls_token" in dict(model.named_parameters())) == (pool == "cls")


def test_no_head_returns_features():
    model = create_model("vit_test_tiny", num_classes=0)
    assert model(torch.randn(1, 3, 4, 32, 32)).shape == (1, 64)


def test_drop_path_increases_linearly():
    model = create_model("vit_test_small", drop_path_rate=0.3)
    rates = [b.drop_path.drop_prob if hasattr(b.drop_path, "drop_prob") else 0.0 for b in model.blocks]
    assert rates == pytest.approx([0.0, 0.1, 0.2, 0.3])


def test_sincos_matches_videomae_formula():
    model = create_model("vit_test_tiny")
    pos = model.pos_embed[0]
    d = model.embed_dim
    p, j = 5, 7  # odd index -> cos
    assert pos[p, j].item() == pytest.approx(torch.cos(torch.tensor(p / 10000 ** (2 * (j // 2) / d))).item(), abs=1e-6)
    assert pos[p, 6].item() == pytest.approx(torch.sin(torch.tensor(p / 10000 ** (2 * 3 / d))).item(), abs=1e-6)
    assert "pos_embed" not in model.state_dict()  # fixed: regenerated, never saved


def test_layer_id_and_no_weight_decay():
    model = create_model("vit_test_tiny", pool="cls", pos_embed="learned")
    assert model.layer_id("patch_embed.proj.weight") == 0
    assert model.layer_id("cls_token") == 0
    assert model.layer_id("blocks.1.attn.qkv.weight") == 2
    assert model.layer_id("head.weight") == model.depth + 1
    nwd = model.no_weight_decay()
    assert {"pos_embed", "cls_token", "blocks.0.attn.q_bias", "blocks.0.norm1.weight", "head.bias"} <= nwd
    assert "blocks.0.attn.qkv.weight" not in nwd and "head.weight" not in nwd


def test_unknown_model_lists_close_matches():
    with pytest.raises(ValueError, match="did you mean vit_base_patch16_224"):
        create_model("vit_base_patch16")


def test_unknown_override_lists_close_matches():
    with pytest.raises(TypeError, match="num_frames"):
        create_model("vit_test_tiny", num_frame=8)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"attn_backend": "fast"}, "attn_backend"),
        ({"pool": "max"}, "pool"),
        ({"num_frames": 5}, "num_frames"),
        ({"img_size": 40}, "img_size"),
        ({"heads": {"verb": 0}}, "heads"),
    ],
)
def test_bad_options(kwargs, match):
    with pytest.raises(ValueError, match=match):
        create_model("vit_test_tiny", **kwargs)


@pytest.mark.parametrize(
    "shape,match",
    [
        ((3, 4, 32, 32), "expected a 5-D input"),
        ((2, 3, 8, 32, 32), "frames 4 got 8"),
        ((2, 1, 4, 32, 32), "channels 3 got 1"),
        ((2, 3, 4, 32, 48), "width 32 got 48"),
        ((2, 4, 32, 32, 3), "expected input"),
    ],
)
def test_bad_input_shape_is_one_line_value_error(shape, match):
    model = create_model("vit_test_tiny")
    with pytest.raises(ValueError, match=match) as info:
        model(torch.randn(*shape))
    assert "\n" not in str(info.value) and "got" in str(info.value)


def test_integer_input_rejected():
    model = create_model("vit_test_tiny")
    with pytest.raises(ValueError, match="float"):
        model(torch.zeros(1, 3, 4, 32, 32, dtype=torch.uint8))


def test_arch_lookups_name_what_they_return():
    """registered_arch: ViTArch / ClipArch; pretrain_arch: MAEArch; video_transformer_arch: the ViTArch any name runs."""
    assert isinstance(registered_arch("vit_test_tiny"), ViTArch)
    assert isinstance(registered_arch("vit_clip_test_tiny"), ViTArch)
    assert isinstance(registered_arch("clip_vit_test_tiny"), ClipArch)
    assert isinstance(pretrain_arch("pretrain_videomae_test_tiny"), MAEArch)
    with pytest.raises(ValueError, match=r"a pretraining model; its architecture \(MAEArch\) is .*pretrain_arch"):
        registered_arch("pretrain_videomae_test_tiny")
    with pytest.raises(ValueError, match="unknown pretraining model"):
        pretrain_arch("vit_test_tiny")
    assert video_transformer_arch("vit_test_tiny") == registered_arch("vit_test_tiny")
    assert video_transformer_arch("clip_vit_test_tiny") == registered_arch("clip_vit_test_tiny").vision
    assert video_transformer_arch("pretrain_videomae_test_tiny") == pretrain_arch("pretrain_videomae_test_tiny").encoder
    assert video_transformer_arch("vit_tset_tiny") is None
