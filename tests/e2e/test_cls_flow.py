"""EPIC-100 action recognition as AVION runs it, end to end at test scale through the CLI: `avion-ds synth` ->
`avion-ds chunk` -> a dual-encoder file (the contrastive stage's output; here written in-process with random
weights, so the flow costs seconds instead of a contrastive run) -> launch/recipes/lavila_vit_b_epic_cls.yaml
(SGD, one action head over AVION's verb:noun ids, mixup + cutmix) at tiny size on 2 CPU ranks (torchrun,
ZeRO-2) -> `avion-ds eval`: the usual EPIC keys and AVION's, per-sample action
probabilities, labels as AVION's generate_label_map numbers them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from avion_ds.models import create_model
from tests.engine.test_action_metrics import generate_label_map
from tests.helpers import REPO, launch, run_process

pytestmark = pytest.mark.multiprocess
CLI = [sys.executable, "-m", "avion_ds.cli"]
USUAL = {f"{h}_{m}" for h in ("verb", "noun") for m in ("top1", "top5", "mean_class")} | {"action_top1", "action_top5"}
AVION = {"avion_action_top1", "avion_action_top5", "avion_action_mean_class", "avion_verb_top1", "avion_noun_top1"}


def _ok(proc: subprocess.CompletedProcess) -> str:
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{proc.args[:6]} exited {proc.returncode}:\n{out[-4000:]}"
    return out


def test_synth_dual_encoder_to_avion_cls(tmp_path: Path) -> None:
    synth, chunks, run = tmp_path / "synth", tmp_path / "chunks", tmp_path / "cls"
    _ok(
        run_process(
            [*CLI, "synth", synth, "--num-videos", "4", "--segments-per-video", "12", "--val-fraction", "0.25"]
            + ["--segment-seconds", "1", "--fps", "8", "--width", "64", "--height", "48"]
        )
    )
    _ok(run_process([*CLI, "chunk", synth / "videos", chunks, "--chunk-seconds", "15", "--no-progress"]))
    actions = generate_label_map([synth / "train.csv", synth / "val.csv"])  # AVION's own numbering (the oracle)

    torch.manual_seed(0)
    dual = tmp_path / "dual_encoder.pt"
    torch.save(create_model("clip_vit_test_tiny").state_dict(), dual)

    sets = [
        "model.name=vit_clip_test_tiny",
        f"model.pretrained={dual}",
        f"model.heads={{action: {len(actions)}}}",
        f"data.root={chunks}",
        f"data.train_csv={synth / 'train.csv'}",
        f"data.val_csv={synth / 'val.csv'}",
        "data.num_frames=2",
        "data.size=32",
        "data.workers=0",
        "data.decoder=pyav",
        "eval.protocol=custom",
        "eval.batch_size=8",
        "eval.every_epochs=2",
        "schedule.epochs=2",
        "schedule.warmup_epochs=1",
        "batch.global_batch=16",
        "batch.micro_batch=8",
        "checkpoint.every_steps=0",
        "logging.tensorboard=false",
        "logging.progress=false",
        "precision=fp32",
        f"output_dir={run}",
    ]
    recipe = REPO / "launch" / "recipes" / "lavila_vit_b_epic_cls.yaml"
    args = ["--config", recipe, "--deepspeed_config", REPO / "ds_configs" / "zero2.json"]
    _ok(launch([*args, *[x for s in sets for x in ("--set", s)]], launcher="torchrun"))
    ds = json.loads((run / "ds_config.json").read_text())
    assert ds["optimizer"]["type"] == "SGD" and ds["optimizer"]["params"]["momentum"] == 0.9
    assert ds["optimizer"]["params"]["nesterov"] is False and ds["zero_allow_untested_optimizer"] is True
    report = json.loads((run / "pretrained_report.json").read_text())
    assert report["backbone_matched_fraction"] == 1.0 and sorted(report["fresh"]) == [
        "heads.action.bias",
        "heads.action.weight",
    ]
    assert any(k.startswith("textual.") for k in report["dropped"]), report
    assert set(json.loads((run / "metrics.json").read_text())) >= USUAL | AVION

    out = tmp_path / "eval.json"
    _ok(run_process([*CLI, "eval", "--checkpoint", run, "--out", out]))
    result = json.loads(out.read_text())
    assert set(result["metrics"]) == USUAL | AVION
    assert result["action_label_map"]["num_actions"] == len(actions)
    rows, pairs = result["per_sample"], _csv_pairs(synth / "val.csv")
    assert len(rows) == len(pairs) == result["num_samples"]
    for row in rows:
        assert row["action_label"] == actions["{}:{}".format(*pairs[row["index"]])]
        assert len(row["action_scores"]) == len(actions) and sum(row["action_scores"]) == pytest.approx(1, abs=1e-4)
    right = 100 * sum(r["action_pred"] == r["action_label"] for r in rows) / len(rows)
    assert result["metrics"]["action_top1"] == pytest.approx(right)
    assert result["metrics"]["avion_action_top1"] == pytest.approx(right)


def _csv_pairs(path: Path) -> list[tuple[int, int]]:
    import csv

    with open(path, newline="") as f:
        return [(int(r["verb_class"]), int(r["noun_class"])) for r in csv.DictReader(f)]
