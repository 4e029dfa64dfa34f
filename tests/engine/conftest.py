"""Shared fixtures for the engine tests: a tiny synthetic EPIC dataset and a 2-rank launcher helper."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from avion_ds.engine.dist import free_port

REPO = Path(__file__).resolve().parents[2]


def engine_env() -> dict[str, str]:
    """Environment for DeepSpeed subprocesses: CPU accelerator, shared op cache, one thread per rank."""
    env = dict(os.environ)
    env.setdefault("TORCH_EXTENSIONS_DIR", str(REPO / ".torch_extensions"))
    env.setdefault("DS_ACCELERATOR", "cpu")
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def launch(args: list[str], nprocs: int = 2, timeout: int = 600, launcher: str = "deepspeed",
           script_path: Path | None = None) -> subprocess.CompletedProcess:
    """Run ``launch/train.py`` (or ``script_path``) on ``nprocs`` CPU ranks."""
    script = [str(script_path or REPO / "launch" / "train.py")]
    if launcher == "deepspeed":
        cmd = [sys.executable, "-m", "deepspeed.launcher.runner", "--num_gpus", str(nprocs),
               "--master_port", str(free_port()), *script, *args]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nprocs),
               "--master_port", str(free_port()), *script, *args]
    return subprocess.run(cmd, cwd=REPO, env=engine_env(), capture_output=True, text=True, timeout=timeout)


def losses(run_dir: Path) -> dict[int, float]:
    """step -> loss from a run's history.jsonl (later lines win, as after a resume)."""
    out: dict[int, float] = {}
    for line in (run_dir / "history.jsonl").read_text().splitlines():
        row = json.loads(line)
        if row.get("loss") is not None:  # None: a window skipped for a non-finite loss
            out[int(row["step"])] = float(row["loss"])
    return out


@pytest.fixture(scope="session")
def tiny_epic(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """4 long synthetic videos -> chunks + CSVs (an odd number of val clips, to exercise padding)."""
    from avion_ds.data.chunking import chunk_videos
    from avion_ds.data.synthetic import make_synthetic_epic

    root = tmp_path_factory.mktemp("tiny_epic")
    info = make_synthetic_epic(root / "synth", num_videos=3, segments_per_video=15, segment_seconds=1.0,
                               width=64, height=48, fps=12, val_fraction=0.25, seed=1)
    chunk_videos(info["videos"], root / "chunks", chunk_seconds=6.0, short_side=48, fps=12, gop=12, progress=False)
    return {"root": root / "chunks", "train_csv": info["train_csv"], "val_csv": info["val_csv"],
            "num_train": info["num_train"], "num_val": info["num_val"]}


def write_recipe(path: Path, data: dict, output_dir: Path, /, **sections: dict) -> Path:
    """A tiny EPIC recipe for vit_test_tiny over ``data`` (fp32, no random augmentation); ``sections``
    update the recipe's sections (``data={...}`` included)."""
    recipe = {
        "model": {"name": "vit_test_tiny", "heads": {"verb": 4, "noun": 3}, "drop_path_rate": 0.1,
                  "activation_checkpointing": True},
        "data": {"dataset": "epic", "root": str(data["root"]), "train_csv": str(data["train_csv"]),
                 "val_csv": str(data["val_csv"]), "num_frames": 4, "size": 32, "workers": 0,
                 "decoder": "decord", "hflip": 0.5, "label_smoothing": 0.1},
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
