"""The README's main job at test scale, through the same commands: synth -> chunk -> 2-rank ZeRO-2
training under the deepspeed launcher -> `avion-ds eval` (single process) -> `avion-ds export` ->
create_model(pretrained=exported) gives the same logits as the consolidated checkpoint."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.helpers import launch, run_process

pytestmark = pytest.mark.multiprocess


def _ok(proc: subprocess.CompletedProcess) -> str:
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{proc.args[:4]} exited {proc.returncode}:\n{out[-4000:]}"
    return out


def _run(cmd: list[str], timeout: int = 300) -> str:
    return _ok(run_process(cmd, timeout=timeout))


def test_synth_chunk_train_eval_export(tmp_path: Path) -> None:
    cli = [sys.executable, "-m", "avion_ds.cli"]
    _run(
        cli
        + [
            "synth",
            str(tmp_path / "synth"),
            "--num-videos",
            "3",
            "--segments-per-video",
            "13",
            "--segment-seconds",
            "1",
            "--width",
            "64",
            "--height",
            "48",
            "--fps",
            "12",
            "--seed",
            "2",
        ]
    )
    _run(
        cli
        + [
            "chunk",
            str(tmp_path / "synth" / "videos"),
            str(tmp_path / "chunks"),
            "--chunk-seconds",
            "6",
            "--short-side",
            "48",
            "--fps",
            "12",
            "--gop",
            "12",
            "--workers",
            "1",
            "--no-progress",
        ]
    )
    assert (tmp_path / "chunks" / "manifest.jsonl").is_file()
    run = tmp_path / "run"
    sets = [
        f"data.root={tmp_path / 'chunks'}",
        f"data.train_csv={tmp_path / 'synth' / 'train.csv'}",
        f"data.val_csv={tmp_path / 'synth' / 'val.csv'}",
        f"output_dir={run}",
        "schedule.epochs=2",
        "eval.every_epochs=2",
        "batch.global_batch=8",
        "batch.micro_batch=4",
        "eval.batch_size=4",
        "logging.log_every=1",
        "precision=fp32",
        "data.num_frames=4",
        "data.size=32",
    ]
    args = ["--config", "launch/recipes/demo_cpu.yaml", "--deepspeed_config", "ds_configs/zero2.json"]
    for s in sets:
        args += ["--set", s]
    log = _ok(launch(args, timeout=400, launcher="deepspeed"))  # the deepspeed launcher, 2 CPU ranks, launch/train.py
    assert "world 2 | ZeRO-2 | fp32" in log and "[eval ep 1]" in log
    trained = json.loads((run / "metrics.json").read_text())  # 2-rank eval inside training

    # standalone evaluation from the run dir (one process): same metrics as the gathered 2-rank eval
    out = tmp_path / "eval.json"
    from avion_ds.engine.run_checkpoints import complete_tags

    tags = complete_tags(run)
    printed = _run(cli + ["eval", "--checkpoint", str(run), "--out", str(out)])
    ev = json.loads(out.read_text())
    assert f"evaluating {run} checkpoint {tags[-1]}" in printed and ev["tag"] == tags[-1]  # the newest, named
    n_val = len((tmp_path / "synth" / "val.csv").read_text().splitlines()) - 1
    assert ev["num_samples"] == n_val and len(ev["per_sample"]) == n_val
    assert {r["index"] for r in ev["per_sample"]} == set(range(n_val))
    assert ev["num_failed"] == 0 and ev["failed_samples"] == [] and trained["failed_samples"] == []
    assert ev["scores"].startswith("probabilities")  # one representation, named
    for key, value in ev["metrics"].items():
        assert value == pytest.approx(trained[key], abs=1e-3), key

    # export -> safetensors -> create_model(pretrained=...) reproduces the consolidated weights' logits
    weights = tmp_path / "model.safetensors"
    _run(cli + ["export", "--checkpoint", str(run), "--out", str(weights)])
    from avion_ds.engine.export import consolidate
    from avion_ds.models import create_model

    kw = {"heads": {"verb": 4, "noun": 3}, "num_frames": 4, "img_size": 32, "drop_path_rate": 0.0}
    loaded = create_model("vit_test_tiny", pretrained=str(weights), **kw).eval()
    ref = create_model("vit_test_tiny", **kw).eval()
    ref.load_state_dict(consolidate(run), strict=True)
    x = torch.randn(2, 3, 4, 32, 32)
    with torch.no_grad():
        a, b = loaded(x), ref(x)
    for head in ("verb", "noun"):
        torch.testing.assert_close(a[head], b[head], rtol=0, atol=0)

    # eval from the exported file gives the same per-sample scores as eval from the run dir
    out2 = tmp_path / "eval_file.json"
    _run(cli + ["eval", "--config", str(run / "recipe.yaml"), "--checkpoint", str(weights), "--out", str(out2)])
    ev2 = json.loads(out2.read_text())
    assert ev2["per_sample"] == ev["per_sample"]

    # ZeRO-3 CPU-offloaded inference (memory package) through `avion-ds eval --offload cpu`: same metrics
    out3 = tmp_path / "eval_offload.json"
    said = _run(
        cli
        + [
            "eval",
            "--checkpoint",
            str(run),
            "--out",
            str(out3),
            "--offload",
            "cpu",
            "--max-live-params",
            "1e5",
            "--prefetch-bucket",
            "1e5",
            "--no-per-sample",
            "--tag",
            tags[-1],
        ]
    )
    assert "parameters offloaded to CPU memory; on the accelerator at most 100,000 live parameters" in said
    ev3 = json.loads(out3.read_text())
    assert ev3["tag"] == tags[-1]
    for key, value in ev["metrics"].items():
        assert ev3["metrics"][key] == pytest.approx(value, abs=1e-3), key
