"""A Trainer over a tiny model in the test process (one rank, DeepSpeed's CPU accelerator)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from avion_ds.distributed import dist
from avion_ds.distributed.ds_config import build_ds_config
from avion_ds.engine.parallelize import parallelize
from avion_ds.engine.trainer import Trainer
from avion_ds.tasks import Task, load_recipe, task_of

REPO = Path(__file__).resolve().parents[2]


def tiny_trainer(
    config: str, run_dir: Path, *overrides: str, accum: int = 2, task: Task | None = None, **kw: Any
) -> Trainer:
    """vit_test_tiny (4 frames of 32x32, 5 classes), micro-batch 2 x ``accum``, fp32, ``ds_configs/<config>``;
    ``task`` replaces the recipe's (fine-tuning) task object, e.g. with a test subclass."""
    dist.init()
    recipe = load_recipe(
        None,
        [
            "model.name=vit_test_tiny",
            "model.num_classes=5",
            "data.dataset=kinetics",
            "data.num_frames=4",
            "data.size=32",
            "batch.micro_batch=2",
            f"batch.global_batch={2 * accum}",
            "precision=fp32",
            "optim.clip_grad=1.0",
            "schedule.epochs=1",
            f"output_dir={run_dir}",
            *overrides,
        ],
    )
    cfg = build_ds_config(REPO / "ds_configs" / config, recipe, 1, steps_per_epoch=100)
    torch.manual_seed(0)
    task = task or task_of(recipe)
    parallel = parallelize(task.build_model(recipe, ds_config=cfg), recipe, cfg, steps_per_epoch=100)
    return Trainer(parallel, recipe, task, **kw)


def batches(seed: int = 0) -> Iterator[dict[str, torch.Tensor]]:
    """Endless model-ready micro-batches (no augmentation) with integer labels."""
    g = torch.Generator().manual_seed(seed)
    for _ in itertools.count():
        yield {"frames": torch.randn(2, 3, 4, 32, 32, generator=g), "label": torch.randint(0, 5, (2,), generator=g)}
