"""`avion-ds export --format hf | open_clip | avion` round trips, checked with the other library itself:
a pretraining run as transformers' VideoMAEForPreTraining (same loss on the same mask), the processor
and class names of every Hugging Face directory, a dual encoder as OpenCLIP (same embeddings) and as
AVION's checkpoint_best.pt (same tensors back), and one-line refusals of formats that do not fit."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from avion_ds import cli
from avion_ds.config import recipe_from_dict, save_recipe
from avion_ds.config.normalization import MEAN_STD
from avion_ds.models import create_model, load_weights
from avion_ds.models.clip.export import save_open_clip, to_avion_checkpoint
from avion_ds.models.mae.hf import probe_mask
from avion_ds.storage.safe_load import load_checkpoint_file

transformers = pytest.importorskip("transformers")
open_clip = pytest.importorskip("open_clip")


def _randomised(name: str, **kw: Any) -> torch.nn.Module:
    """A tiny model with every parameter (norms, biases, tables) moved off its initial value."""
    torch.manual_seed(0)
    model = create_model(name, drop_path_rate=0.0, **kw).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return model


def _run(tmp_path: Path, recipe: dict, model: torch.nn.Module) -> Path:
    """A run directory as training leaves it (ZeRO-0 layout: recipe, module state, COMPLETE marker)."""
    run = tmp_path / "run"
    tag = run / "checkpoints" / "step_00000002"
    tag.mkdir(parents=True)
    save_recipe(recipe_from_dict({**recipe, "output_dir": str(run)}), run / "recipe.yaml")
    (run / "ds_config.json").write_text('{"zero_optimization": {"stage": 0}}')
    torch.save(
        {"module": {f"module.{k}": v for k, v in model.state_dict().items()}}, tag / "mp_rank_00_model_states.pt"
    )
    (tag / "COMPLETE.json").write_text('{"tag": "step_00000002"}')
    return run


def _export(run: Path, out: Path, fmt: str, capsys: pytest.CaptureFixture, *extra: str) -> tuple[int, str, list[str]]:
    rc = cli.main(["export", "--checkpoint", str(run), "--out", str(out), "--format", fmt, *extra])
    got = capsys.readouterr()
    return rc, got.out, [ln for ln in got.err.splitlines() if ln.strip()]


def _processor(out: Path) -> Any:
    return transformers.AutoImageProcessor.from_pretrained(str(out))


def test_pretraining_run_exports_as_videomae_for_pretraining(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    model = _randomised("pretrain_videomae_test_tiny")
    run = _run(
        tmp_path,
        {
            "task": "pretrain",
            "model": {"name": "pretrain_videomae_test_tiny"},
            "data": {"num_frames": 4, "size": 32, "dataset": "videos"},
        },
        model,
    )
    rc, out, err = _export(run, tmp_path / "hf", "hf", capsys)
    assert rc == 0, err
    assert "VideoMAEForPreTraining" in out and "|reconstruction loss difference|" in out and "step_00000002" in out
    hf = transformers.VideoMAEForPreTraining.from_pretrained(str(tmp_path / "hf")).eval()
    x = torch.randn(3, 3, 4, 32, 32, generator=torch.Generator().manual_seed(1))
    mask = probe_mask(3, model.num_tokens, seed=5)
    with torch.no_grad():
        ours, theirs = model(x, mask), hf(pixel_values=x.transpose(1, 2), bool_masked_pos=mask)
    # transformers' decoder norm uses eps 1e-5, ours 1e-6: equal to ~1e-6, not bit for bit
    torch.testing.assert_close(theirs.logits, ours.pred, rtol=1e-4, atol=1e-4)
    assert abs(float(theirs.loss) - float(ours.loss)) <= 1e-4 * float(ours.loss)
    proc = _processor(tmp_path / "hf")
    assert type(proc).__name__ == "VideoMAEImageProcessor" and proc.num_frames == 4
    assert proc.size == {"shortest_edge": 32} and proc.crop_size == {"height": 32, "width": 32}
    assert tuple(proc.image_mean) == MEAN_STD["imagenet"][0] and tuple(proc.image_std) == MEAN_STD["imagenet"][1]
    back = create_model("pretrain_videomae_test_tiny", pretrained=str(tmp_path / "hf"))  # and into ours again
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in back.state_dict().items())


def _epic_classes(folder: Path) -> tuple[list[str], list[str]]:
    verbs, nouns = ["take", "put-down", "open", "wash"], ["tap", "board:chopping", "cup"]
    for head, keys in (("verb", verbs), ("noun", nouns)):
        rows = "".join(f"{i},{k},1,x\n" for i, k in enumerate(keys))
        (folder / f"EPIC_100_{head}_classes.csv").write_text("id,key,instances,category\n" + rows)
    return verbs, nouns


@pytest.mark.parametrize("dataset", ["epic", "kinetics"])
def test_hf_directory_has_class_names_and_the_processor(
    tmp_path: Path, capsys: pytest.CaptureFixture, dataset: str
) -> None:
    data = {"num_frames": 4, "size": 32, "mean_std": "clip", "interpolation": "bicubic", "dataset": dataset}
    if dataset == "epic":
        _, names = _epic_classes(tmp_path)
        model_cfg: dict = {"heads": {"verb": 4, "noun": 3}}
        data["val_csv"] = str(tmp_path / "EPIC_100_validation.csv")
        extra = ("--head", "noun")
    else:
        names = ["abseiling", "air drumming", "yoga", "zumba", "juggling balls"]
        (tmp_path / "classes.txt").write_text("\n".join(names) + "\n")
        model_cfg, extra = {"num_classes": 5}, ()
        data["class_list"] = str(tmp_path / "classes.txt")
    model = _randomised("vit_test_tiny", **model_cfg)
    run = _run(tmp_path, {"model": {"name": "vit_test_tiny", **model_cfg}, "data": data}, model)
    rc, out, err = _export(run, tmp_path / "hf", "hf", capsys, *extra)
    assert rc == 0, err
    assert "labels from" in out and "preprocessor_config.json: 32 px, 4 frames, mean/std clip" in out
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["id2label"] == {str(i): n for i, n in enumerate(names)}
    assert config["label2id"] == {n: i for i, n in enumerate(names)}
    proc = _processor(tmp_path / "hf")
    assert proc.num_frames == 4 and proc.resample == 3 and proc.crop_size == {"height": 32, "width": 32}
    assert tuple(proc.image_mean) == MEAN_STD["clip"][0] and tuple(proc.image_std) == MEAN_STD["clip"][1]
    hf = transformers.VideoMAEForVideoClassification.from_pretrained(str(tmp_path / "hf"))
    assert hf.config.id2label[1] == names[1]


def _video_text(frames: int) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(2)
    tokens = torch.randint(1, 49000, (2, 77))
    tokens[:, 10] = 49407  # end of text
    return torch.randn(2, 3, frames, 32, 32), tokens


def _equal_tensors(a: torch.nn.Module, b: torch.nn.Module) -> None:
    sb = b.state_dict()
    assert a.state_dict().keys() == sb.keys()
    for k, v in a.state_dict().items():
        assert torch.equal(v, sb[k]), k


@pytest.mark.parametrize("frames", [1, 2])
def test_open_clip_round_trip_and_embeddings(tmp_path: Path, frames: int) -> None:
    model = _randomised("clip_vit_test_tiny", num_frames=frames)
    written = save_open_clip(model, tmp_path / "oc")
    theirs = open_clip.create_model(f"local-dir:{tmp_path / 'oc'}").eval()  # config + weights of the export
    theirs.load_state_dict(load_file(str(written["weights"])), strict=True)  # the state dict as it is
    back = create_model("clip_vit_test_tiny", num_frames=frames)
    report = load_weights(back, str(tmp_path / "oc"), strict=True)  # ours -> OpenCLIP -> ours
    _equal_tensors(back, model)
    if frames == 1:  # OpenCLIP's image tower is a one-frame video tower
        assert "temporal" not in written and report.format == "clip"
        x, tokens = _video_text(1)
        with torch.no_grad():
            torch.testing.assert_close(theirs.encode_image(x[:, :, 0]), model.encode_video(x), rtol=0, atol=1e-5)
            torch.testing.assert_close(theirs.encode_text(tokens), model.encode_text(tokens), rtol=0, atol=1e-5)
        assert theirs.logit_scale.item() == model.logit_scale.item()
    else:  # the temporal embedding OpenCLIP has no place for: in its side file
        side = load_file(str(written["temporal"]))["visual.temporal_embedding"]
        assert torch.equal(side, model.visual.temporal_embed[0])
        assert any("temporal_embedding.safetensors" in n for n in report.notes)


def test_avion_checkpoint_round_trip_and_embeddings(tmp_path: Path) -> None:
    model = _randomised("clip_vit_test_tiny", num_frames=1)
    ckpt = to_avion_checkpoint(model)
    assert ckpt["args"].model == "clip_vit_test_tiny" and ckpt["args"].clip_length == 1
    # AVION's scripts: strip module., then its CLIP names; as OpenCLIP's (AVION's remap, inverted)
    sd = {k.removeprefix("module."): v for k, v in ckpt["state_dict"].items()}
    assert "visual.image_projection" in sd and "textual.text_projection" in sd
    oc = {("visual.proj" if k == "visual.image_projection" else k.removeprefix("textual.")): v for k, v in sd.items()}
    theirs = open_clip.create_model(f"local-dir:{save_open_clip(model, tmp_path / 'oc')['config'].parent}").eval()
    theirs.load_state_dict(oc, strict=True)
    x, tokens = _video_text(1)
    with torch.no_grad():
        torch.testing.assert_close(theirs.encode_image(x[:, :, 0]), model.encode_video(x), rtol=0, atol=1e-5)
        torch.testing.assert_close(theirs.encode_text(tokens), model.encode_text(tokens), rtol=0, atol=1e-5)


def test_cli_dual_encoder_to_open_clip_and_avion_and_back(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    model = _randomised("clip_vit_test_tiny", num_frames=2)
    recipe = {"task": "contrastive", "model": {"name": "clip_vit_test_tiny"}, "data": {"num_frames": 2, "size": 32}}
    run = _run(tmp_path, {**recipe, "data": {**recipe["data"], "dataset": "ego4d"}}, model)
    rc, out, err = _export(run, tmp_path / "oc", "open_clip", capsys)
    assert rc == 0, err
    assert f"open_clip.create_model('local-dir:{tmp_path / 'oc'}')" in out
    assert f"kept in {tmp_path / 'oc' / 'temporal_embedding.safetensors'}" in out
    rc, out, err = _export(run, tmp_path / "checkpoint_best.pt", "avion", capsys)
    assert rc == 0, err
    assert "AVION checkpoint_best.pt layout" in out and "clip_length=2" in out
    ckpt = load_checkpoint_file(tmp_path / "checkpoint_best.pt", False)  # the safe loader reads it (Namespace args)
    assert ckpt["args"].clip_length == 2 and all(k.startswith("module.") for k in ckpt["state_dict"])
    assert ckpt["state_dict"]["module.visual.temporal_embedding"].shape == (2, 64)
    for source in (tmp_path / "oc", tmp_path / "checkpoint_best.pt"):
        back = create_model("clip_vit_test_tiny", num_frames=2)
        load_weights(back, str(source), strict=True)
        _equal_tensors(back, model)


def test_formats_that_do_not_fit_the_model_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    classifier = {"model": {"name": "vit_test_tiny", "num_classes": 3}, "data": {"dataset": "kinetics"}}
    vit = _run(tmp_path / "a", classifier, _randomised("vit_test_tiny", num_classes=3))
    clip = {"task": "contrastive", "model": {"name": "clip_vit_test_tiny"}}
    dual = _run(
        tmp_path / "b",
        {**clip, "data": {"num_frames": 2, "size": 32, "dataset": "ego4d"}},
        _randomised("clip_vit_test_tiny"),
    )
    cases = [
        (vit, "open_clip", (), "vit_test_tiny is a video classifier; it exports with --format safetensors or hf"),
        (vit, "avion", (), "--format safetensors or hf"),
        (
            dual,
            "hf",
            (),
            "clip_vit_test_tiny is a video-text dual encoder; it exports with --format safetensors or open_clip or avion",
        ),
        (dual, "open_clip", ("--head", "verb"), "--head verb: only --format hf"),
    ]
    for run, fmt, extra, want in cases:
        rc, _, err = _export(run, tmp_path / f"out_{fmt}", fmt, capsys, *extra)
        assert rc == 2 and len(err) == 1 and want in err[0], (fmt, err)
        assert err[0].startswith("avion-ds export: error:")
    # what the target's architecture cannot run: AVION's towers are exact GELU
    with pytest.raises(ValueError, match=r"act='quick_gelu': AVION's towers run exact GELU"):
        to_avion_checkpoint(create_model("clip_vit_test_tiny", act="quick_gelu"))
