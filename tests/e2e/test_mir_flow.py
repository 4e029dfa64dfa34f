"""EPIC-100 MIR fine-tuning end to end through the CLI, at test scale: synth (its ``retrieval_annotations/``
train files: CSV, sentences, relevancy) -> chunk -> ``task: mir`` on 2 CPU ranks (torchrun,
ZeRO-2, feature-cache accumulation, captions drawn by relevancy, max-margin loss) -> zero-shot MIR every 5
epochs, best checkpoint by avg mAP.

The start is a randomly initialised 2-frame ``clip_vit_test_tiny`` saved in this process (our names, as
``avion-ds export`` writes them) and fine-tuned at 4 frames, so the load inflates the temporal embedding
as AVION's 4 -> 16. Not a contrastive run: one on synth takes ~70 s (``test_contrastive_flow``), and even
one epoch pays ~20 s of DeepSpeed start-up; a run directory goes through the same loader
(``read_checkpoint`` consolidates it to these names), exercised there for the classifier."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.helpers import REPO, launch, losses, run_process

pytestmark = pytest.mark.multiprocess
CLI = [sys.executable, "-m", "avion_ds.cli"]


def _ok(proc: subprocess.CompletedProcess) -> str:
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{proc.args[:6]} exited {proc.returncode}:\n{out[-4000:]}"
    return out


def _start_weights(path: Path) -> dict:
    """A random 2-frame tiny dual encoder as a safetensors file; its state dict."""
    import torch
    from safetensors.torch import save_file

    from avion_ds.models import create_model

    torch.manual_seed(0)
    sd = {k: v.contiguous() for k, v in create_model("clip_vit_test_tiny", num_frames=2).state_dict().items()}
    save_file(sd, str(path))
    return sd


def _recipe(path: Path, synth: Path, chunks: Path, start: Path, run: Path) -> Path:
    mir = synth / "retrieval_annotations"
    recipe = {
        "task": "mir",
        "model": {"name": "clip_vit_test_tiny", "pretrained": str(start), "activation_checkpointing": True},
        "data": {
            "root": str(chunks),
            "train_csv": str(mir / "EPIC_100_retrieval_train.csv"),
            "train_sentences": str(mir / "EPIC_100_retrieval_train_sentence.csv"),
            "train_relevancy": str(mir / "relevancy" / "caption_relevancy_EPIC_100_retrieval_train.pkl"),
            "val_csv": str(mir / "EPIC_100_retrieval_test.csv"),
            "val_sentences": str(mir / "EPIC_100_retrieval_test_sentence.csv"),
            "val_relevancy": str(mir / "relevancy" / "caption_relevancy_EPIC_100_retrieval_test.pkl"),
            "num_frames": 4,
            "size": 32,
            "crop_scale": [0.7, 1.0],
            "workers": 1,
            "decode_timeout_s": 0.0,
        },
        "optim": {"lr": 1.0e-3, "min_lr": 1.0e-4},  # a random start: AVION fine-tunes a pretrained one at 3e-5
        "schedule": {"epochs": 10, "warmup_start_lr": 1.0e-4},
        "batch": {"global_batch": 16, "micro_batch": 4},  # x 2 accumulation x 2 ranks: one batch of 16
        "eval": {"batch_size": 8},  # every 5 epochs: the task's default
        "checkpoint": {"keep_last": 1},
        "logging": {"log_every": 1, "progress": False},
        "output_dir": str(run),
        "precision": "fp32",
    }
    path.write_text(yaml.safe_dump(recipe))
    return path


def test_synth_mir_finetune(tmp_path: Path) -> None:
    synth, chunks, run = tmp_path / "synth", tmp_path / "chunks", tmp_path / "mir"
    _ok(
        run_process(
            [*CLI, "synth", synth, "--num-videos", "4", "--segments-per-video", "24", "--val-fraction", "0.5"]
            + ["--segment-seconds", "1", "--fps", "8", "--width", "64", "--height", "48"]
        )
    )
    _ok(run_process([*CLI, "chunk", synth / "videos", chunks, "--chunk-seconds", "15", "--no-progress"]))
    start = _start_weights(tmp_path / "start.safetensors")
    recipe = _recipe(tmp_path / "mir.yaml", synth, chunks, tmp_path / "start.safetensors", run)
    ds_config = REPO / "ds_configs" / "zero2.json"
    log = _ok(launch(["--config", recipe, "--deepspeed_config", ds_config], launcher="torchrun"))  # ~10 s less
    assert "global batch 16 = micro 4 x accum 2 x world 2" in log

    report = json.loads((run / "pretrained_report.json").read_text())
    assert "visual.temporal_embed" in report["resized"] and not report["missing"], report
    history = [json.loads(x) for x in (run / "history.jsonl").read_text().splitlines()]
    assert all("clip_acc" in h and "t2v_acc" in h for h in history if "loss" in h), history[-1]
    evals = [h for h in history if "eval" in h]
    assert [h["epoch"] for h in evals] == [4, 9], evals  # every 5 epochs (0-based epochs 4 and 9)
    best = json.loads((run / "best.json").read_text())
    assert best["metric"] == "avg_map" and best["value"] == max(h["eval"]["avg_map"] for h in evals), best
    assert f"best checkpoint: {best['tag']}" in log
    steps = losses(run)
    first, last = list(steps.values())[:3], list(steps.values())[-3:]
    print(f"max-margin loss: first steps {first}, last steps {last}; evals {evals}")
    assert abs(first[0] - 0.2) < 0.02, steps  # a random start ranks nothing: the hinge sits at the margin
    assert sum(last) < sum(first), steps  # the ranking loss goes down

    from avion_ds.rundir import consolidate

    final = consolidate(run)
    assert float(final["logit_scale"].reshape(())) == float(start["logit_scale"].reshape(()))  # frozen
