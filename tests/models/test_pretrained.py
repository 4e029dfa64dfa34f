"""Pretrained loading: every format round-trips; resizing; reports; errors."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from avion_ds.models import create_model, load_weights
from avion_ds.models.vit.weights import resize_patch_weight, resize_pos_embed
from tests.models.convert import to_hf, to_videomae, to_videomae_pretrain

X = torch.randn(2, 3, 4, 32, 32)


def _src(**kw):
    torch.manual_seed(0)
    model = create_model("vit_test_tiny", head_init_scale=1.0, **kw).eval()
    with torch.no_grad():  # non-trivial biases / norms so a wrong mapping shows up
        for p in model.parameters():
            if p.ndim == 1:
                p.add_(torch.randn_like(p) * 0.1)
    return model


def _fresh(**kw):
    torch.manual_seed(123)
    return create_model("vit_test_tiny", **kw).eval()


@torch.no_grad()
def test_videomae_finetune_checkpoint_reproduces_logits_exactly(tmp_path):
    src = _src(layer_scale=0.1)
    path = tmp_path / "checkpoint-best.pth"
    ckpt = to_videomae(src)
    ckpt["args"] = {"model": "vit_test_tiny"}
    torch.save(ckpt, path)
    dst = _fresh(layer_scale=0.1)
    report = load_weights(dst, path, strict=True)
    assert report.format == "videomae" and not report.missing and not report.unexpected
    assert torch.equal(dst(X), src(X))


@torch.no_grad()
def test_videomae_conv_model_and_linear_model_both_load():
    src = _src(patch_embed="conv")
    dst = _fresh(patch_embed="linear")
    load_weights(dst, to_videomae(src), strict=True)
    torch.testing.assert_close(dst(X), src(X), atol=1e-5, rtol=1e-5)


@torch.no_grad()
def test_videomae_pretrain_checkpoint_loads_encoder(tmp_path):
    src = _src()
    path = tmp_path / "pretrain.pth"
    torch.save(to_videomae_pretrain(src), path)
    dst = _fresh(num_classes=5)
    report = load_weights(dst, path)
    assert report.format == "videomae"
    assert report.missing == ["fc_norm.bias", "fc_norm.weight", "head.bias", "head.weight"]
    assert report.unexpected == [
        "decoder.blocks.0.norm1.weight",
        "encoder_to_decoder.weight",
        "mask_token",
        "norm.bias",
        "norm.weight",
    ]
    src.fc_norm.weight.fill_(1.0)  # fc_norm starts fresh, as in VideoMAE's fine-tuning
    src.fc_norm.bias.zero_()
    assert torch.equal(dst.forward_features(X), src.forward_features(X))


@torch.no_grad()
def test_hf_videomae_state_dict_roundtrip(tmp_path):
    src = _src()
    path = tmp_path / "model.safetensors"
    save_file(to_hf(src), str(path))
    for source in (path, tmp_path):  # file, or the HF model directory
        dst = _fresh()
        report = load_weights(dst, source, strict=True)
        assert report.format == "hf"
        torch.testing.assert_close(dst(X), src(X), atol=1e-6, rtol=1e-6)


@torch.no_grad()
def test_hf_bin_with_transformers4_q_v_bias_names(tmp_path):
    """to_hf writes transformers 5's query.bias / value.bias; 4.x checkpoints say q_bias / v_bias."""
    src = _src()
    sd = {}
    for k, v in to_hf(src).items():
        k = k.replace("attention.attention.query.bias", "attention.attention.q_bias")
        sd[k.replace("attention.attention.value.bias", "attention.attention.v_bias")] = v
    torch.save(sd, tmp_path / "pytorch_model.bin")
    dst = _fresh()
    load_weights(dst, tmp_path / "pytorch_model.bin", strict=True)
    torch.testing.assert_close(dst(X), src(X), atol=1e-6, rtol=1e-6)


@torch.no_grad()
def test_against_transformers_videomae():
    """Reference: transformers' own VideoMAE (the test extra pins transformers 5.x); runs, never skips."""
    import transformers

    assert int(transformers.__version__.split(".")[0]) == 5, transformers.__version__
    cfg = transformers.VideoMAEConfig(
        image_size=32,
        patch_size=16,
        num_channels=3,
        num_frames=4,
        tubelet_size=2,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=256,
        qkv_bias=True,
        use_mean_pooling=True,
        layer_norm_eps=1e-6,
        num_labels=10,
        hidden_act="gelu",
    )
    hf = transformers.VideoMAEForVideoClassification(cfg).eval()
    hf.fc_norm.eps = 1e-6
    dst = _fresh()
    load_weights(dst, hf.state_dict(), strict=True)
    ref = hf(pixel_values=X.permute(0, 2, 1, 3, 4)).logits
    torch.testing.assert_close(dst(X), ref, atol=1e-5, rtol=1e-5)


def _timm_vit(**kw):
    from timm.models.vision_transformer import VisionTransformer

    torch.manual_seed(1)
    vit = VisionTransformer(img_size=32, patch_size=16, embed_dim=64, depth=2, num_heads=2, num_classes=10, **kw).eval()
    with torch.no_grad():
        for p in vit.parameters():
            if p.ndim == 1:
                p.add_(torch.randn_like(p) * 0.1)  # includes a non-zero k bias (softmax-invariant)
    return vit


# Without a class token, a static clip's tokens are the image tokens repeated in time, which
# attention and mean pooling cannot tell apart; with one, only a single tubelet in time is exact.
@pytest.mark.parametrize(
    "pool,frames,timm_kw", [("cls", 2, {}), ("mean", 4, {"class_token": False, "global_pool": "avg"})]
)
@torch.no_grad()
def test_timm_image_vit_inflates_exactly_on_static_clips(pool, frames, timm_kw):
    vit = _timm_vit(**timm_kw)
    dst = _fresh(pool=pool, pos_embed="learned", num_frames=frames)
    report = load_weights(dst, vit.state_dict(), strict=True)
    assert report.format == "timm"
    img = torch.randn(2, 3, 32, 32)
    clip = img[:, :, None].expand(2, 3, frames, 32, 32).contiguous()  # the same frame repeated
    torch.testing.assert_close(dst(clip), vit(img), atol=1e-5, rtol=1e-5)


def test_timm_vit_base_state_dict_loads_into_video_base():
    import timm

    with torch.device("meta"):  # shapes only: fast, no memory
        sd = timm.create_model("vit_base_patch16_224", pretrained=False).state_dict()
        dst = create_model("vit_base_patch16_224", num_frames=4, pool="cls", pos_embed="learned")
    report = load_weights(dst, sd)
    assert report.format == "timm"
    assert report.missing == ["head.bias", "head.weight"]
    assert report.dropped == ["head.bias", "head.weight"]  # 1000 ImageNet classes vs 400
    assert report.unexpected == []
    assert report.resized == ["patch_embed.proj.weight", "pos_embed"]
    assert dst.pos_embed.shape == (1, 2 * 14 * 14, 768)


def test_timm_into_sincos_model_reports_unused_pos_embed():
    report = load_weights(_fresh(pool="cls"), _timm_vit().state_dict())
    assert report.unexpected == ["pos_embed"] and report.missing == [] and report.resized == ["patch_embed.proj.weight"]


@torch.no_grad()
def test_own_format_safetensors_via_create_model(tmp_path):
    src = _src(heads={"verb": 4, "noun": 3}, pos_embed="learned")
    path = tmp_path / "export.safetensors"
    save_file({k: v.float().contiguous() for k, v in src.state_dict().items()}, str(path))
    dst = create_model("vit_test_tiny", pretrained=str(path), heads={"verb": 4, "noun": 3}, pos_embed="learned").eval()
    out, ref = dst(X), src(X)
    for k in ref:
        assert torch.equal(out[k], ref[k])
    report = load_weights(dst, path, strict=True)
    assert report.format == "avion_ds"


def test_own_format_deepspeed_module_wrapper_and_ddp_prefix():
    src = _src()
    ckpt = {"module": {"module." + k: v for k, v in src.state_dict().items()}, "global_steps": 3}
    dst = _fresh()
    report = load_weights(dst, ckpt, strict=True)
    assert report.format == "avion_ds"
    assert all(torch.equal(a, b) for a, b in zip(dst.state_dict().values(), src.state_dict().values()))


def test_head_dropped_when_class_count_differs_and_strict_raises():
    src = _src()
    dst = _fresh(num_classes=3)
    report = load_weights(dst, src.state_dict())
    assert report.dropped == ["head.bias", "head.weight"] and report.missing == ["head.bias", "head.weight"]
    with pytest.raises(ValueError, match="dropped=2"):
        load_weights(_fresh(num_classes=3), src.state_dict(), strict=True)


def test_single_head_checkpoint_into_multi_head_model():
    report = load_weights(_fresh(heads={"verb": 2, "noun": 3}), _src().state_dict())
    assert report.missing == ["heads.noun.bias", "heads.noun.weight", "heads.verb.bias", "heads.verb.weight"]
    assert report.unexpected == ["head.bias", "head.weight"]


def test_learned_pos_embed_interpolated_in_time_and_space():
    src = _src(pos_embed="learned")
    with torch.no_grad():
        src.pos_embed.fill_(0.25)
    dst = create_model("vit_test_tiny", pos_embed="learned", num_frames=8, img_size=64)
    report = load_weights(dst, src.state_dict())
    assert "pos_embed" in report.resized
    assert dst.pos_embed.shape == (1, 4 * 4 * 4, 64)
    torch.testing.assert_close(dst.pos_embed.detach(), torch.full_like(dst.pos_embed, 0.25))


def test_resize_pos_embed_time_only_keeps_spatial_pattern():
    pos = torch.arange(2 * 2 * 2, dtype=torch.float32).reshape(1, 8, 1).repeat(1, 1, 4)
    pos[:, 4:] = pos[:, :4]  # constant in time
    out = resize_pos_embed(pos, (4, 2, 2))
    assert out.shape == (1, 16, 4)
    torch.testing.assert_close(out.reshape(4, 4, 4)[3], pos[0, :4])


def test_tubelet_depth_resize():
    src = _src()
    dst = _fresh(tubelet_size=1)
    report = load_weights(dst, src.state_dict())
    assert report.resized == ["patch_embed.proj.weight"]
    static = X[:, :, :1].expand(2, 3, 4, 32, 32)
    # on static clips a tubelet-1 embedding with the rescaled weight equals the tubelet-2 one
    w2 = src.patch_embed.proj.weight.reshape(64, 3, 2, 16, 16)
    w1 = resize_patch_weight(w2, (64, 3, 1, 16, 16))
    torch.testing.assert_close(w1[:, :, 0], w2.sum(2))
    torch.testing.assert_close(dst.patch_embed(static)[:, :4], src.patch_embed(static)[:, :4])


def test_unknown_format_names_first_keys():
    with pytest.raises(ValueError, match=r"first keys: \['encoder.conv1.weight', 'fc.bias'\]"):
        load_weights(_fresh(), {"encoder.conv1.weight": torch.zeros(1), "fc.bias": torch.zeros(1)})


def test_incompatible_shape_names_key():
    sd = _src().state_dict()
    sd["blocks.0.mlp.fc1.weight"] = torch.zeros(3, 3)
    with pytest.raises(ValueError, match=r"blocks.0.mlp.fc1.weight: shape \(3, 3\)"):
        load_weights(_fresh(), sd)


def test_missing_file():
    with pytest.raises(FileNotFoundError, match="nope.pth"):
        load_weights(_fresh(), "/tmp/nope.pth")


@torch.no_grad()
def test_pickled_training_args_load_through_the_allowlist(tmp_path, monkeypatch):
    import argparse

    import numpy as np

    src = _src()
    ckpt = to_videomae(src)
    # as VideoMAE's save_on_master does, with numpy scalars / dtypes / arrays inside
    ckpt["args"] = argparse.Namespace(
        model="vit_test_tiny",
        lr=np.float64(1e-3),
        steps=np.int64(3),
        dtype=np.dtype("float32"),
        mean=np.array([0.485, 0.456, 0.406]),
    )
    torch.save(ckpt, tmp_path / "checkpoint-99.pth")
    real_load = torch.load

    def weights_only_load(*a, **kw):  # never a full unpickling for these harmless types
        assert kw.get("weights_only") is True, kw
        return real_load(*a, **kw)

    monkeypatch.setattr(torch, "load", weights_only_load)
    dst = _fresh()
    load_weights(dst, tmp_path / "checkpoint-99.pth", strict=True)
    assert torch.equal(dst(X), src(X))


class _RunsCode:
    """Unpickling this calls os.system: what a malicious .pth could do."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        import os

        return (os.system, (f"touch {self.marker}",))


class _Harmless:
    """A custom class: not on the allowlist, loadable only when the user trusts the file."""

    def __init__(self):
        self.note = "ok"


def test_checkpoint_that_would_run_code_is_refused_without_running_it(tmp_path):
    from avion_ds.storage.safe_load import UntrustedCheckpoint

    marker = tmp_path / "pwned"
    ckpt = to_videomae(_src())
    ckpt["payload"] = _RunsCode(marker)
    torch.save(ckpt, tmp_path / "evil.pth")
    with pytest.raises(
        UntrustedCheckpoint,
        match=r"evil.pth pickles Python objects .*\(posix.system\).*"
        r"pass --trust-checkpoint on the command line only if you trust the file",
    ) as info:
        load_weights(_fresh(), tmp_path / "evil.pth")
    assert "\n" not in str(info.value)
    assert not marker.exists()  # nothing was executed


@torch.no_grad()
def test_untrusted_custom_object_needs_explicit_trust(tmp_path):
    from avion_ds.storage.safe_load import UntrustedCheckpoint

    src = _src()
    ckpt = to_videomae(src)
    ckpt["extra"] = _Harmless()
    torch.save(ckpt, tmp_path / "custom.pth")
    with pytest.raises(UntrustedCheckpoint, match="_Harmless"):
        load_weights(_fresh(), tmp_path / "custom.pth")
    dst = _fresh()
    load_weights(dst, tmp_path / "custom.pth", strict=True, trust=True)
    assert torch.equal(dst(X), src(X))


def test_corrupt_file_is_one_line_error_naming_it(tmp_path):
    bad = tmp_path / "broken.safetensors"
    bad.write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="cannot read checkpoint .*broken.safetensors") as info:
        load_weights(_fresh(), bad)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    "src,target",
    [
        ((8, 14, 14), (16, 16, 16)),
        ((8, 14, 14), (8, 7, 7)),
        ((16, 14, 14), (8, 7, 7)),
        ((16, 14, 14), (16, 16, 16)),
        ((8, 14, 14), (16, 14, 14)),
        ((16, 14, 14), (8, 14, 14)),
    ],
)
def test_resize_pos_embed_reads_the_source_grid_by_the_target_ratios(src, target):
    """A table constant in time with a spatial pattern: resizing must keep it constant in time and
    resample the pattern bilinearly (a wrong grid guess such as 2x28x28 for 1568 tokens mixes them)."""
    import torch.nn.functional as F

    from avion_ds.models.vit.weights import guess_grid

    t0, h0, w0 = src
    assert guess_grid(t0 * h0 * w0, target) == src
    g = torch.Generator().manual_seed(0)
    pattern = torch.randn(1, 3, h0, w0, generator=g)  # (1, D, h, w)
    pos = pattern.permute(0, 2, 3, 1).reshape(1, 1, h0 * w0, 3).expand(1, t0, h0 * w0, 3).reshape(1, -1, 3)
    out = resize_pos_embed(pos, target).reshape(*target, 3)
    want = F.interpolate(pattern, size=target[1:], mode="bilinear", align_corners=False)[0].permute(1, 2, 0)
    for t in range(target[0]):
        torch.testing.assert_close(out[t], want, atol=1e-5, rtol=1e-5)


@torch.no_grad()
def test_videomae_pretrain_norm_is_not_fc_norm_as_in_official_finetuning(tmp_path):
    """VideoMAE's run_class_finetuning.py strips ``encoder.`` only: the encoder's final ``norm`` is unused
    by a mean-pooling model (modeling_finetune: norm = Identity) and ``fc_norm`` keeps its LayerNorm init."""
    src = _src()
    ckpt = to_videomae_pretrain(src)
    dst = _fresh()
    report = load_weights(dst, ckpt)
    assert {"norm.weight", "norm.bias"} <= set(report.unexpected)
    assert {"fc_norm.weight", "fc_norm.bias"} <= set(report.missing)
    assert torch.equal(dst.fc_norm.weight, torch.ones(64)) and torch.equal(dst.fc_norm.bias, torch.zeros(64))
    # everything below fc_norm is the encoder's: equal to the source with an identity-affine fc_norm
    with torch.no_grad():
        src.fc_norm.weight.fill_(1.0)
        src.fc_norm.bias.zero_()
    assert torch.equal(dst.forward_features(X), src.forward_features(X))


def test_below_threshold_load_is_an_error_whatever_strict(caplog):
    """A checkpoint that covers a sliver of the backbone is never a silent success: an ERROR log line
    naming the source and the matched fraction without ``strict``, a one-line ValueError with it."""
    src = _src()
    sliver = {k: v for k, v in src.state_dict().items() if k.startswith(("patch_embed.", "blocks.0.attn.qkv"))}
    with caplog.at_level("ERROR", logger="avion_ds.models.weights.loading"):
        report = load_weights(_fresh(), sliver)
    assert report.format == "avion_ds" and len(report.missing) > 20
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and "pretrained a state dict matched" in errors[0] and "below 90%" in errors[0]
    with pytest.raises(ValueError, match=r"^load_weights\(strict=True\) from a state dict: format=avion_ds missing="):
        load_weights(_fresh(), sliver, strict=True)
    caplog.clear()
    with caplog.at_level(
        "ERROR", logger="avion_ds.models.weights.loading"
    ):  # a pretraining encoder: fc_norm / head fresh
        load_weights(_fresh(num_classes=5), to_videomae_pretrain(src))
        load_weights(_fresh(), src.state_dict(), strict=True)
        load_weights(_fresh(), sliver, coverage_check=False)  # a caller that reports coverage itself
    assert not caplog.records
