"""The README's main job at test scale, through the same commands: ``bash launch/demo.sh`` (README.md's
block, run once for the doc test and this flow: synth -> chunk -> 2-rank ZeRO-2 training under the deepspeed
launcher -> `avion-ds eval` (single process) -> `avion-ds export`), then from that run: the standalone
evaluation equals the gathered 2-rank one, create_model(pretrained=exported) gives the same logits as the
consolidated checkpoint, and evaluation from the exported file or ZeRO-3 offloaded gives the same scores."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from tests.e2e.conftest import DocRuns, doc_block
from tests.helpers import run_process

README_DEMO = ("README.md", "launch/demo.sh")
pytestmark = [pytest.mark.multiprocess, pytest.mark.doc_run(*README_DEMO)]  # the documented run it reads


def _ok(proc: subprocess.CompletedProcess) -> str:
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{proc.args[:4]} exited {proc.returncode}:\n{out[-4000:]}"
    return out


def _run(cmd: list[str], cwd: Path) -> str:
    """``cmd`` from ``cwd`` (the run group's scratch directory: the run's recipe names its data relative to it)."""
    return _ok(run_process(cmd, timeout=300, cwd=cwd))


def test_synth_chunk_train_eval_export(doc_runs: DocRuns) -> None:
    cli = [sys.executable, "-m", "avion_ds.cli"]
    block = doc_block(*README_DEMO)
    log = _ok(doc_runs.run(block))
    docs = doc_runs.dir(block)
    demo = docs / "demo"
    run, tmp_path = demo / "run", demo / "readme_flow"  # this flow's own outputs
    tmp_path.mkdir(exist_ok=True)
    assert "world 2 | ZeRO-2 | fp32" in log and "[eval ep " in log
    trained = json.loads((run / "metrics.json").read_text())  # 2-rank eval inside training

    # standalone evaluation from the run dir (one process): same metrics as the gathered 2-rank eval
    out = run / "eval_metrics.json"  # demo.sh's `avion-ds eval --checkpoint demo/run --out ...`
    from avion_ds.engine.run_checkpoints import complete_tags

    tags = complete_tags(run)
    ev = json.loads(out.read_text())
    assert f"evaluating demo/run checkpoint {tags[-1]}" in log and ev["tag"] == tags[-1]  # the newest, named
    n_val = len((demo / "synth" / "val.csv").read_text().splitlines()) - 1
    assert ev["num_samples"] == n_val and len(ev["per_sample"]) == n_val
    assert {r["index"] for r in ev["per_sample"]} == set(range(n_val))
    assert ev["num_failed"] == 0 and ev["failed_samples"] == [] and trained["failed_samples"] == []
    assert ev["scores"].startswith("probabilities")  # one representation, named
    for key, value in ev["metrics"].items():
        assert value == pytest.approx(trained[key], abs=1e-3), key

    # export -> safetensors -> create_model(pretrained=...) reproduces the consolidated weights' logits
    weights = demo / "model.safetensors"  # demo.sh's `avion-ds export`
    from avion_ds.engine.export import consolidate
    from avion_ds.models import create_model

    recipe = yaml.safe_load((run / "recipe.yaml").read_text())
    frames, size = recipe["data"]["num_frames"], recipe["data"]["size"]
    kw = {"heads": {"verb": 4, "noun": 3}, "num_frames": frames, "img_size": size, "drop_path_rate": 0.0}
    loaded = create_model("vit_test_tiny", pretrained=str(weights), **kw).eval()
    ref = create_model("vit_test_tiny", **kw).eval()
    ref.load_state_dict(consolidate(run), strict=True)
    x = torch.randn(2, 3, frames, size, size)
    with torch.no_grad():
        a, b = loaded(x), ref(x)
    for head in ("verb", "noun"):
        torch.testing.assert_close(a[head], b[head], rtol=0, atol=0)

    # eval from the exported file gives the same per-sample scores as eval from the run dir
    out2 = tmp_path / "eval_file.json"
    _run(
        cli + ["eval", "--config", str(run / "recipe.yaml"), "--checkpoint", str(weights), "--out", str(out2)],
        docs,
    )
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
        ],
        docs,
    )
    assert "parameters offloaded to CPU memory; on the accelerator at most 100,000 live parameters" in said
    ev3 = json.loads(out3.read_text())
    assert ev3["tag"] == tags[-1]
    for key, value in ev["metrics"].items():
        assert ev3["metrics"][key] == pytest.approx(value, abs=1e-3), key
