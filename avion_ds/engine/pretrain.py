"""``task: pretrain`` — masked-autoencoder pretraining on the fine-tuning engine.

The training loop (:mod:`avion_ds.engine.train`) stays one loop; for pretraining it builds the
registered ``pretrain_videomae_*`` model through the same ``build_model`` path, feeds the masks the
``videos`` dataset drew per clip (``batch["label"]`` = ``{"mask"[, "decode_mask"]}``) into the model
as keyword arguments, and takes the model's own reconstruction loss. The recipe's pretraining
defaults (AdamW betas 0.9/0.95, wd 0.05, lr 1.5e-4 per 256 clips, 40 warmup epochs, cosine, no
layer decay, no flip / mixup) come from :data:`avion_ds.config.PRETRAIN_DEFAULTS`; weight decay
skips the mask token, positions, norms and biases (``VideoMAEPretrain.no_weight_decay``).

Validation reports the reconstruction loss next to the predict-zero baseline (the loss of an all-
zero prediction; about 1.0 with ``norm_pix_loss``) and their ratio.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from avion_ds.config import Recipe
from avion_ds.data.augment import MEAN_STD
from avion_ds.data.masking import MaskSpec
from avion_ds.engine import dist


def is_pretrain(recipe: Recipe) -> bool:
    return recipe.task == "pretrain"


def model_options(recipe: Recipe) -> dict[str, Any]:
    """create_model keyword arguments of a pretraining recipe (input size follows the data section)."""
    m, d = recipe.model, recipe.data
    mean, std = MEAN_STD[d.mean_std]
    kw: dict[str, Any] = {"num_frames": d.num_frames, "img_size": d.size, "drop_path_rate": m.drop_path_rate,
                          "attn_backend": m.attn_backend, "patch_embed": m.patch_embed, "pos_embed": m.pos_embed,
                          "norm_pix_loss": recipe.pretrain.norm_pix_loss, "mean": mean, "std": std}
    if m.tubelet_size is not None:
        kw["tubelet_size"] = m.tubelet_size
    return kw


def build_pretrain_model(recipe: Recipe, pretrained: str | None = None) -> torch.nn.Module:
    """The recipe's pretraining model (``model.pretrained`` / ``pretrained``: any pretraining format)."""
    from avion_ds.models import create_model

    source = pretrained if pretrained is not None else (recipe.model.pretrained or None)
    return create_model(recipe.model.name, pretrained=source, **model_options(recipe))


def mask_spec(recipe: Recipe) -> MaskSpec:
    """The per-clip masks the recipe asks for, on the model's token grid (nothing is built)."""
    from avion_ds.models import get_mae_arch

    grid = get_mae_arch(recipe.model.name, **model_options(recipe)).encoder.grid
    p = recipe.pretrain
    return MaskSpec(grid, p.mask_type, p.mask_ratio, p.decoder_mask_type, p.decoder_mask_ratio).validate()


def attach_masks(recipe: Recipe, *datasets: Any) -> MaskSpec:
    """Give the ``videos`` datasets their MaskSpec (masks are drawn loader-side, per clip)."""
    spec = mask_spec(recipe)
    for ds in datasets:
        ds.masks = spec
    return spec


def reconstruction_loss(out: Any) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The model's own loss (``MAEOutput.loss`` or a tensor), in the shape ``total_loss`` returns."""
    return (out.loss if hasattr(out, "loss") else out), {}


@torch.no_grad()
def evaluate_pretrain(model: Callable[..., Any], loader: Any, augment: Callable, device: torch.device,
                      dtype: torch.dtype = torch.float32) -> dict[str, float]:
    """Validation reconstruction loss, the predict-zero baseline and loss / baseline, over all ranks.

    Both are means over every scored token (decoded and hidden from the encoder, as the model's loss)
    of the whole val set: per-clip sums are gathered by dataset index and the DistributedSampler's
    padding repeats dropped (as classification eval does), so ranks and batching do not change them.
    """
    from avion_ds.engine.metrics import PredictionStore
    from avion_ds.models.pretrain import pixel_targets

    was_training = getattr(model, "training", False)
    if hasattr(model, "eval"):
        model.eval()
    arch = getattr(model, "module", model).arch
    store = PredictionStore()
    for batch in loader:
        frames = batch["frames"].to(device, non_blocking=True)
        x, masks = augment(frames, {k: v.to(device) for k, v in batch["label"].items()})
        out = model(x, **masks)  # float32 frames: the model casts them and computes its targets in fp32
        decode = masks["mask"] if "decode_mask" not in masks else ~masks["decode_mask"]
        b = x.shape[0]
        targets = pixel_targets(x, arch)[decode].reshape(b, -1, out.pred.shape[-1])
        weight = masks["mask"][decode].reshape(b, -1).float()  # the model's loss weights, in pred's order
        sums = torch.stack([((out.pred.float() - targets).pow(2).mean(dim=-1) * weight).sum(dim=1),
                            (targets.pow(2).mean(dim=-1) * weight).sum(dim=1), weight.sum(dim=1)], dim=1)
        store.add(batch["index"], sums.double(), torch.zeros(b))
    if was_training and hasattr(model, "train"):
        model.train()
    _, sums, _ = store.gather()  # every rank's clips, each dataset index once
    loss_sum, zero_sum, weight = (float(v) for v in sums.sum(dim=0)) if sums.numel() else (0.0, 0.0, 0.0)
    weight = max(weight, 1.0)
    loss, zero = loss_sum / weight, zero_sum / weight
    return {"recon_loss": loss, "zero_baseline": zero, "recon_vs_zero": loss / max(zero, 1e-12)}


def fit_clips(model: torch.nn.Module, clips: torch.Tensor, spec: MaskSpec, steps: int, lr: float,
              batch_size: int, seed: int = 0, weight_decay: float = 0.05) -> list[float]:
    """A plain one-process AdamW loop (betas 0.9/0.95) over cached, normalised clips (B, C, T, H, W)
    with fresh masks every step; for quick learning checks (tests, bench/pretrain_learn.py). Real
    runs go through ``avion-ds train``. Returns the loss of every step."""
    import numpy as np

    from avion_ds.engine.optim import param_groups

    rng = np.random.default_rng(seed)
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(param_groups(model, weight_decay), lr=lr, betas=(0.9, 0.95))
    model.train()
    out = []
    for _ in range(steps):
        idx = torch.randint(len(clips), (batch_size,), generator=gen)
        drawn = [spec.draw(rng) for _ in range(batch_size)]
        masks = {k: torch.from_numpy(np.stack([d[k] for d in drawn])) for k in drawn[0]}
        loss = model(clips[idx], **masks).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        out.append(float(loss.detach()))
    return out


def run_eval(args: Any, recipe: Recipe) -> int:
    """`avion-ds eval` of a pretraining run or weights file: reconstruction loss vs predict-zero, JSON out."""
    import json
    from pathlib import Path

    from deepspeed.accelerator import get_accelerator

    from avion_ds.data import DeviceAugment, build_dataset, build_loader

    _, world, _ = dist.init()
    device = torch.device(get_accelerator().current_device_name())
    model = build_pretrain_model(recipe, pretrained=str(args.checkpoint)).to(device).eval()
    dataset = build_dataset(recipe.data, args.split, seed=recipe.seed)
    attach_masks(recipe, dataset)
    loader = build_loader(dataset, recipe.eval.batch_size or recipe.batch.micro_batch, recipe.data.workers,
                          shuffle=False, seed=recipe.seed, drop_last=False, distributed=world > 1)
    metrics = evaluate_pretrain(model, loader, DeviceAugment(recipe.data, 0, train=False), device)
    if dist.is_main():
        ckpt = Path(args.checkpoint)
        out = Path(args.out) if args.out else (ckpt if ckpt.is_dir() else ckpt.parent) / "eval_metrics.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"checkpoint": str(ckpt), "split": args.split, "num_samples": len(dataset),
                                   "metrics": metrics}) + "\n")
        print(" ".join(f"{k}={v:.4f}" for k, v in metrics.items()), flush=True)
        print(f"wrote {out} ({len(dataset)} clips)", flush=True)
    del model
    return 0
