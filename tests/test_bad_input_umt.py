"""Malformed `task: umt` invocations, table-driven as tests/test_bad_input_table.py: a teacher file that is not a
CLIP visual tower (or of another size, or missing), a teacher whose patch grid cannot match the student's,
``clip_return_layer`` above either model's depth, ``mask_ratio`` outside (0, 1), a student tubelet the
frame-wise teacher cannot match. Each ends in ONE stderr line naming the key (and the file), exit 2, before
any process group exists; no video is opened (the chunk files are empty placeholders)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import save_file

from tests.helpers.data import placeholder_chunks
from tests.test_bad_input_table import ZERO2, no_process_group


def _save(model: torch.nn.Module, path: Path) -> Path:
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    return path


@pytest.fixture()
def files(tmp_path: Path) -> dict:
    """A chunk root, a tiny dual encoder's weights (the teacher), a classifier's weights, the base recipe."""
    from avion_ds.models import create_model

    root = placeholder_chunks(tmp_path / "chunks")
    teacher = _save(create_model("clip_vit_test_tiny"), tmp_path / "teacher.safetensors")
    vit = _save(create_model("vit_test_tiny"), tmp_path / "vit.safetensors")
    torch.save({"state_dict": create_model("clip_vit_test_tiny").state_dict(), "hook": print}, tmp_path / "payload.pt")
    recipe = {
        "task": "umt",
        "model": {"name": "vit_test_tiny", "tubelet_size": 1},
        "data": {"root": str(root), "num_frames": 4, "size": 32, "decoder": "auto"},
        "umt": {
            "teacher": str(teacher),
            "teacher_model": "clip_vit_test_tiny",
            "clip_input_resolution": 16,
            "clip_return_layer": 2,
            "mask_ratio": 0.5,
        },
        "optim": {"base_batch": 1},
        "batch": {"global_batch": 1, "micro_batch": 1},  # the placeholder root holds one clip
        "precision": "fp32",
        "output_dir": str(tmp_path / "run"),
    }
    path = tmp_path / "umt.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return {"tmp": tmp_path, "recipe": path, "teacher": teacher, "vit": vit}


# (id, --set overrides ("{vit}" / "{tmp}": the fixture's paths), substrings the line must hold)
CASES: list[tuple[str, list[str], list[str]]] = [
    ("teacher_not_clip", ["umt.teacher={vit}"], ["umt.teacher=", "vit.safetensors", "not a CLIP visual tower"]),
    ("teacher_untrusted", ["umt.teacher={tmp}/payload.pt"], ["umt.teacher=", "payload.pt", "builtins.print"]),
    ("teacher_missing", ["umt.teacher={tmp}/nope.pt"], ["umt.teacher=", "nope.pt"]),
    ("teacher_unset", ["umt.teacher="], ["umt.teacher is required"]),
    (
        "teacher_other_size",
        ["umt.teacher_model=clip_vit_base_patch16_224", "umt.clip_input_resolution=32"],
        ["umt.teacher=", "teacher.safetensors", "does not fit"],
    ),
    ("teacher_model_not_dual", ["umt.teacher_model=vit_test_tiny"], ["umt.teacher_model='vit_test_tiny'"]),
    ("patch_dropout", ["model.patch_dropout=0.5"], ["model.patch_dropout=0.5", "visible tokens"]),
    ("rlt", ["model.rlt_threshold=0.1"], ["model.rlt_threshold=0.1", "visible tokens"]),
    (
        "teacher_grid",
        ["umt.clip_input_resolution=32"],
        ["umt.teacher=", "teacher.safetensors", "patch grid 4x4", "student's 2x2", "clip_input_resolution=16"],
    ),
    ("return_layer_above_both", ["umt.clip_return_layer=3"], ["umt.clip_return_layer=3", "model.name=vit_test_tiny"]),
    (
        "return_layer_above_teacher",
        ["model.name=vit_test_small", "data.size=64", "umt.clip_input_resolution=32", "umt.clip_return_layer=3"],
        ["umt.clip_return_layer=3", "umt.teacher_model=clip_vit_test_tiny (2 blocks)"],
    ),
    ("return_layer_zero", ["umt.clip_return_layer=0"], ["umt.clip_return_layer=0"]),
    ("mask_ratio_one", ["umt.mask_ratio=1.0"], ["umt.mask_ratio=1.0", "(0, 1)"]),
    ("mask_ratio_zero", ["umt.mask_ratio=0"], ["umt.mask_ratio=0", "(0, 1)"]),
    ("mask_ratio_negative", ["umt.mask_ratio=-0.2"], ["umt.mask_ratio=-0.2"]),
    ("mask_type", ["umt.mask_type=block"], ["umt.mask_type"]),
    ("loss_type", ["umt.clip_loss_type=cos"], ["umt.clip_loss_type"]),
    ("student_tubelet", ["model.tubelet_size=2"], ["model.tubelet_size=2"]),
]


def _train(files: dict, sets: list[str], *extra: str) -> int:
    from avion_ds.cli import train as train_cli

    argv = ["--config", str(files["recipe"]), "--deepspeed_config", str(ZERO2), *extra]
    for s in sets:
        argv += ["--set", s.format(vit=files["vit"], tmp=files["tmp"])]
    return train_cli.main(argv)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_malformed_umt_invocation_is_one_line_exit_2(
    case: tuple, files: dict, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    name, sets, expect = case
    no_process_group(monkeypatch)
    code = _train(files, sets)
    out, err = capsys.readouterr()
    err = err.strip()
    assert code == 2, (name, out[-2000:], err)
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith("avion-ds train: error: "), err
    for part in expect:
        assert part in err, (part, err)
    assert not (files["tmp"] / "run").exists()


def test_the_base_recipe_passes(files: dict, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """The base recipe passes every start-up check (so each case fails for its own reason)."""
    no_process_group(monkeypatch)
    assert _train(files, [], "--dry-run") == 0, capsys.readouterr().err
