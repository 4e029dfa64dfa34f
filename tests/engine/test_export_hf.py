"""`avion-ds export --format hf`: a VideoMAEForVideoClassification directory transformers loads with
the same logits (checked here with transformers itself, independently of the exporter's own check)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from avion_ds import cli
from avion_ds.config import recipe_from_dict, save_recipe
from avion_ds.models import create_model
from avion_ds.models.vit.hf import save_hf

transformers = pytest.importorskip("transformers")
X = torch.randn(2, 3, 4, 32, 32, generator=torch.Generator().manual_seed(3))


def _randomised(**kw: object) -> torch.nn.Module:
    torch.manual_seed(0)
    model = create_model("vit_test_tiny", drop_path_rate=0.0, **kw).eval()
    with torch.no_grad():  # no zero-initialised (trivial) parameter left: norms, biases and heads all random
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return model


def _hf_logits(path: Path) -> torch.Tensor:
    hf = transformers.VideoMAEForVideoClassification.from_pretrained(str(path)).eval()
    with torch.no_grad():
        return hf(pixel_values=X.permute(0, 2, 1, 3, 4)).logits


def test_single_head_round_trip(tmp_path: Path) -> None:
    model = _randomised(num_classes=5)
    reported = save_hf(model, tmp_path / "hf")
    cfg = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert cfg["architectures"] == ["VideoMAEForVideoClassification"] and len(cfg["id2label"]) == 5
    with torch.no_grad():
        ours = model(X)
    # transformers' fc_norm uses LayerNorm eps 1e-5 (fixed), ours 1e-6: equal to ~1e-5, not bit for bit
    torch.testing.assert_close(_hf_logits(tmp_path / "hf"), ours, atol=1e-4, rtol=1e-4)
    assert reported < 1e-4


def test_multi_head_is_one_head_per_directory(tmp_path: Path) -> None:
    model = _randomised(heads={"verb": 4, "noun": 3})
    with pytest.raises(ValueError, match=r"2 heads \(verb, noun\).*--head verb"):
        save_hf(model, tmp_path / "both")
    save_hf(model, tmp_path / "noun", head="noun")
    with torch.no_grad():
        ours = model(X)["noun"]
    torch.testing.assert_close(_hf_logits(tmp_path / "noun"), ours, atol=1e-4, rtol=1e-4)


def _zero0_run(tmp_path: Path, model: torch.nn.Module) -> Path:
    """A run directory as training leaves it (ZeRO-0 layout: module state + COMPLETE marker)."""
    run = tmp_path / "run"
    tag = run / "checkpoints" / "step_00000004"
    tag.mkdir(parents=True)
    recipe = recipe_from_dict(
        {
            "model": {"name": "vit_test_tiny", "heads": {"verb": 4, "noun": 3}},
            "data": {"num_frames": 4, "size": 32},
            "output_dir": str(run),
        }
    )
    save_recipe(recipe, run / "recipe.yaml")
    (run / "ds_config.json").write_text('{"zero_optimization": {"stage": 0}}')
    torch.save(
        {"module": {f"module.{k}": v for k, v in model.state_dict().items()}}, tag / "mp_rank_00_model_states.pt"
    )
    (tag / "COMPLETE.json").write_text('{"tag": "step_00000004"}')
    return run


def test_cli_export_hf_from_a_run(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    model = _randomised(heads={"verb": 4, "noun": 3})
    run = _zero0_run(tmp_path, model)
    assert cli.main(["export", "--checkpoint", str(run), "--out", str(tmp_path / "hf"), "--format", "hf"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--head verb" in err[0] and "one classifier" in err[0]
    assert (
        cli.main(
            ["export", "--checkpoint", str(run), "--out", str(tmp_path / "hf"), "--format", "hf", "--head", "verb"]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "checkpoint step_00000004, head verb" in out and "max |logit difference|" in out
    with torch.no_grad():
        ours = model(X)["verb"]
    torch.testing.assert_close(_hf_logits(tmp_path / "hf"), ours, atol=1e-4, rtol=1e-4)
