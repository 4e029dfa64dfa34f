"""Tiny training recipes and reading a run's loss history."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import yaml

# decode in the loader process (no decode-timeout helper process to start per loader and per run):
# for multi-process tests that are not about decoding; the frames are the same
QUICK_DATA = {"decode_timeout_s": 0.0}


def write_recipe(path: Path, data: dict, output_dir: Path, /, **sections: dict) -> Path:
    """A tiny EPIC recipe for vit_test_tiny over ``data`` (a :func:`tests.helpers.tiny_epic_data` dict; fp32,
    no random augmentation but flips); ``sections`` update the recipe's sections (``data={...}`` included)."""
    recipe = {
        "model": {
            "name": "vit_test_tiny",
            "heads": {"verb": 4, "noun": 3},
            "drop_path_rate": 0.1,
            "activation_checkpointing": True,
        },
        "data": {
            "dataset": "epic",
            "root": str(data["root"]),
            "train_csv": str(data["train_csv"]),
            "val_csv": str(data["val_csv"]),
            "num_frames": 4,
            "size": 32,
            "workers": 0,
            "decoder": "decord",
            "hflip": 0.5,
            "label_smoothing": 0.1,
        },
        "optim": {"lr": 1e-3, "base_batch": 8, "layer_decay": 0.75, "clip_grad": 1.0},
        "schedule": {"epochs": 2, "warmup_epochs": 0.5},
        "batch": {"global_batch": 8, "micro_batch": 4},
        "eval": {"every_epochs": 1, "batch_size": 4},
        "checkpoint": {"every_steps": 2, "keep_last": 2},
        "logging": {"tensorboard": True, "log_every": 1, "progress": False},
        "output_dir": str(output_dir),
        "seed": 3,
        "precision": "fp32",
    }
    for section, values in sections.items():
        recipe.setdefault(section, {}).update(values)
    path.write_text(yaml.safe_dump(recipe))
    return path


def losses(run_dir: Path) -> dict[int, float]:
    """step -> loss from a run's history.jsonl (later lines win, as after a resume)."""
    out: dict[int, float] = {}
    for line in (run_dir / "history.jsonl").read_text().splitlines():
        row = json.loads(line)
        if row.get("loss") is not None:  # None: a window skipped for a non-finite loss
            out[int(row["step"])] = float(row["loss"])
    return out


def cut_run_at(src: Path, dst: Path, k: int) -> None:
    """``dst``: ``src``'s run dir as it was after step k (later checkpoints and the history removed): what a
    run killed after step k leaves, to resume."""
    shutil.copytree(src, dst)
    for tag in (dst / "checkpoints").glob("step_*"):
        if int(tag.name.split("_")[1]) > k:
            shutil.rmtree(tag)
    (dst / "history.jsonl").unlink()
    shutil.rmtree(dst / "tb", ignore_errors=True)
