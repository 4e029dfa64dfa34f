"""An out-of-memory error in a training step ends the run with ONE line (model, micro-batch,
planner prediction, next knob) and exit code 1. The error is injected in the step on CPU."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO, engine_env, write_recipe

INJECT = """
import sys, torch
import avion_ds.cli.train as train
from avion_ds.tasks import register_task
from avion_ds.tasks.finetune.task import FinetuneTask
@register_task
class OomTask(FinetuneTask):
    name = "finetune_oom_injected"
    def loss(self, *a, **k):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (injected)")
sys.exit(train.main([*sys.argv[1:], "--set", "task=finetune_oom_injected"]))
"""


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_oom_in_step_is_one_line_exit_1(tiny_epic: dict, tmp_path: Path) -> None:
    recipe = write_recipe(
        tmp_path / "r.yaml",
        tiny_epic,
        tmp_path / "run",
        model={"activation_checkpointing": True, "activation_checkpoint_every": 1},
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            INJECT,
            "--config",
            str(recipe),
            "--deepspeed_config",
            str(REPO / "ds_configs" / "zero2.json"),
        ],
        cwd=REPO,
        env=engine_env(),
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if "out of memory" in ln]
    assert len(lines) == 1, proc.stderr[-3000:]
    line = lines[0]
    assert line.startswith("avion-ds train: error: out of memory (CUDA out of memory. Tried to allocate 2.00 GiB")
    assert "model vit_test_tiny" in line and "micro-batch 4" in line
    assert "planner predicts" in line and "per GPU" in line
    # checkpointing is on for every block and micro-batch 4 > 1: halve the micro-batch next
    assert "try a smaller micro-batch (--set batch.micro_batch=2" in line
