"""Pretraining's evaluation picture (``Task.eval_images``): the reconstruction grid of ``avion-ds reconstruct``
(original / masked / reconstruction, rows named) for the validation set's first clip, its masks as validation
draws them, through the model being trained (the engine's forward: ZeRO-3 included)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from avion_ds.tasks.common.evaluation import eval_mode
from avion_ds.tasks.common.pictures import upscale
from avion_ds.tasks.pretrain.reconstruct import named_rows, prediction_grid

if TYPE_CHECKING:
    from avion_ds.tasks.base import EvalContext

TAG = "eval/reconstruction"
FRAMES = 4  # columns, as `avion-ds reconstruct --frames` defaults
MIN_ROW_PX = 128  # small clips are upscaled (nearest) to rows of at least this height


@torch.no_grad()
def eval_images(ctx: EvalContext) -> dict[str, np.ndarray]:
    """``{"eval/reconstruction": grid}`` of the validation set's first clip (every rank runs the forward)."""
    loader, model, device = ctx.loader, ctx.model, ctx.device
    if len(loader.dataset) == 0:
        return {}
    batch = loader.collate_fn([loader.dataset[0]])
    x, masks = ctx.augment(batch["frames"].to(device), {k: v.to(device) for k, v in batch["label"].items()})
    x, masks = x[:1], {k: v[:1] for k, v in masks.items()}
    with eval_mode(model):
        out = model(x, **masks)  # float32 frames, as in the loss: the model casts them
    decode = masks["mask"] if "decode_mask" not in masks else ~masks["decode_mask"]
    arch = getattr(model, "module", model).arch
    grid = prediction_grid(arch, x, masks["mask"], out.pred, decode, FRAMES)
    return {TAG: named_rows(upscale(grid, 3 * MIN_ROW_PX))}
