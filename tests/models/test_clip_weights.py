"""Dual-encoder weights from files: OpenAI TorchScript archives (never executed), plain / OpenCLIP
checkpoints, AVION / LaViLa checkpoints with their ``args``; projection modes; frame resizing."""

from __future__ import annotations

import argparse
import pickle
import zipfile
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from avion_ds.models import create_model, load_weights
from avion_ds.models.clip.weights import prepare_clip_state_dict
from avion_ds.models.meta import meta_device
from avion_ds.models.partition import state_shapes
from avion_ds.storage.safe_load import UntrustedCheckpoint

open_clip = pytest.importorskip("open_clip")

EXACT = {"act": "quick_gelu", "norm_eps": 1e-5}  # OpenAI's towers


def tiny_open_clip(seed: int = 0) -> torch.nn.Module:
    """An OpenCLIP CLIP with clip_vit_test_tiny's sizes (video 64/2/2 heads, 8 px patches, 32 px; text 32/2/2)."""
    torch.manual_seed(seed)
    vision = {"layers": 2, "width": 64, "head_width": 32, "patch_size": 8, "image_size": 32}
    text = {"context_length": 77, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 2}
    m = open_clip.CLIP(embed_dim=16, vision_cfg=vision, text_cfg=text, quick_gelu=True).eval()
    with torch.no_grad():
        for name, p in m.named_parameters():
            if "ln_" in name or name.endswith("bias"):
                p.add_(0.1 * torch.randn_like(p))
        m.logit_scale.fill_(3.0)
    return m


def avion_state(ref: torch.nn.Module, frames: int, flash: bool = False, fast_conv1: bool = False) -> dict:
    """The state dict AVION's CLIP_VIT* models write (DDP ``module.`` prefix), from OpenCLIP's weights:
    ``visual.image_projection``, ``textual.*`` with ``text_projection``, a temporal embedding;
    flash-attn runs name the blocks ``attn.Wqkv`` / ``mlp.fc1`` / ``mlp.fc2``, fast conv1 is 2-D."""
    out = {}
    for k, v in ref.state_dict().items():
        if k == "attn_mask":
            continue
        if k == "visual.proj":
            k = "visual.image_projection"
        elif not k.startswith(("visual.", "logit_scale")):
            k = f"textual.{k}"
        if k == "visual.conv1.weight" and fast_conv1:
            v = v.flatten(1)
        if flash and k.startswith("visual.transformer."):
            for src, dst in (("attn.in_proj_weight", "attn.Wqkv.weight"), ("attn.in_proj_bias", "attn.Wqkv.bias")):
                k = k.replace(src, dst)
            k = k.replace("mlp.c_fc", "mlp.fc1").replace("mlp.c_proj", "mlp.fc2")
        out[f"module.{k}"] = v
    torch.manual_seed(1)
    out["module.visual.temporal_embedding"] = torch.randn(frames, 64)
    return out


def _video_text(m: torch.nn.Module, frames: int) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(2)
    tokens = torch.randint(1, 49000, (2, 77))
    tokens[:, 10] = 49407
    x = torch.randn(2, 3, frames, 32, 32)
    with torch.no_grad():
        return m.encode_video(x), m.encode_text(tokens)


def test_openai_torchscript_archive_read_without_running_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ref = tiny_open_clip()
    path = tmp_path / "ViT-tiny.pt"
    with pytest.warns(Warning):  # torch.jit.script is deprecated; OpenAI's files were made with it
        torch.jit.save(torch.jit.script(ref), str(path))
    monkeypatch.setattr(torch.jit, "load", lambda *a, **k: pytest.fail("the archive was executed"))
    monkeypatch.setattr(torch, "load", lambda *a, **k: pytest.fail("torch.load on a TorchScript archive"))
    ours = create_model("clip_vit_test_tiny", num_frames=1, pretrained=str(path), **EXACT).eval()
    _, report = prepare_clip_state_dict(ours, str(path))
    assert report.format == "clip-torchscript" and "projection loaded (sizes match)" in report.notes
    x = torch.randn(2, 3, 32, 32)
    tokens = open_clip.tokenize(["a cat", "two dogs on a mat"])
    with torch.no_grad():
        torch.testing.assert_close(ours.encode_video(x.unsqueeze(2)), ref.encode_image(x), rtol=0, atol=1e-5)
        torch.testing.assert_close(ours.encode_text(tokens), ref.encode_text(tokens), rtol=0, atol=1e-5)
    assert ours.logit_scale.item() == 3.0


def test_torchscript_archive_with_code_in_its_pickle_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "evil.pt"
    payload = pickle.dumps(__import__("os").getcwd, protocol=2)  # a GLOBAL other than a module / tensor
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("evil/data.pkl", payload)
        z.writestr("evil/constants.pkl", pickle.dumps(()))
        z.writestr("evil/code/__torch__.py", "")
    model = create_model("clip_vit_test_tiny")
    with pytest.raises(UntrustedCheckpoint, match=r"evil\.pt pickles posix\.getcwd"):
        load_weights(model, str(path))


def test_openclip_training_checkpoint_and_projection_modes(tmp_path: Path) -> None:
    ref = tiny_open_clip()
    path = tmp_path / "epoch_1.pt"
    sd = {f"module.{k}": v for k, v in ref.state_dict().items()}
    torch.save({"epoch": 1, "name": "run", "state_dict": sd}, path)
    same = create_model("clip_vit_test_tiny", pretrained=str(path))
    assert torch.equal(same.visual.proj, ref.visual.proj) and torch.equal(same.textual.proj, ref.text_projection)
    # AVION's start from CLIP: a fresh projection (another size, or asked for) and temperature
    for kw in ({"proj_dim": 8}, {"projection": "fresh"}):
        model = create_model("clip_vit_test_tiny", **kw)
        init = {k: v.clone() for k, v in model.state_dict().items()}
        report = load_weights(model, str(path), strict=True)  # fresh keys are not "missing"
        assert report.skipped == ["logit_scale", "text_projection", "visual.proj"]
        assert report.fresh == ["visual.proj", "textual.proj", "logit_scale", "visual.temporal_embed"]
        assert not report.missing
        assert any(n.startswith("projection fresh") for n in report.notes)
        assert "skipped=3" in report.summary() and "projection fresh" in report.summary()
        for k in report.fresh:
            assert torch.equal(model.state_dict()[k], init[k]), k
        assert torch.equal(model.visual.blocks[1].attn.qkv.bias, ref.visual.transformer.resblocks[1].attn.in_proj_bias)


@pytest.mark.parametrize("flash, fast_conv1", [(False, False), (True, True)])
def test_avion_checkpoint_four_frames_into_sixteen(tmp_path: Path, flash: bool, fast_conv1: bool) -> None:
    """AVION's layout with its args; the temporal embedding follows inflate_positional_embeds:
    4 -> 16 frames is F.interpolate(mode="linear") along time, 4 -> 2 keeps the first two."""
    ref = tiny_open_clip()
    sd = avion_state(ref, 4, flash, fast_conv1)
    args = argparse.Namespace(model="CLIP_VITB16", project_embed_dim=16, clip_length=4, norm_style="openai")
    path = tmp_path / "checkpoint_best.pt"
    torch.save({"epoch": 5, "args": args, "state_dict": sd, "best_acc1": 1.0}, path)
    te = sd["module.visual.temporal_embedding"]
    model = create_model("clip_vit_test_tiny", num_frames=16, **EXACT)
    report = load_weights(model, str(path), strict=True)
    assert report.format == "avion" and report.resized == ["visual.temporal_embed"]
    assert "AVION args: model=CLIP_VITB16, project_embed_dim=16, clip_length=4" in report.notes
    want = F.interpolate(te.t().unsqueeze(0), size=16, mode="linear").squeeze(0).t()
    torch.testing.assert_close(model.visual.temporal_embed[0], want, rtol=0, atol=0)
    fewer = create_model("clip_vit_test_tiny", num_frames=2, **EXACT)
    load_weights(fewer, str(path), strict=True)
    assert torch.equal(fewer.visual.temporal_embed[0], te[:2])
    # with the temporal embedding at zero, every frame of a still clip sees CLIP's image tower
    same = create_model("clip_vit_test_tiny", num_frames=4, **EXACT)
    load_weights(same, str(path), strict=True)
    with torch.no_grad():
        same.visual.temporal_embed.zero_()
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        got = same.encode_video(x.unsqueeze(2).expand(-1, -1, 4, -1, -1))
    assert got.shape == (1, 16) and torch.isfinite(got).all()
    torch.testing.assert_close(_video_text(same, 4)[1], _video_text(ref_model(ref), 1)[1], rtol=0, atol=1e-5)


def ref_model(ref: torch.nn.Module) -> torch.nn.Module:
    """Our tiny dual encoder holding ``ref``'s weights (OpenAI layout), for comparisons."""
    m = create_model("clip_vit_test_tiny", num_frames=1, **EXACT)
    load_weights(m, ref.state_dict(), strict=True)
    return m


def test_avion_args_naming_another_model_is_refused(tmp_path: Path) -> None:
    sd = {f"module.{k}": v for k, v in create_model("clip_vit_test_tiny").state_dict().items()}
    path = tmp_path / "ckpt.pt"
    torch.save({"args": argparse.Namespace(model="CLIP_VITL14", project_embed_dim=256), "state_dict": sd}, path)
    with torch.device("meta"):
        b16 = create_model("clip_vit_base_patch16_224")
    with pytest.raises(ValueError, match=r"trained as AVION CLIP_VITL14 \(= clip_vit_large_patch14_224\)"):
        prepare_clip_state_dict(b16, str(path))


def test_our_own_checkpoint_round_trips_and_low_coverage_is_an_error(caplog: pytest.LogCaptureFixture) -> None:
    src = create_model("clip_vit_test_tiny", proj_dim=16)
    dst = create_model("clip_vit_test_tiny", proj_dim=16)
    report = load_weights(dst, src.state_dict(), strict=True)
    assert report.format == "avion_ds"
    assert all(torch.equal(v, src.state_dict()[k]) for k, v in dst.state_dict().items())
    half = {k: v for k, v in src.state_dict().items() if k.startswith("visual.")}
    with caplog.at_level("ERROR"):
        load_weights(create_model("clip_vit_test_tiny"), half)
    assert "of VideoTextDualEncoder's backbone parameters" in caplog.text


@pytest.mark.parametrize(
    "name, oc_name",
    [("clip_vit_large_patch14_224", "ViT-L-14-quickgelu"), ("clip_vit_large_patch14_336", "ViT-L-14-336-quickgelu")],
)
def test_l14_key_mapping_on_the_meta_device(name: str, oc_name: str) -> None:
    """Every OpenCLIP ViT-L/14 key maps to one of ours with our shape, and every one of ours is filled."""
    with meta_device():  # shapes only: no init drawn on either side
        ref = open_clip.create_model(oc_name, pretrained=None, device="meta")
        ours = create_model(name, proj_dim=768, **EXACT)
    sd, report = prepare_clip_state_dict(ours, ref.state_dict())
    shapes = state_shapes(ours)
    assert set(sd) | {"visual.temporal_embed"} == set(shapes), set(sd) ^ set(shapes)  # CLIP has no time
    assert all(sd[k].shape == shapes[k] for k in sd)
    assert report.fresh == ["visual.temporal_embed"] and not report.resized


def test_avion_checkpoint_into_a_zero3_partitioned_dual_encoder(
    one_rank: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Built under zero.Init and filled module by module: the same weights and report as a plain load."""
    from avion_ds.distributed import dist

    # zero.Init leaves torch.nn.functional.linear replaced by DeepSpeed's zero3_linear_wrap for the
    # rest of the process; put torch's back afterwards (later tests count FLOPs and saved tensors)
    monkeypatch.setattr(F, "linear", F.linear)
    from avion_ds.models.partition import gathered, is_partitioned, partitioned_construction

    dist.init()
    path = tmp_path / "checkpoint_best.pt"
    args = argparse.Namespace(model="CLIP_VITB16", project_embed_dim=16, clip_length=4)
    torch.save({"args": args, "state_dict": avion_state(tiny_open_clip(), 4)}, path)
    torch.manual_seed(3)
    plain = create_model("clip_vit_test_tiny", num_frames=8, **EXACT)
    fresh = {k: v.clone() for k, v in plain.state_dict().items()}
    want = load_weights(plain, str(path), strict=True)
    zero3 = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3}}
    torch.manual_seed(3)
    with partitioned_construction(zero3):
        part = create_model("clip_vit_test_tiny", num_frames=8, **EXACT)
    assert all(is_partitioned(p) for p in part.parameters())
    for name, p in part.named_parameters():  # the same initial values as the plain build (both towers)
        with gathered([p], modifier_rank=None):
            assert torch.equal(p.data.reshape(fresh[name].shape), fresh[name]), name
    got = load_weights(part, str(path), strict=True)
    assert got.summary() == want.summary() and got.resized == ["visual.temporal_embed"]
    ref = dict(plain.named_parameters())
    for name, p in part.named_parameters():
        with gathered([p], modifier_rank=None):
            assert torch.equal(p.data.reshape(ref[name].shape), ref[name].data), name
