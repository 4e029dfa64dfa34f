"""Pretrained loading is visible: summary line, pretrained_report.json, the backbone coverage check, and
the backends line; through `avion-ds train` a barely-mapping checkpoint stops with one line and exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from avion_ds.config import ConfigError
from avion_ds.models import create_model
from avion_ds.models.weights.loading import REPORT_NAME, load_and_report
from tests.helpers import REPO, launch, write_recipe


def _model() -> torch.nn.Module:
    return create_model("vit_test_tiny", heads={"verb": 4, "noun": 3})


def _without_block(sd: dict, block: int) -> dict:
    return {k: v for k, v in sd.items() if not k.startswith(f"blocks.{block}.")}


def test_full_match_logs_one_line_and_writes_report(tmp_path: Path) -> None:
    src = create_model("vit_test_tiny", num_classes=7)  # other head: dropped, backbone complete
    path = tmp_path / "w.pt"
    torch.save(src.state_dict(), path)
    lines: list[str] = []
    model = _model()
    load_and_report(
        model, str(path), strict=True, trust=False, run_dir=tmp_path / "run", is_main=True, log=lines.append
    )
    assert len(lines) == 1 and "\n" not in lines[0]
    assert f"pretrained {path}: format avion_ds, backbone 100.0% of parameters matched" in lines[0]
    report = json.loads((tmp_path / "run" / REPORT_NAME).read_text())
    assert report["backbone_matched_fraction"] == 1.0 and report["format"] == "avion_ds"
    assert sorted(report["missing"]) == sorted(k for k in model.state_dict() if k.startswith("heads."))
    torch.testing.assert_close(model.blocks[1].mlp.fc1.weight, src.blocks[1].mlp.fc1.weight)


def test_barely_mapping_checkpoint_is_refused_unless_not_strict(tmp_path: Path) -> None:
    sd = _without_block(create_model("vit_test_tiny").state_dict(), 1)  # half the blocks: ~50% of the backbone
    path = tmp_path / "half.pt"
    torch.save(sd, path)
    lines: list[str] = []
    with pytest.raises(
        ConfigError,
        match=r"only \d+\.\d% of the backbone parameters matched \(< 90%; first "
        r"missing: blocks\.1\.",
    ) as info:
        load_and_report(_model(), str(path), strict=True, trust=False, run_dir=tmp_path, is_main=True, log=lines.append)
    assert "\n" not in str(info.value)
    assert "first missing backbone keys: blocks.1." in lines[0]  # the summary still came first
    assert json.loads((tmp_path / REPORT_NAME).read_text())["backbone_matched_fraction"] < 0.9
    load_and_report(_model(), str(path), strict=False, trust=False, run_dir=None, is_main=False)  # allowed


class _Opaque:
    """Not on the allowlist (a pickled object of a user's class)."""


def test_unreadable_or_untrusted_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="model.pretrained=.*nope.pt: checkpoint not found"):
        load_and_report(_model(), str(tmp_path / "nope.pt"), strict=True, trust=False, run_dir=None, is_main=True)
    path = tmp_path / "odd.pth"
    torch.save({"model": _model().state_dict(), "extra": _Opaque()}, path)
    with pytest.raises(
        ConfigError,
        match=r"model.pretrained=.*odd.pth: checkpoint .* pickles Python objects that are "
        r"not weights \(.*_Opaque\).*--trust-checkpoint",
    ):
        load_and_report(_model(), str(path), strict=True, trust=False, run_dir=None, is_main=True)
    load_and_report(_model(), str(path), strict=True, trust=True, run_dir=None, is_main=False)  # opted in


@pytest.mark.multiprocess
def test_train_stops_on_a_barely_mapping_checkpoint(tiny_epic: dict, tmp_path: Path) -> None:
    """(A checkpoint that maps is shown with the backends line in test_accum_multirank.)"""
    half = tmp_path / "half.pt"
    torch.save(_without_block(create_model("vit_test_tiny", heads={"verb": 4, "noun": 3}).state_dict(), 1), half)
    run = tmp_path / "bad"
    recipe = write_recipe(tmp_path / "bad.yaml", tiny_epic, run, model={"pretrained": str(half)})
    proc = launch(
        ["--deepspeed_config", REPO / "ds_configs" / "zero0.json", "--config", recipe],
        nprocs=1,
        launcher="python",
        timeout=240,
    )
    err = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2, (proc.stdout + proc.stderr)[-3000:]
    assert "Traceback" not in proc.stderr
    assert "backbone parameters matched (< 90%" in err[-1] and err[-1].startswith("avion-ds train: error:")
    assert (run / REPORT_NAME).is_file()
