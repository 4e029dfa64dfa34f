"""Same seed, same machine, same numbers: two identical tiny runs give identical losses, metrics and weights.

CPUs round differently (oneDNN kernels, vector widths), so the README's demo numbers can differ on another
machine; on ONE machine a run must reproduce itself exactly (random crops, flips, drop path, data order,
a loader worker and ZeRO-2 included).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.helpers import QUICK_DATA, REPO, launch, losses, write_recipe

pytestmark = pytest.mark.multiprocess


def _train(data: dict, run: Path, tmp: Path) -> None:
    recipe = write_recipe(
        tmp / f"{run.name}.yaml",
        data,
        run,
        data={**QUICK_DATA, "workers": 1, "crop_scale": [0.5, 1.0]},
        schedule={"epochs": 1, "warmup_epochs": 0.5},
        checkpoint={"every_steps": 0},
    )
    proc = launch(
        ["--config", recipe, "--deepspeed_config", REPO / "ds_configs" / "zero2.json"],
        nprocs=1,
        launcher="python",
        timeout=300,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]


@pytest.mark.timeout(600)
def test_two_runs_on_one_machine_are_identical(tiny_epic_quick: dict, tmp_path: Path) -> None:
    from avion_ds.storage.run_dir import consolidate

    runs = [tmp_path / "a", tmp_path / "b"]
    for run in runs:
        _train(tiny_epic_quick, run, tmp_path)
    first, second = (losses(r) for r in runs)
    assert len(first) >= 3 and first == second  # every logged loss, bit for bit
    metrics = [json.loads((r / "metrics.json").read_text()) for r in runs]
    assert metrics[0] == metrics[1]
    weights = [consolidate(r) for r in runs]
    assert weights[0].keys() == weights[1].keys()
    for key, value in weights[0].items():
        assert torch.equal(value, weights[1][key]), key
