"""A Kinetics-710 head loaded for Kinetics-400 / 600 / 700 keeps the rows VideoMAE V2's label maps name
(``run_class_finetuning.py``: ``checkpoint_model[k] = checkpoint_model[k][label_map]``), as the load report says."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from avion_ds.models import create_model
from avion_ds.models.vit.kinetics710 import LABEL_MAPS, k710_label_map
from avion_ds.models.weights.loading import REPORT_NAME, load_and_report
from avion_ds.tasks import load_recipe
from avion_ds.tasks.base import maps_kinetics710_head
from tests.models.convert import to_videomae

X = torch.randn(2, 3, 4, 32, 32)


def test_shipped_label_maps_are_videomae_v2s() -> None:
    for n in (400, 600, 700):
        rows = json.loads((LABEL_MAPS / f"label_710to{n}.json").read_text())
        assert len(rows) == n and len(set(rows)) == n and 0 <= min(rows) and max(rows) < 710
    assert k710_label_map(400)[:5] == [341, 158, 189, 16, 398]  # misc/label_710to400.json's first entries
    assert k710_label_map(600)[:3] == [121, 562, 518] and k710_label_map(700)[:3] == [363, 481, 594]
    assert k710_label_map(710) is None and "MIT License" in (LABEL_MAPS / "README.md").read_text()


@torch.no_grad()
@pytest.mark.parametrize("classes", [400, 600, 700])
def test_k710_head_rows_are_picked_by_the_label_map(tmp_path: Path, classes: int) -> None:
    torch.manual_seed(0)
    src = create_model("vit_test_tiny", num_classes=710, head_init_scale=1.0).eval()
    path = tmp_path / "k710.pth"
    torch.save(to_videomae(src), path)  # a VideoMAE V2 K710 fine-tuned checkpoint, synthetic
    dst = create_model("vit_test_tiny", num_classes=classes).eval()
    lines: list[str] = []
    report = load_and_report(
        dst, str(path), strict=True, trust=False, run_dir=tmp_path, is_main=True, log=lines.append, kinetics_head=True
    )
    rows = json.loads((LABEL_MAPS / f"label_710to{classes}.json").read_text())
    assert torch.equal(dst.head.weight, src.head.weight[rows]) and torch.equal(dst.head.bias, src.head.bias[rows])
    torch.testing.assert_close(dst(X), src(X)[:, rows])  # the K710 model's scores of these classes
    assert report.remapped == ["head.bias", "head.weight"] and not report.dropped
    saved = json.loads((tmp_path / REPORT_NAME).read_text())
    assert saved["remapped"] == ["head.bias", "head.weight"]
    assert f"Kinetics-710 head rows mapped onto Kinetics-{classes}" in lines[0]

    fresh = create_model("vit_test_tiny", num_classes=classes).eval()  # without the option: a fresh head
    report = load_and_report(fresh, str(path), strict=True, trust=False, run_dir=None, is_main=False)
    assert report.dropped == ["head.bias", "head.weight"] and not report.remapped


def test_recipe_decides_the_mapping() -> None:
    assert maps_kinetics710_head(load_recipe(None, ["data.dataset=kinetics"]))
    assert not maps_kinetics710_head(load_recipe(None, ["data.dataset=kinetics", "model.head_label_map=none"]))
    assert not maps_kinetics710_head(load_recipe(None, ["data.dataset=ssv2", "model.num_classes=174"]))


@torch.no_grad()
def test_finetune_task_maps_the_head_it_loads(tmp_path: Path) -> None:
    """`avion-ds train`'s model build (the fine-tuning task) applies the recipe's mapping."""
    from avion_ds.tasks import task_of

    torch.manual_seed(0)
    src = create_model("vit_test_tiny", num_classes=710, head_init_scale=1.0).eval()
    path = tmp_path / "k710.pth"
    torch.save(to_videomae(src), path)
    recipe = load_recipe(
        None,
        ["model.name=vit_test_tiny", "model.num_classes=400", "data.dataset=kinetics", "data.num_frames=4"]
        + ["data.size=32", f"model.pretrained={path}"],
    )
    model = task_of(recipe).build_model(recipe, run_dir=tmp_path)
    assert torch.equal(model.head.weight, src.head.weight[k710_label_map(400)])
