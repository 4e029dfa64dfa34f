"""Video-text pretraining end to end through the CLI, at test scale: synth (narrations + MIR files) ->
chunk -> contrastive pretraining on 2 CPU ranks (deepspeed launcher, ZeRO-2, feature-cache accumulation)
-> zero-shot EPIC-style MIR every 10 epochs, best checkpoint by avg mAP -> `avion-ds eval --tag best` on
1 and on 2 ranks (an odd row count: the sampler pads) give identical metrics -> fine-tuning a classifier
from the video tower.

Learns: on the 48 held-out clips (12 narrations), text -> video R-precision on exact narration matches
reaches at least 3x chance (the share of clips sharing a query's narration)."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO, launch, run_process

pytestmark = pytest.mark.multiprocess
CLI = [sys.executable, "-m", "avion_ds.cli"]


def _ok(proc: subprocess.CompletedProcess) -> str:
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{proc.args[:6]} exited {proc.returncode}:\n{out[-4000:]}"
    return out


def _odd_mir_split(mir: Path, out: Path) -> tuple[Path, Path]:
    """The MIR test CSV minus one row that no sentence names (47 rows: 2 ranks pad the last batch)."""
    import csv

    import numpy as np

    with open(mir / "EPIC_100_retrieval_test.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    with open(mir / "EPIC_100_retrieval_test_sentence.csv", newline="") as f:
        named = {r["narration_id"] for r in csv.DictReader(f)}
    drop = next(i for i in range(len(rows) - 1, -1, -1) if rows[i]["narration_id"] not in named)
    with open(out / "test47.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(r for i, r in enumerate(rows) if i != drop)
    with open(mir / "relevancy" / "caption_relevancy_EPIC_100_retrieval_test.pkl", "rb") as f:
        rel = pickle.load(f)
    with open(out / "rel47.pkl", "wb") as f:
        pickle.dump(np.delete(rel, drop, axis=0), f)
    return out / "test47.csv", out / "rel47.pkl"


def test_synth_contrastive_mir_finetune(tmp_path: Path) -> None:
    synth, chunks, run = tmp_path / "synth", tmp_path / "chunks", tmp_path / "contrastive"
    _ok(
        run_process(
            [*CLI, "synth", synth, "--num-videos", "4", "--segments-per-video", "24", "--val-fraction", "0.5"]
            + ["--segment-seconds", "1", "--fps", "8", "--width", "64", "--height", "48"]
        )
    )
    _ok(run_process([*CLI, "chunk", synth / "videos", chunks, "--chunk-seconds", "15", "--no-progress"]))
    mir = synth / "retrieval_annotations"
    data = [
        f"data.root={chunks}",
        f"data.train_csv={synth / 'ego4d_train.pkl'}",
        f"data.val_csv={mir / 'EPIC_100_retrieval_test.csv'}",
        f"data.val_sentences={mir / 'EPIC_100_retrieval_test_sentence.csv'}",
        f"data.val_relevancy={mir / 'relevancy' / 'caption_relevancy_EPIC_100_retrieval_test.pkl'}",
    ]
    recipe = REPO / "launch" / "recipes" / "contrastive_demo_cpu.yaml"
    sets = [x for s in [*data, f"output_dir={run}"] for x in ("--set", s)]
    log = _ok(launch(["--config", recipe, "--deepspeed_config", REPO / "ds_configs" / "zero2.json", *sets]))
    assert "global batch 16 = micro 4 x accum 2 x world 2" in log
    best = json.loads((run / "best.json").read_text())
    assert best["metric"] == "avg_map" and f"best checkpoint: {best['tag']}" in log
    history = [json.loads(x) for x in (run / "history.jsonl").read_text().splitlines()]
    assert any("clip_acc" in h and "t2v_acc" in h and "logit_scale" in h for h in history), history[-1]

    # zero-shot MIR of the best checkpoint on 1 and on 2 ranks, 47 rows (the DistributedSampler pads)
    csv47, rel47 = _odd_mir_split(mir, tmp_path)
    odd = ["--set", f"data.val_csv={csv47}", "--set", f"data.val_relevancy={rel47}"]
    one, two = tmp_path / "eval1.json", tmp_path / "eval2.json"
    _ok(run_process([*CLI, "eval", "--checkpoint", run, "--tag", "best", "--out", one, *odd]))
    evaluate = ["eval", "--checkpoint", run, "--tag", "best", "--out", two, *odd]
    _ok(launch(evaluate, launcher="torchrun", module="avion_ds.cli"))
    e1, e2 = json.loads(one.read_text()), json.loads(two.read_text())
    assert e1["tag"] == best["tag"] and e1["rows"] == 47
    assert e1["metrics"] == e2["metrics"]
    assert set(e1["metrics"]) == {"vis_map", "txt_map", "avg_map", "vis_ndcg", "txt_ndcg", "avg_ndcg"}

    # learns: the best checkpoint on the full held-out set
    scores = tmp_path / "eval_full.json"
    _ok(run_process([*CLI, "eval", "--checkpoint", run, "--tag", "best", "--out", scores]))
    full = json.loads(scores.read_text())
    print(f"t2v R-precision {full['t2v_rprecision']:.1f} vs chance {full['t2v_rprecision_chance']:.1f}")
    assert full["rows"] >= 48 and full["columns"] >= 8
    assert full["t2v_rprecision"] >= 3 * full["t2v_rprecision_chance"], full

    # fine-tune a classifier from the video tower of the best checkpoint
    ft = tmp_path / "finetune"
    finetune = [
        "model.name=vit_clip_test_tiny",
        "model.heads={verb: 4, noun: 3}",
        f"model.pretrained={run}",
        "data.dataset=epic",
        f"data.root={chunks}",
        f"data.train_csv={synth / 'train.csv'}",
        f"data.val_csv={synth / 'val.csv'}",
        "data.num_frames=2",
        "data.size=32",
        "data.workers=1",
        "schedule.epochs=1",
        "batch.global_batch=16",
        "batch.micro_batch=8",
        f"output_dir={ft}",
    ]
    args = [x for s in finetune for x in ("--set", s)]
    demo = REPO / "launch" / "recipes" / "demo_cpu.yaml"
    _ok(
        launch(["--config", demo, "--deepspeed_config", REPO / "ds_configs" / "zero2.json", *args], launcher="torchrun")
    )
    report = json.loads((ft / "pretrained_report.json").read_text())
    assert report["backbone_matched_fraction"] == 1.0, report
    assert any(k.startswith("textual.") for k in report["unexpected"] + report["dropped"]), report
    assert (ft / "metrics.json").is_file()
