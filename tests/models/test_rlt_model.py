"""Run-length tokenization in the video ViT (``rlt_threshold``): a clip without static patches gives the
model's output without RLT, a packed batch of clips with different kept counts gives each clip's output
alone and the dense blocks' output on the kept tokens, gradients reach every parameter, and the recipe key
reaches the fine-tuning model and the dual encoder's video tower (refused where masking hides patches)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from avion_ds.config import ConfigError
from avion_ds.models import create_model
from avion_ds.models.rlt import run_lengths
from avion_ds.tasks import load_recipe
from tests.models.test_rlt import normalised, piecewise_static

GEOMETRY = {"num_frames": 8, "img_size": 32}  # 4 tubelets of 2x2 patches: 16 patch tokens
# features of unit scale; packed (nested-tensor) attention vs dense differs by float32 summation order only
# (measured: at most 3.6e-7 on features of magnitude 2)
TOL = {"rtol": 1e-5, "atol": 1e-5}


def _pair(name: str, **kw) -> tuple[torch.nn.Module, torch.nn.Module]:
    """The model without RLT and the same weights with it (its length table random, so runs matter)."""
    torch.manual_seed(0)
    plain = create_model(name, **GEOMETRY, **kw).eval()
    rlt = create_model(name, **GEOMETRY, rlt_threshold=0.1, **kw).eval()
    missing, unexpected = rlt.load_state_dict(plain.state_dict(), strict=False)
    assert not unexpected and all("rlt_embed" in k for k in missing), (missing, unexpected)
    return plain, rlt


def _video(model: torch.nn.Module) -> torch.nn.Module:
    return getattr(model, "visual", model)


def _three_kinds() -> torch.Tensor:
    """uint8 clips (3, 3, 8, 32, 32): nothing static, static parts, static after the first frame."""
    frames = piecewise_static(3, 8, seed=4, p_static=0.85)
    frames[0] = torch.randint(0, 256, frames[0].shape, generator=torch.Generator().manual_seed(3), dtype=torch.uint8)
    frames[2] = frames[2, :, :1].expand_as(frames[2])
    return frames


def _randomise_lengths(model: torch.nn.Module) -> None:
    with torch.no_grad():
        _video(model).rlt_embed.table.weight.normal_(std=0.5)


@pytest.mark.parametrize("name", ["vit_test_tiny", "clip_vit_test_tiny"])  # mean pooling; CLIP layout, cls
def test_a_clip_without_static_patches_gives_the_output_without_rlt(name: str) -> None:
    plain, rlt = _pair(name, **({"num_classes": 5} if name.startswith("vit") else {}))
    x = torch.randn(2, 3, 8, 32, 32)
    assert bool(_video(rlt).rlt_keep(x).all())  # nothing static: every patch kept, runs of 1
    with torch.no_grad():
        want, got = _video(plain).forward_features(x), _video(rlt).forward_features(x)
    torch.testing.assert_close(got, want, **TOL)


@pytest.mark.parametrize("name", ["vit_test_tiny", "clip_vit_test_tiny"])
def test_a_packed_batch_equals_each_clip_alone(name: str) -> None:
    _, rlt = _pair(name)
    _randomise_lengths(rlt)
    video = _video(rlt)
    x = normalised(_three_kinds())
    kept = video.rlt_keep(x).flatten(1).sum(1)
    assert len(set(kept.tolist())) == 3, kept  # every patch, some, the first tubelet's only
    with torch.no_grad():
        batch = video.forward_features(x)
        alone = torch.cat([video.forward_features(x[i : i + 1]) for i in range(3)])
    torch.testing.assert_close(batch, alone, **TOL)


def test_the_packed_model_equals_the_dense_blocks_on_the_kept_tokens() -> None:
    """Each clip: its kept tokens (own position + run-length embedding) through the dense blocks, mean, head."""
    _, model = _pair("vit_test_tiny", num_classes=5)
    _randomise_lengths(model)
    x = normalised(piecewise_static(3, 8, seed=5, p_static=0.85))
    keep = model.rlt_keep(x)
    with torch.no_grad():
        got = model.forward_features(x)
        tokens = model.patch_embed(x) + model.patch_positions()
        tokens = tokens + model.rlt_embed.table(run_lengths(keep).flatten(1))
        for i in range(3):
            t = tokens[i][keep[i].flatten()].unsqueeze(0)
            for blk in model.blocks:
                t = blk(t)
            want = model.fc_norm(t.mean(dim=1))
            torch.testing.assert_close(got[i : i + 1], want, **TOL)


def test_an_explicit_keep_mask_is_used_and_checked() -> None:
    _, model = _pair("vit_test_tiny", num_classes=5)
    frames = piecewise_static(2, 8, seed=6, p_static=0.85)
    x = normalised(frames)
    keep = model.rlt_keep(frames)  # from the uint8 clip: the same mask
    assert torch.equal(keep, model.rlt_keep(x))
    with torch.no_grad():
        torch.testing.assert_close(model(x, keep), model(x), rtol=0, atol=0)
        seen = model.forward_features(x, torch.ones_like(keep))
        assert not torch.allclose(seen, model.forward_features(x), **TOL)  # the mask decides what is seen
    with pytest.raises(ValueError, match="keep expected bool"):
        model(x, keep[:, 1:])
    plain = create_model("vit_test_tiny", **GEOMETRY)
    with pytest.raises(ValueError, match="rlt_threshold=0"):
        plain(x, keep)


@pytest.mark.parametrize("name", ["vit_test_tiny", "clip_vit_test_tiny"])
def test_gradients_reach_every_parameter_in_training(name: str) -> None:
    torch.manual_seed(1)
    model = create_model(name, **GEOMETRY, rlt_threshold=0.1, drop_path_rate=0.5).train()
    video = _video(model)
    x = normalised(piecewise_static(3, 8, seed=7, p_static=0.85))
    assert int(run_lengths(video.rlt_keep(x)).max()) > 1
    out = video(x)
    out.float().pow(2).mean().backward()
    missing = [n for n, p in video.named_parameters() if p.requires_grad and p.grad is None]
    assert not missing, missing
    assert float(video.rlt_embed.table.weight.grad.abs().sum()) > 0  # the run lengths are learned
    assert float(video.patch_embed.proj.weight.grad.abs().sum()) > 0


_FINETUNE = ["model.name=vit_test_tiny", "data.dataset=kinetics", "model.num_classes=5", "data.num_frames=4"]
_FINETUNE += ["data.size=32"]
_CLIP = ["task=contrastive", "model.name=clip_vit_test_tiny"]


def test_the_recipe_key_reaches_the_models() -> None:
    from avion_ds.tasks.contrastive.task import _encoder_kwargs
    from avion_ds.tasks.finetune.task import model_kwargs

    assert "rlt_threshold" not in model_kwargs(load_recipe(None, _FINETUNE))  # off: the registered model exactly
    kw = model_kwargs(load_recipe(None, [*_FINETUNE, "model.rlt_threshold=0.1"]))
    assert kw["rlt_threshold"] == 0.1
    assert create_model("vit_test_tiny", **kw).arch.rlt_threshold == 0.1
    clip = _encoder_kwargs(load_recipe(None, [*_CLIP, "model.rlt_threshold=0.1"]))
    assert create_model("clip_vit_test_tiny", **clip).visual.rlt_embed is not None


@pytest.mark.parametrize(
    "sets,message",
    [
        (["model.rlt_threshold=1.0"], r"^model.rlt_threshold=1.0: expected a number in \[0, 1\)"),
        (["model.rlt_threshold=-0.1"], r"^model.rlt_threshold=-0.1: expected a number in \[0, 1\)"),
        (["model.rlt_threshold=0.1", "model.attn_backend=eager"], r"^model.rlt_threshold=0.1 with .*'eager'"),
        (["model.rlt_threshold=0.1", "model.token_merge=2"], r"^model.rlt_threshold=0.1 with model.token_merge=2"),
        (["model.rlt_threshold=0.1", "model.patch_dropout=0.5"], r"^model.rlt_threshold=0.1 with model.patch_dr"),
        (["model.rlt_threshold=0.1", "model.compile=true"], r"^model.rlt_threshold=0.1 with model.compile=true"),
    ],
)
def test_bad_combinations_are_one_config_error(sets: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_recipe(None, [*_FINETUNE, *sets])


def test_masked_pretraining_refuses_rlt() -> None:
    with pytest.raises(ConfigError, match=r"^model.rlt_threshold=0.1: masked pretraining already hides"):
        load_recipe(None, ["task=pretrain", "model.name=pretrain_videomae_test_tiny", "model.rlt_threshold=0.1"])


def test_the_backend_for_packed_clips(monkeypatch: pytest.MonkeyPatch) -> None:
    from avion_ds.models import attention

    assert attention.resolve_backend("auto", "cpu", torch.float32, 32, packed=True) == "sdpa"
    said = attention.describe_backend("auto", "cpu", torch.float32, 32, packed=True)  # the start-up line's
    assert said == "sdpa on packed clips (clip by clip; run-length tokenization)"
    with pytest.raises(RuntimeError, match="eager attention has no packed form"):
        attention.resolve_backend("eager", "cpu", torch.float32, 32, packed=True)
    with pytest.raises(ValueError, match="rlt_threshold=0.1: attn_backend=.eager. has no packed form"):
        create_model("vit_test_tiny", **GEOMETRY, rlt_threshold=0.1, attn_backend="eager")
    monkeypatch.setattr(attention, "flash_available", lambda: True)
    monkeypatch.setattr(attention, "flash_varlen_available", lambda: False)
    with pytest.raises(RuntimeError, match="no varlen kernel"):
        attention.check_backend_request("flash", packed=True)


@pytest.mark.parametrize("checkpointing", [False, True])
def test_the_memory_estimate_is_the_worst_case(checkpointing: bool) -> None:
    """A clip with nothing static (every patch kept) saves what the estimate says, to 1 %; more than the
    same model without RLT (its mask, run lengths and packed layout)."""
    from avion_ds.memory.activations import SavedTensorTracker
    from avion_ds.memory.estimate import activation_bytes_per_clip, arch_info
    from avion_ds.models.activation_checkpointing import apply_activation_checkpointing

    model = create_model("vit_test_tiny", **GEOMETRY, rlt_threshold=0.1).train()
    if checkpointing:
        apply_activation_checkpointing(model, impl="torch")
    info = arch_info(model)
    assert info.rlt
    with SavedTensorTracker(model) as tracker:
        model(torch.randn(1, 3, 8, 32, 32))
    worst = activation_bytes_per_clip(info, 8, 32, torch.float32, checkpointing=checkpointing)
    assert 0.99 * worst <= tracker.stats.bytes <= worst, (tracker.stats.bytes, worst)
    plain = arch_info(create_model("vit_test_tiny", **GEOMETRY))
    assert worst > activation_bytes_per_clip(plain, 8, 32, torch.float32, checkpointing=checkpointing)


@pytest.mark.parametrize("policy", ["full", "selective"])
def test_activation_checkpointing_gives_the_same_step(policy: str) -> None:
    from avion_ds.models.activation_checkpointing import apply_activation_checkpointing

    torch.manual_seed(2)
    model = create_model("vit_test_tiny", **GEOMETRY, rlt_threshold=0.1).train()
    x = normalised(_three_kinds())
    want = model(x)
    want.sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    apply_activation_checkpointing(model, impl="torch", policy=policy)
    got = model(x)
    got.sum().backward()
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad, grads[n], rtol=1e-6, atol=1e-9, msg=n)


def test_the_plan_of_a_recipe_with_rlt_is_its_worst_case(tmp_path) -> None:
    """``avion-ds plan --config``: a recipe with RLT is planned at the worst case (more memory than without),
    and the plan never adds merging or patch dropout to it (neither combines with RLT)."""
    import argparse

    from avion_ds.cli.plan import token_settings
    from avion_ds.memory.plan import Hardware, Request, plan
    from avion_ds.memory.plan_tokens import plan_fewer_tokens

    recipe = tmp_path / "rlt.yaml"
    recipe.write_text("model: {name: vit_test_tiny, rlt_threshold: 0.1, num_classes: 5}\ndata: {dataset: kinetics}\n")
    args = argparse.Namespace(config=str(recipe), may_merge_tokens=True, may_drop_patches=True)
    settings = token_settings(args)
    assert settings["rlt"] is True
    req = Request("vit_test_tiny", 16, 64, 2**40, 1, 1, None, None, "fp32", None, 8, Hardware())
    plain = min(c.peak for c in plan(req)[0])
    worst = min(c.peak for c in plan_fewer_tokens(req, **settings)[0])
    assert worst > plain
    tight = dataclasses.replace(req, gpu_mem=1)  # nothing fits: still no merging or dropout
    cands, facts = plan_fewer_tokens(tight, **settings)
    assert not any(c.fits for c in cands) and not facts.get("merged_by_planner") and not facts.get("dropped_by_planner")


def test_exports_without_run_lengths_are_refused_in_one_line() -> None:
    """Hugging Face VideoMAE, OpenCLIP and AVION have no run-length embedding: refused, not silently lost."""
    from avion_ds.models.clip.export import check_clip_exportable
    from avion_ds.models.vit.hf import check_exportable

    with pytest.raises(ValueError, match=r"^rlt_threshold=0.1: Hugging Face VideoMAE has no run-length"):
        check_exportable(create_model("vit_test_tiny", **GEOMETRY, rlt_threshold=0.1))
    with pytest.raises(ValueError, match=r"^video tower rlt_threshold=0.1: CLIP has no run-length"):
        check_clip_exportable(create_model("clip_vit_test_tiny", **GEOMETRY, rlt_threshold=0.1))


def test_preflight_refuses_flash_without_its_varlen_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """A flash-attn that imports but has no varlen kernel cannot run packed clips: one line at start-up."""
    from avion_ds.engine.preflight import check_runtime
    from avion_ds.models import attention

    recipe = load_recipe(None, [*_FINETUNE, "model.rlt_threshold=0.1", "model.attn_backend=flash"])
    monkeypatch.setattr(attention, "flash_available", lambda: True)
    monkeypatch.setattr(attention, "flash_varlen_available", lambda: False)
    attention.resolve_cached.cache_clear()
    try:
        with pytest.raises(ConfigError, match=r"^model.attn_backend='flash' cannot run here .*no varlen kernel"):
            check_runtime(recipe, "bf16", "cpu")
    finally:
        attention.resolve_cached.cache_clear()


@pytest.mark.parametrize("name", ["vit_test_tiny", "clip_vit_test_tiny"])
def test_weights_without_rlt_load_strictly_with_the_length_table_fresh(name: str, tmp_path) -> None:
    """RLT without retraining (``avion-ds eval --set model.rlt_threshold=...`` on a run trained without
    it): the checkpoint has no run-length table; a strict load keeps the model's zeros and says so."""
    from safetensors.torch import save_file

    from avion_ds.models.weights.loading import load_weights

    torch.manual_seed(0)
    plain = create_model(name, **GEOMETRY).eval()
    path = tmp_path / "plain.safetensors"
    save_file({k: v.contiguous() for k, v in plain.state_dict().items()}, str(path))
    rlt = create_model(name, **GEOMETRY, rlt_threshold=0.1).eval()
    report = load_weights(rlt, path, strict=True)
    table = [k for k in rlt.state_dict() if "rlt_embed" in k]
    assert table and set(table) <= set(report.fresh) and not report.missing, report.summary()
    assert all(float(rlt.state_dict()[k].abs().sum()) == 0.0 for k in table)
    x = torch.randn(2, 3, 8, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(_video(rlt).forward_features(x), _video(plain).forward_features(x), **TOL)
