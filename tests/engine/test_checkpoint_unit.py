"""Checkpoint bookkeeping: complete markers, killed-mid-save, keep-last-K, run identity."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from avion_ds.config import ConfigError
from avion_ds.engine import run_checkpoints as ckpt
from avion_ds.tasks import load_recipe


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


def test_a_new_best_prunes_the_former_best(tmp_path: Path) -> None:
    """keep_last 1: the newest checkpoint, plus the best while it is another; once the newest becomes the
    best, the former best goes at once (not at the next save: a run ending there kept two)."""
    _fake_tag(tmp_path, 10, True)
    assert ckpt.record_best(tmp_path, "acc", 0.5, "step_00000010", 0, 10, keep_last=1)
    _fake_tag(tmp_path, 20, True)
    ckpt.prune(tmp_path, keep_last=1)  # what save does: step 10 is still the best
    assert [p.name for p in sorted(ckpt.checkpoint_dir(tmp_path).iterdir())] == ["step_00000010", "step_00000020"]
    assert ckpt.record_best(tmp_path, "acc", 0.9, "step_00000020", 1, 20, keep_last=1)
    assert [p.name for p in ckpt.checkpoint_dir(tmp_path).iterdir()] == ["step_00000020"]


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


class _FakeEngine:
    """Just enough of a DeepSpeed engine for ``ckpt.save``: a module and a save that records calls."""

    def __init__(self, value: float) -> None:
        import torch

        self.module = torch.nn.Linear(3, 2)
        with torch.no_grad():
            self.module.weight[0, 0] = value
        self.saved: list[str] = []

    def save_checkpoint(self, root: str, tag: str, client_state: dict) -> None:
        Path(root, tag).mkdir(parents=True)
        self.saved.append(tag)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_weights_are_never_saved(tmp_path: Path, bad: float) -> None:
    good = _FakeEngine(1.0)
    assert ckpt.save(good, tmp_path, 1, {"epoch": 0}, keep_last=2) == "step_00000001"
    engine = _FakeEngine(bad)
    with pytest.raises(ckpt.NonFiniteWeights, match="non-finite weights at global step 2"):
        ckpt.save(engine, tmp_path, 2, {"epoch": 0}, keep_last=2)
    assert engine.saved == [] and ckpt.complete_tags(tmp_path) == ["step_00000001"]


def test_history_after_resume_has_no_replayed_rows(tmp_path: Path) -> None:
    """A run killed after logging steps 5-6 but checkpointed at 4 logs 5-6 again after resuming."""
    from avion_ds.distributed.run_log import RunLogger

    log = RunLogger(tmp_path, True, tensorboard=False, progress=False)
    for step in range(1, 7):
        log.step(0, step, {"loss": float(step)})
    log.eval(0, 4, {"top1": 1.0})
    log.history.write('{"epoch": 0, "st')  # torn line: killed mid-write
    log.close()
    log = RunLogger(tmp_path, True, tensorboard=False, progress=False)
    log.truncate_history(4)  # resumed from step 4
    for step in range(5, 8):
        log.step(0, step, {"loss": 10.0 + step})
    log.close()
    rows = [json.loads(x) for x in (tmp_path / "history.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in rows if "loss" in r]
    assert steps == [1, 2, 3, 4, 5, 6, 7]
    assert [r["loss"] for r in rows if "loss" in r][4:] == [15.0, 16.0, 17.0]
    assert [r["step"] for r in rows if "eval" in r] == [4]
