"""The load report: one coverage definition (checked against a count written out here), every format's
normalisation named, and a recipe whose ``data.mean_std`` differs from the weights' own said in one line."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch

from avion_ds.config.normalization import MEAN_STD, mean_std_mismatch
from avion_ds.models import create_model, load_weights
from avion_ds.models.weights.hf_config import declared_mean_std
from avion_ds.models.weights.loading import REPORT_NAME, load_and_report
from avion_ds.tasks import build_recipe
from avion_ds.tasks.finetune.task import FinetuneTask
from tests.helpers.mae_layouts import to_hf as mae_to_hf
from tests.helpers.mae_layouts import to_official
from tests.models.convert import to_hf, to_videomae
from tests.models.test_video_tower import dual_encoder, reference_layout


def _expected_coverage(model: torch.nn.Module, loaded: set[str], fresh: set[str]) -> tuple[int, int]:
    """(matched, total) written out: parameters outside ``head.`` / ``heads.`` and outside ``fresh``;
    matched are those whose name the checkpoint filled."""
    total = matched = 0
    for name, p in model.named_parameters():
        if name.split(".")[0] in ("head", "heads") or name in fresh:
            continue
        total += p.numel()
        matched += p.numel() if name in loaded else 0
    return matched, total


def test_coverage_counts_the_backbone_the_checkpoint_filled(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    src = create_model("vit_test_tiny", num_classes=3).state_dict()
    kept = {k: v for k, v in src.items() if not k.startswith(("blocks.1.", "head."))}
    model = create_model("vit_test_tiny", num_classes=3)
    with caplog.at_level(logging.ERROR):
        report = load_weights(model, kept)
    assert (report.matched, report.total) == _expected_coverage(model, set(kept), set())
    assert 0 < report.coverage < 0.9 and report.absent[0].startswith("blocks.1.")
    assert f"matched {100 * report.coverage:.1f}% of VideoViT's backbone" in caplog.text  # the same figure logged
    lines: list[str] = []
    load_and_report(
        create_model("vit_test_tiny", num_classes=3),
        kept,
        strict=False,
        trust=False,
        run_dir=tmp_path,
        is_main=True,
        log=lines.append,
    )
    saved = json.loads((tmp_path / REPORT_NAME).read_text())
    assert saved["backbone_matched_fraction"] == report.coverage and saved["backbone_params"] == report.total
    assert f"backbone {100 * report.coverage:.1f}% of parameters matched" in lines[0]


def test_fresh_parameters_are_outside_the_coverage() -> None:
    """A dual encoder started from CLIP with fresh projections: those and the temporal embedding the file
    lacks are ``fresh``, neither matched nor missing; everything else loaded, so the coverage is whole."""
    sd = reference_layout(dual_encoder().state_dict(), "clip")
    del sd["visual.temporal_embedding"]
    model = create_model("clip_vit_test_tiny", projection="fresh")
    report = load_weights(model, sd, strict=True)
    assert set(report.fresh) == {"visual.proj", "textual.proj", "logit_scale", "visual.temporal_embed"}
    loaded = {n for n, _ in model.named_parameters()} - set(report.fresh)
    assert (report.matched, report.total) == _expected_coverage(model, loaded, set(report.fresh))
    assert report.coverage == 1.0 and not report.absent


def _vit_sources() -> dict[str, tuple[object, str | None]]:
    from tests.models.test_pretrained import _timm_vit

    vit = create_model("vit_test_tiny")
    de = dual_encoder()
    return {
        "avion_ds": (vit.state_dict(), None),
        "videomae": (to_videomae(vit), "imagenet"),
        "hf": (to_hf(vit), "imagenet"),
        "timm": (_timm_vit().state_dict(), None),
        "dual_encoder avion": (reference_layout(de.state_dict(), "avion"), "openai"),
        "dual_encoder clip": (reference_layout(de.state_dict(), "clip"), "clip"),
        "dual_encoder avion_ds": (de.state_dict(), None),
    }


@pytest.mark.parametrize("fmt", list(_vit_sources()))
def test_each_classifier_format_names_its_normalisation(fmt: str) -> None:
    source, want = _vit_sources()[fmt]
    name = "vit_clip_test_tiny" if fmt.startswith("dual_encoder") else "vit_test_tiny"
    report = load_weights(create_model(name), source)
    assert report.format == fmt.split()[0] and report.mean_std == want
    assert (f"mean_std={want}" in report.summary()) == (want is not None)
    said = f"mean/std {want} (" if want else "mean/std: not stated by the weights' format"
    assert said in report.line("w.pt")


@pytest.mark.parametrize(("layout", "want"), [("clip", "clip"), ("avion", "openai"), ("avion_ds", None)])
def test_each_dual_encoder_format_names_its_normalisation(layout: str, want: str | None) -> None:
    sd = dual_encoder().state_dict()
    report = load_weights(
        create_model("clip_vit_test_tiny"), sd if layout == "avion_ds" else reference_layout(sd, layout)
    )
    assert report.format == layout and report.mean_std == want


@pytest.mark.parametrize(("layout", "want"), [("videomae", "imagenet"), ("hf", "imagenet"), ("avion_ds", None)])
def test_each_pretraining_format_names_its_normalisation(layout: str, want: str | None) -> None:
    src = create_model("pretrain_videomae_test_tiny")
    sd = {"videomae": to_official, "hf": mae_to_hf, "avion_ds": lambda m: m.state_dict()}[layout](src)
    report = load_weights(create_model("pretrain_videomae_test_tiny"), sd)
    assert report.format == f"{layout} (pretraining)" and report.mean_std == want


def test_mismatch_line_names_both_values_and_keeps_the_recipes() -> None:
    assert mean_std_mismatch("openai", "openai") is None and mean_std_mismatch("imagenet", None) is None
    line = mean_std_mismatch("imagenet", "openai")
    assert line is not None and "\n" not in line
    assert line.startswith("data.mean_std=imagenet but the pretrained weights were trained with openai")
    assert set(MEAN_STD) == {"imagenet", "clip", "openai"}


@pytest.mark.parametrize(("mean_std", "said"), [("imagenet", True), ("openai", False)])
def test_recipe_mean_std_differing_from_the_weights_is_said_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], mean_std: str, said: bool
) -> None:
    path = tmp_path / "avion.pt"
    torch.save(reference_layout(dual_encoder().state_dict(), "avion"), path)
    recipe = build_recipe(
        {
            "model": {"name": "vit_clip_test_tiny", "num_classes": 5, "pretrained": str(path)},
            "data": {"dataset": "kinetics", "num_frames": 2, "size": 32, "mean_std": mean_std},
        }
    )
    FinetuneTask().build_model(recipe, run_dir=tmp_path / "run")
    lines = capsys.readouterr().out.splitlines()
    mismatch = [ln for ln in lines if ln.startswith("data.mean_std=")]
    want = (
        "data.mean_std=imagenet but the pretrained weights were trained with openai (AVION's openai): frames "
        "are normalised with imagenet; set data.mean_std=openai to match them"
    )
    assert mismatch == ([want] if said else [])
    assert any("mean/std openai (AVION's openai" in ln for ln in lines)
    assert json.loads((tmp_path / "run" / REPORT_NAME).read_text())["mean_std"] == "openai"


def test_files_beside_the_weights_state_their_normalisation(tmp_path: Path) -> None:
    """A Hugging Face directory's preprocessor_config.json and a run directory's recipe.yaml name the
    statistics more precisely than the format: the report takes theirs and says so in a note."""
    (mean, std), hf_dir = MEAN_STD["openai"], tmp_path / "hf"
    hf_dir.mkdir()
    torch.save(to_hf(create_model("vit_test_tiny")), hf_dir / "pytorch_model.bin")
    (hf_dir / "preprocessor_config.json").write_text(json.dumps({"image_mean": mean, "image_std": std}))
    report = load_weights(create_model("vit_test_tiny"), hf_dir)
    assert report.format == "hf" and report.mean_std == "openai"
    assert "mean/std openai as stated beside the weights (the format's: imagenet)" in report.notes
    assert declared_mean_std(hf_dir / "pytorch_model.bin") == "openai"
    (hf_dir / "preprocessor_config.json").write_text(json.dumps({"image_mean": [0.5] * 3, "image_std": [0.5] * 3}))
    assert declared_mean_std(hf_dir) is None  # statistics of no row: the format's stand
    run = tmp_path / "run"
    run.mkdir()
    (run / "recipe.yaml").write_text("data:\n  mean_std: clip\n")
    assert declared_mean_std(run) == "clip" and declared_mean_std({"w": torch.zeros(1)}) is None
    assert declared_mean_std(run / "weights.safetensors") is None  # a file: only a processor config beside it


def test_partitioned_load_reads_the_same_report(
    one_rank: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ZeRO-3 partitioned model through the same entry point: a same-size safetensors file read from its
    header, the coverage on logical sizes and the normalisation stated beside it, as a plain load gives."""
    import torch.nn.functional as F
    from safetensors.torch import save_file

    from avion_ds.distributed import dist
    from avion_ds.models.partition import is_partitioned_model, partitioned_construction

    monkeypatch.setattr(F, "linear", F.linear)  # zero.Init leaves its own linear in place; torch's back after
    dist.init()
    sd = create_model("vit_test_tiny", num_classes=3).state_dict()
    path = tmp_path / "model.safetensors"
    save_file({k: v.contiguous() for k, v in sd.items() if not k.startswith("blocks.1.")}, str(path))
    mean, std = MEAN_STD["clip"]
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({"image_mean": mean, "image_std": std}))
    plain = load_weights(create_model("vit_test_tiny", num_classes=3), path)
    with partitioned_construction({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3}}):
        part = create_model("vit_test_tiny", num_classes=3)
    assert is_partitioned_model(part)
    report = load_weights(part, path)
    assert report.summary() == plain.summary() and report.mean_std == "clip"
    assert (report.matched, report.total) == (plain.matched, plain.total) and report.coverage < 0.9
