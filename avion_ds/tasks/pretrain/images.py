"""Pretraining's evaluation picture (``Task.eval_images``): the reconstruction grid of ``avion-ds reconstruct``
(original / masked / reconstruction, rows named) for the validation set's first clip, its masks as validation
draws them, through the model being trained (the engine's forward: ZeRO-3 included)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from avion_ds.tasks.common.pictures import upscale
from avion_ds.tasks.pretrain.reconstruct import named_rows, prediction_grid

if TYPE_CHECKING:
    from avion_ds.config import Recipe
    from avion_ds.tasks.base import EvalOutcome, Task

TAG = "eval/reconstruction"
FRAMES = 4  # columns, as `avion-ds reconstruct --frames` defaults
MIN_ROW_PX = 128  # small clips are upscaled (nearest) to rows of at least this height


@torch.no_grad()
def eval_images(
    task: Task,
    model: Callable[..., Any],
    loader: Any,
    augment: Callable,
    device: torch.device,
    dtype: torch.dtype,
    recipe: Recipe,
    outcome: EvalOutcome,
) -> dict[str, np.ndarray]:
    """``{"eval/reconstruction": grid}`` of the validation set's first clip (every rank runs the forward)."""
    if len(loader.dataset) == 0:
        return {}
    batch = loader.collate_fn([loader.dataset[0]])
    x, masks = augment(batch["frames"].to(device), {k: v.to(device) for k, v in batch["label"].items()})
    x, masks = x[:1], {k: v[:1] for k, v in masks.items()}
    was_training = getattr(model, "training", False)
    if hasattr(model, "eval"):
        model.eval()
    out = model(x, **masks)  # float32 frames, as in the loss: the model casts them
    if was_training and hasattr(model, "train"):
        model.train()
    decode = masks["mask"] if "decode_mask" not in masks else ~masks["decode_mask"]
    arch = getattr(model, "module", model).arch
    grid = prediction_grid(arch, x, masks["mask"], out.pred, decode, FRAMES)
    return {TAG: named_rows(upscale(grid, 3 * MIN_ROW_PX))}
