"""Fine-tuning a classifier from a dual encoder's video tower: the ``vit_clip_*`` classifiers are the
towers of the ``clip_vit_*`` dual encoders with a head in place of the projection (AVION's
``VideoClassifier``), the tower's weights load from our / AVION / OpenAI CLIP files (text tower,
temperature and projection reported dropped), and unset ``model.pool`` / ``model.pos_embed`` leave
every registered model's own layout."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from avion_ds.config import ConfigError, ModelConfig
from avion_ds.engine.preflight import check_weights_source
from avion_ds.engine.run_checkpoints import model_identity
from avion_ds.models import create_model, load_weights, registered_arch
from avion_ds.models.weights.loading import REPORT_NAME, load_and_report
from avion_ds.tasks import build_recipe
from avion_ds.tasks.finetune.task import FinetuneTask, model_kwargs
from tests.helpers.models import create_model_from_config

PAIRS = [
    ("vit_clip_test_tiny", "clip_vit_test_tiny"),
    ("vit_clip_base_patch16_224", "clip_vit_base_patch16_224"),
    ("vit_clip_large_patch14_224", "clip_vit_large_patch14_224"),
]


def dual_encoder(seed: int = 0, **overrides: object) -> torch.nn.Module:
    """A clip_vit_test_tiny with random weights everywhere (zero-init tables and biases included)."""
    torch.manual_seed(seed)
    model = create_model("clip_vit_test_tiny", **overrides).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model


def reference_layout(sd: dict[str, torch.Tensor], layout: str) -> dict[str, torch.Tensor]:
    """Our dual-encoder state dict under AVION's names (``module.visual.*``, ``module.textual.*``,
    ``image_projection``) or OpenAI CLIP's (text tower at the top level, ``visual.proj``, an
    ``attn_mask`` buffer), with their shapes (0-d class embedding, 2-D tables, 4-D conv1)."""
    block = {"norm1": "ln_1", "norm2": "ln_2", "attn.qkv.weight": "attn.in_proj_weight"}
    block |= {"attn.qkv.bias": "attn.in_proj_bias", "attn.proj": "attn.out_proj", "mlp.fc1": "mlp.c_fc"}
    block |= {"mlp.fc2": "mlp.c_proj"}
    visual = {"cls_token": "class_embedding", "pos_embed": "positional_embedding", "norm": "ln_post"}
    visual |= {"temporal_embed": "temporal_embedding", "patch_embed.proj": "conv1", "ln_pre": "ln_pre"}
    visual["proj"] = "image_projection" if layout == "avion" else "proj"
    text = {"pos_embed": "positional_embedding", "norm": "ln_final", "proj": "text_projection"}
    text["token_embedding"] = "token_embedding"
    out = {}
    for key, v in sd.items():
        tower, _, rest = key.partition(".")
        if key == "logit_scale":
            out[key] = v.reshape(())
            continue
        parts = rest.split(".")
        if parts[0] == "blocks":
            suffix = ".".join(parts[2:])
            name = next(dst + suffix[len(src) :] for src, dst in block.items() if suffix.startswith(src))
            name = f"transformer.resblocks.{parts[1]}.{name}"
        else:
            table = visual if tower == "visual" else text
            stem = next(s for s in sorted(table, key=len, reverse=True) if rest == s or rest.startswith(s + "."))
            name = table[stem] + rest[len(stem) :]
        if name == "conv1.weight":
            v = v.reshape(v.shape[0], 3, *2 * [int((v.shape[1] // 3) ** 0.5)])
        elif name in ("class_embedding", "positional_embedding", "temporal_embedding"):
            v = v.reshape(-1, v.shape[-1]).squeeze(0)
        if tower == "visual":
            out[f"visual.{name}"] = v
        else:
            out[f"textual.{name}" if layout == "avion" else name] = v
    if layout == "avion":
        return {f"module.{k}": v for k, v in out.items()}
    out["attn_mask"] = torch.full((77, 77), float("-inf")).triu(1)
    return out


def pre_projection(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The dual encoder's video feature before ``proj``: the class token after ``ln_post``."""
    seen = []
    hook = model.visual.norm.register_forward_hook(lambda m, i, o: seen.append(o))
    with torch.no_grad():
        projected = model.encode_video(x)
    hook.remove()
    torch.testing.assert_close(projected, seen[0] @ model.visual.proj, rtol=0, atol=0)
    return seen[0]


def features(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model.forward_features(x)


def clip(frames: int = 2, size: int = 32, seed: int = 3) -> torch.Tensor:
    torch.manual_seed(seed)
    return torch.randn(2, 3, frames, size, size)


@pytest.mark.parametrize(("name", "tower"), PAIRS)
def test_classifiers_are_the_dual_encoders_video_towers(name: str, tower: str) -> None:
    arch, vision = registered_arch(name), registered_arch(tower).vision
    same = {f.name for f in dataclasses.fields(arch)} - {"name", "proj_dim", "num_classes"}
    assert {k: getattr(arch, k) for k in same} == {k: getattr(vision, k) for k in same}
    assert (arch.proj_dim, arch.pool, arch.pos_embed, arch.tubelet_size) == (None, "cls", "clip", 1)
    assert (arch.act, arch.norm_eps, arch.k_bias, arch.ln_pre, arch.patch_embed_bias) == (
        "gelu",
        1e-6,
        True,
        True,
        False,
    )
    assert arch.feature_dim == arch.embed_dim and arch.num_classes > 0


def test_classifier_is_dropout_then_linear_on_ln_post_of_the_class_token() -> None:
    """AVION's VideoClassifier: ``fc_cls(dropout(visual(x)))`` with the projection removed."""
    model = create_model("vit_clip_test_tiny", num_classes=5, head_drop_rate=0.5)
    assert model.proj is None and model.head.weight.shape == (5, 64) and model.head_drop.p == 0.5
    x = clip()
    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(model(x), F.linear(model.forward_features(x), model.head.weight, model.head.bias))
    model.train()
    torch.manual_seed(0)
    with torch.no_grad():
        feats = model.forward_features(x)
        torch.manual_seed(1)
        logits = model(x)
        torch.manual_seed(1)
        want = F.linear(F.dropout(feats, 0.5, training=True), model.head.weight, model.head.bias)
    torch.testing.assert_close(logits, want)


@pytest.mark.parametrize("wrap", ["plain", "module_prefix", "deepspeed"])
def test_our_dual_encoder_state_dict_gives_the_towers_features(wrap: str) -> None:
    de = dual_encoder()
    sd = de.state_dict()
    source = {"plain": sd, "module_prefix": {f"module.{k}": v for k, v in sd.items()}, "deepspeed": {"module": sd}}
    model = create_model("vit_clip_test_tiny", num_classes=5).eval()
    head = model.head.weight.clone()
    report = load_weights(model, source[wrap])
    x = clip()
    assert torch.equal(features(model, x), pre_projection(de, x))  # exactly: same ops on the same weights
    text = sorted(k for k in sd if k.startswith("textual."))
    assert report.format == "dual_encoder"
    assert report.dropped == sorted([*text, "logit_scale", "visual.proj"])
    assert not report.missing and not report.unexpected and report.fresh == ["head.weight", "head.bias"]
    assert any(f"dropped text tower ({len(text)} tensors), logit_scale, visual.proj" in n for n in report.notes)
    assert "format=dual_encoder dropped=" in report.summary() and "text tower" in report.summary()
    assert torch.equal(model.head.weight, head)  # the head is fresh
    assert report.matched == report.total > 0  # a real tower covers the whole backbone (the 90% check passes)
    assert report.mean_std is None  # our own layout: the file does not say


@pytest.mark.parametrize("layout", ["avion", "clip"])
def test_avion_and_openai_layouts_give_the_towers_features(layout: str) -> None:
    de = dual_encoder()
    ref = reference_layout(de.state_dict(), layout)
    model = create_model("vit_clip_test_tiny").eval()
    report = load_weights(model, ref)
    x = clip()
    assert torch.equal(features(model, x), pre_projection(de, x))
    keys = [k.removeprefix("module.") for k in ref]  # reported as unwrapped (DDP prefix stripped)
    text = [k for k in keys if k.startswith(("textual.", "token_embedding", "transformer.", "ln_final"))]
    text += [k for k in keys if k in ("positional_embedding", "text_projection")]
    projection = "visual.image_projection" if layout == "avion" else "visual.proj"
    assert report.dropped == sorted([*text, projection, "logit_scale"])
    assert not report.missing and not report.unexpected  # CLIP's attn_mask is no weight
    want = "AVION / LaViLa" if layout == "avion" else "OpenAI CLIP / OpenCLIP"
    assert any(n.startswith(f"dual encoder ({want}): video tower loaded; dropped text tower") for n in report.notes)


@pytest.mark.parametrize(("frames", "size"), [(4, 32), (1, 32), (2, 48)])
def test_temporal_and_spatial_tables_resize_as_for_the_dual_encoder(frames: int, size: int) -> None:
    """AVION's 2-frame file into 4 frames (linear in time) / 1 frame (first frame) / 48 px (bicubic
    spatial table): the classifier's features equal the dual encoder's built at that size from the
    same file (clip.weights' resizing)."""
    src = reference_layout(dual_encoder().state_dict(), "avion")
    de = create_model("clip_vit_test_tiny", num_frames=frames, img_size=size).eval()
    load_weights(de, src)
    model = create_model("vit_clip_test_tiny", num_frames=frames, img_size=size).eval()
    report = load_weights(model, src)
    x = clip(frames, size)
    torch.testing.assert_close(features(model, x), pre_projection(de, x), rtol=0, atol=0)
    if frames == 1:  # no temporal table in a one-frame model
        assert report.unexpected == ["visual.temporal_embedding"]
    else:
        assert report.resized == (["temporal_embed"] if frames != 2 else ["pos_embed"])


def test_openai_file_without_temporal_embedding_starts_it_at_zeros() -> None:
    ref = reference_layout(dual_encoder().state_dict(), "clip")
    del ref["visual.temporal_embedding"]
    model = create_model("vit_clip_test_tiny")
    report = load_weights(model, ref)
    assert "temporal_embed" in report.fresh and not report.missing
    assert torch.equal(model.temporal_embed, torch.zeros_like(model.temporal_embed))


def test_classifier_checkpoint_reloads_as_our_own_format() -> None:
    """A fine-tuned vit_clip model (fused q/k/v bias, linear patch weight) is ``avion_ds``, not timm."""
    torch.manual_seed(0)
    src = create_model("vit_clip_test_tiny", num_classes=5).eval()
    dst = create_model("vit_clip_test_tiny", num_classes=5).eval()
    report = load_weights(dst, src.state_dict(), strict=True)
    assert report.format == "avion_ds"
    x = clip()
    with torch.no_grad():
        assert torch.equal(dst(x), src(x))


def test_unset_pool_and_pos_embed_keep_each_models_own_layout() -> None:
    base = build_recipe({"data": {"dataset": "kinetics"}})  # the default recipe: vit_base_patch16_224
    assert (base.model.name, base.model.pool, base.model.pos_embed) == ("vit_base_patch16_224", None, None)
    kw = model_kwargs(base)
    assert "pool" not in kw and "pos_embed" not in kw
    arch = registered_arch(base.model.name, **kw)
    assert (arch.pool, arch.pos_embed) == ("mean", "sincos")
    with torch.device("meta"):
        vit = create_model(base.model.name, **kw)
    assert (
        isinstance(vit.fc_norm, torch.nn.LayerNorm)
        and vit.cls_token is None
        and "pos_embed" in dict(vit.named_buffers())
    )
    ident = model_identity(base)  # what run.json of existing runs holds: resume stays possible
    assert (ident["pool"], ident["pos_embed"]) == ("mean", "sincos")
    clip_recipe = build_recipe({"model": {"name": "vit_clip_test_tiny"}, "data": {"dataset": "kinetics"}})
    ident = model_identity(clip_recipe)
    assert (ident["pool"], ident["pos_embed"]) == ("cls", "clip")
    set_recipe = build_recipe({"model": {"pool": "cls", "pos_embed": "learned"}, "data": {"dataset": "kinetics"}})
    assert {k: model_kwargs(set_recipe)[k] for k in ("pool", "pos_embed")} == {"pool": "cls", "pos_embed": "learned"}
    assert (model_identity(set_recipe)["pool"], model_identity(set_recipe)["pos_embed"]) == ("cls", "learned")
    for name, want in (("vit_test_tiny", ("mean", "sincos")), ("vit_clip_test_tiny", ("cls", "clip"))):
        built = create_model_from_config(ModelConfig(name=name), num_frames=2, img_size=32)
        assert (built.arch.pool, built.arch.pos_embed) == want
    with pytest.raises(ConfigError, match=r"model\.pos_embed='rope' is not one of null \(the model's own\), sincos"):
        build_recipe({"model": {"pos_embed": "rope"}, "data": {"dataset": "kinetics"}})


@pytest.mark.parametrize("suffix", [".safetensors", ".pt"])
def test_finetune_task_builds_the_classifier_from_a_saved_dual_encoder(tmp_path: Path, suffix: str) -> None:
    de = dual_encoder()
    path = tmp_path / f"dual{suffix}"
    if suffix == ".safetensors":
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in de.state_dict().items()}, str(path))
    else:
        torch.save({"module": de.state_dict(), "epoch": 3}, path)
    recipe = build_recipe(
        {
            "model": {"name": "vit_clip_test_tiny", "num_classes": 5, "pretrained": str(path)},
            "data": {"dataset": "kinetics", "num_frames": 2, "size": 32},
        }
    )
    task = FinetuneTask()
    summary = task.check_model(recipe)
    assert summary.grid == (2, 4, 4)
    model = task.build_model(recipe, run_dir=tmp_path / "run").eval()
    assert model.head.out_features == 5 and model.proj is None
    x = clip()
    assert torch.equal(features(model, x), pre_projection(de, x))
    report = json.loads((tmp_path / "run" / REPORT_NAME).read_text())
    assert report["format"] == "dual_encoder" and report["backbone_matched_fraction"] == 1.0
    assert "logit_scale" in report["dropped"] and report["fresh"] == ["head.weight", "head.bias"]


def test_load_and_report_line_says_what_was_dropped(tmp_path: Path) -> None:
    lines: list[str] = []
    path = tmp_path / "dual.pt"
    torch.save(dual_encoder().state_dict(), path)
    model = create_model("vit_clip_test_tiny")
    load_and_report(model, str(path), strict=True, trust=False, run_dir=None, is_main=True, log=lines.append)
    assert len(lines) == 1 and "backbone 100.0% of parameters matched" in lines[0]
    assert "dropped text tower (29 tensors), logit_scale, visual.proj" in lines[0]


def test_openai_torchscript_archive_gives_openclips_pre_projection_image_feature(tmp_path: Path) -> None:
    """OpenAI's released files are TorchScript archives: read without running them; with OpenAI's
    activation / eps and one frame the classifier's feature is OpenCLIP's image feature before ``proj``."""
    pytest.importorskip("open_clip")
    from tests.models.test_clip_weights import EXACT, tiny_open_clip

    ref = tiny_open_clip()
    path = tmp_path / "ViT-tiny.pt"
    with pytest.warns(Warning):  # torch.jit.script is deprecated; OpenAI's files were made with it
        torch.jit.save(torch.jit.script(ref), str(path))
    check_weights_source(str(path), trust=False)  # the train preflight lets the loader read it
    model = create_model("vit_clip_test_tiny", num_frames=1, **EXACT).eval()
    report = load_weights(model, str(path))
    assert report.format == "dual_encoder" and not report.missing and not report.unexpected
    assert "visual.proj" in report.dropped and "text_projection" in report.dropped
    ref.visual.proj = None  # OpenCLIP pools the class token after ln_post, then projects when proj is set
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(model.forward_features(x.unsqueeze(2)), ref.encode_image(x), rtol=0, atol=1e-5)
