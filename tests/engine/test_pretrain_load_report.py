"""Starting masked pretraining from ``model.pretrained`` is reported like every other load (one line,
``pretrained_report.json``, the coverage check), and a Hugging Face config's ``layer_norm_eps`` is not
passed over: the model built from the file takes it, a model built otherwise names the difference."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from avion_ds.config import ConfigError, recipe_from_dict
from avion_ds.models import create_model, load_weights
from avion_ds.models.mae.hf import save_hf_pretraining
from avion_ds.models.weights.loading import REPORT_NAME
from avion_ds.tasks.pretrain.task import PretrainTask

transformers = pytest.importorskip("transformers")


def _recipe(source: Path, **model: object) -> object:
    return recipe_from_dict(
        {
            "task": "pretrain",
            "model": {"name": "pretrain_videomae_test_tiny", "pretrained": str(source), **model},
            "data": {"num_frames": 4, "size": 32, "dataset": "videos"},
        }
    )


def _hf_dir(tmp_path: Path, eps: float) -> tuple[torch.nn.Module, Path]:
    """A Hugging Face VideoMAEForPreTraining directory whose config.json says ``layer_norm_eps=eps``."""
    torch.manual_seed(0)
    src = create_model("pretrain_videomae_test_tiny", decoder_depth=2)  # another decoder depth than registered
    out = tmp_path / "hf"
    save_hf_pretraining(src, out)
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**config, "layer_norm_eps": eps}))
    return src, out


def test_pretraining_start_prints_the_load_line_and_writes_the_report(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    src, hf = _hf_dir(tmp_path, 1e-6)
    run = tmp_path / "run"
    model = PretrainTask().build_model(_recipe(hf), run_dir=run)
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("pretrained ")]
    assert len(lines) == 1 and f"pretrained {hf}: format hf (pretraining), backbone 100.0% of parameters" in lines[0]
    report = json.loads((run / REPORT_NAME).read_text())
    assert report["format"] == "hf (pretraining)" and report["backbone_matched_fraction"] == 1.0
    assert report["missing"] == [] and report["unexpected"] == []
    assert model.arch.decoder_depth == 2  # the decoder's size still comes from the file
    assert all(torch.equal(v, src.state_dict()[k]) for k, v in model.state_dict().items())


def test_pretraining_start_from_a_wrong_file_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "vit.pt"
    torch.save(create_model("vit_test_tiny").state_dict(), path)  # a classifier, not a pretraining model
    with pytest.raises(ConfigError, match=r"model.pretrained=.*vit.pt: not a VideoMAE pretraining checkpoint") as info:
        PretrainTask().build_model(_recipe(path), run_dir=tmp_path / "run")
    assert "\n" not in str(info.value)


def test_hugging_face_layer_norm_eps_is_taken_or_named(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    _, hf = _hf_dir(tmp_path, 1e-12)
    # built from the file (create_model, the pretraining task): the config's eps
    for model in (
        create_model("pretrain_videomae_test_tiny", pretrained=str(hf)),
        PretrainTask().build_model(_recipe(hf), run_dir=tmp_path / "run"),
    ):
        assert model.arch.encoder.norm_eps == 1e-12
        assert model.encoder.blocks[0].norm1.eps == model.decoder.blocks[0].norm2.eps == 1e-12
    report = json.loads((tmp_path / "run" / REPORT_NAME).read_text())
    assert not any("layer_norm_eps" in n for n in report["notes"])
    # a model built with its own eps keeps it, and the load report names the difference
    own = create_model("pretrain_videomae_test_tiny", decoder_depth=2)
    report = load_weights(own, str(hf), strict=True)
    assert own.encoder.blocks[0].norm1.eps == 1e-6
    assert any("config.json layer_norm_eps=1e-12 differs from the model's norm_eps=1e-06" in n for n in report.notes)
    assert "layer_norm_eps=1e-12" in report.summary()


def test_classifier_load_names_a_hugging_face_eps_difference(tmp_path: Path) -> None:
    """A video ViT classifier loading a Hugging Face directory whose eps is not its own says so in the report."""
    _, hf = _hf_dir(tmp_path, 1e-12)
    report = load_weights(create_model("vit_test_tiny", num_classes=3), str(hf))
    assert any("config.json layer_norm_eps=1e-12 differs from the model's norm_eps=1e-06" in n for n in report.notes)
    _, same = _hf_dir(tmp_path / "same", 1e-6)
    assert not any("layer_norm_eps" in n for n in load_weights(create_model("vit_test_tiny"), str(same)).notes)
