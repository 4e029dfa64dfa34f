"""Checkpoint bookkeeping: complete markers, killed-mid-save, keep-last-K, run identity."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from avion_ds.config import ConfigError, load_recipe
from avion_ds.engine import checkpoint as ckpt


def _fake_tag(run: Path, step: int, complete: bool) -> Path:
    d = ckpt.checkpoint_dir(run) / ckpt.tag_for(step)
    d.mkdir(parents=True)
    (d / "mp_rank_00_model_states.pt").write_bytes(b"x")
    if complete:
        (d / ckpt.MARKER).write_text(json.dumps({"global_step": step}))
    return d


def test_killed_mid_save_resumes_from_previous(tmp_path: Path) -> None:
    _fake_tag(tmp_path, 10, True)
    _fake_tag(tmp_path, 20, True)
    _fake_tag(tmp_path, 30, False)  # killed while saving: shards present, no marker
    (ckpt.checkpoint_dir(tmp_path) / "latest").write_text("step_00000030")  # DeepSpeed's pointer lies
    assert ckpt.latest_complete(tmp_path) == "step_00000020"
    assert ckpt.complete_tags(tmp_path) == ["step_00000010", "step_00000020"]
    assert ckpt.latest_complete(tmp_path / "nothing") is None


def test_prune_keeps_last_k_and_drops_stale_partials(tmp_path: Path) -> None:
    _fake_tag(tmp_path, 5, False)  # partial older than the newest complete: garbage
    for s in (10, 20, 30):
        _fake_tag(tmp_path, s, True)
    _fake_tag(tmp_path, 40, False)  # partial newer than newest complete: maybe in progress, keep
    ckpt.prune(tmp_path, keep_last=2)
    left = sorted(p.name for p in ckpt.checkpoint_dir(tmp_path).iterdir())
    assert left == ["step_00000020", "step_00000030", "step_00000040"]


def test_resume_into_other_models_dir_is_refused(tmp_path: Path) -> None:
    base = ["data.dataset=kinetics", f"output_dir={tmp_path}"]
    tiny = load_recipe(None, base + ["model.name=vit_test_tiny"])
    ckpt.write_run_identity(tmp_path, tiny)
    ckpt.check_run_identity(tmp_path, tiny)  # same model: fine
    other = load_recipe(None, base + ["model.name=vit_test_small"])
    with pytest.raises(ConfigError, match=r"different model \(name 'vit_test_tiny' -> 'vit_test_small'\)"):
        ckpt.check_run_identity(tmp_path, other)
    fresh = load_recipe(None, base + ["model.name=vit_test_small", "checkpoint.resume=false"])
    ckpt.check_run_identity(tmp_path, fresh)  # resume disabled: allowed
