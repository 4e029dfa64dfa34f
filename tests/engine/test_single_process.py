"""A plain `python launch/train.py` (one process, no launcher) and the non-finite `stop` policy."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import REPO, engine_env, write_recipe

pytestmark = pytest.mark.slow


def test_nonfinite_stop_exits_nonzero_with_step(tiny_epic: dict, tmp_path: Path) -> None:
    run = tmp_path / "run"
    # lr 1e30 without clipping: the first AdamW step blows the weights up, step 2's loss is not finite
    recipe = write_recipe(tmp_path / "r.yaml", tiny_epic, run, optim={"lr": 1e30, "clip_grad": 0.0},
                          checkpoint={"every_steps": 0})
    proc = subprocess.run([sys.executable, str(REPO / "launch" / "train.py"), "--config", str(recipe),
                           "--deepspeed_config", str(REPO / "ds_configs" / "zero0.json"), "--set", "nonfinite=stop",
                           "--set", "batch.global_batch=4"],
                          cwd=REPO, env=engine_env(), capture_output=True, text=True, timeout=240)
    err = proc.stderr
    assert proc.returncode == 3, (proc.stdout + err)[-3000:]
    assert "avion-ds train: error: non-finite loss at global step 2 (epoch 0, step 2 of the epoch)" in err
    assert "world 1 | ZeRO-0" in proc.stdout
    assert not (run / "checkpoints").exists() or not any((run / "checkpoints").glob("step_*"))


def test_bad_videos_are_skipped_counted_and_named(tiny_epic: dict, tmp_path: Path) -> None:
    """Every chunk of one video is emptied: training goes on, reports the count and names the file."""
    import json
    import shutil

    chunks = tmp_path / "chunks"
    shutil.copytree(tiny_epic["root"], chunks)
    victim = min(p for p in chunks.iterdir() if p.is_dir())
    for f in victim.glob("*.mp4"):
        f.write_bytes(b"")
    run = tmp_path / "run"
    recipe = write_recipe(tmp_path / "r.yaml", {**tiny_epic, "root": chunks}, run,
                          schedule={"epochs": 1, "steps_per_epoch": 4}, checkpoint={"every_steps": 0})
    proc = subprocess.run([sys.executable, str(REPO / "launch" / "train.py"), "--config", str(recipe),
                           "--deepspeed_config", str(REPO / "ds_configs" / "zero0.json")],
                          cwd=REPO, env=engine_env(), capture_output=True, text=True, timeout=240)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    rows = [json.loads(line) for line in (run / "history.jsonl").read_text().splitlines()]
    bad = [r["bad_samples"] for r in rows if "bad_samples" in r]
    assert bad and bad[-1] > 0 and bad == sorted(bad)
    assert f"{victim.name}/" in out  # the skipped file is named in the log
    assert f"{bad[-1]} bad input samples skipped" in out
