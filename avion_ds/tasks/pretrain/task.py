"""Masked-autoencoder pretraining (VideoMAE / VideoMAE V2) on the same engine as fine-tuning.

The model is a registered ``pretrain_videomae_*`` model; the ``videos`` dataset draws the masks per clip
(``batch["label"]`` = ``{"mask"[, "decode_mask"]}``), which reach the model as keyword arguments, and the
loss is the model's own reconstruction loss (targets computed from the float32 frames). Recipe defaults
(AdamW betas 0.9/0.95, wd 0.05, lr 1.5e-4 per 256 clips, 40 warmup epochs, cosine, no layer decay, no
flip / mixup) are :data:`PRETRAIN_DEFAULTS`; weight decay skips the mask token, positions, norms and biases
(``VideoMAEPretrain.no_weight_decay``). Validation reports the reconstruction loss next to the
predict-zero baseline (the loss of an all-zero prediction; about 1.0 with ``norm_pix_loss``) and their ratio.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from avion_ds.config import ConfigError
from avion_ds.config.normalization import MEAN_STD
from avion_ds.data.datasets.build import dataset_spec, split_view
from avion_ds.data.datasets.registry import names_of_kind
from avion_ds.data.masking import MaskSpec
from avion_ds.distributed.ds_plan import DSPlan
from avion_ds.models.meta import meta_device
from avion_ds.tasks.base import EvalContext, EvalOutcome, LossParts, ModelSummary, Task, build_with_weights
from avion_ds.tasks.common.evaluation import eval_mode
from avion_ds.tasks.common.predictions import PredictionStore
from avion_ds.tasks.registry import register_task

if TYPE_CHECKING:
    from avion_ds.config import Recipe

# this task's recipe defaults (VideoMAE pretraining); keys the recipe sets win
PRETRAIN_DEFAULTS: dict[str, dict[str, Any]] = {
    "model": {"name": "pretrain_videomae_base_patch16_224", "drop_path_rate": 0.0, "num_classes": 0},
    "data": {
        "dataset": "videos",
        "sampling": "stride",
        "hflip": 0.0,
        "mixup": 0.0,
        "cutmix": 0.0,
        "label_smoothing": 0.0,
    },
    "optim": {"lr": 1.5e-4, "betas": [0.9, 0.95], "weight_decay": 0.05, "layer_decay": 1.0, "min_lr": 1e-5},
    "schedule": {"epochs": 800, "warmup_epochs": 40.0},
}


def model_options(recipe: Recipe) -> dict[str, Any]:
    """create_model keyword arguments of a pretraining recipe (input size follows the data section)."""

    m, d = recipe.model, recipe.data
    mean, std = MEAN_STD[d.mean_std]
    kw: dict[str, Any] = {
        "num_frames": d.num_frames,
        "img_size": d.size,
        "drop_path_rate": m.drop_path_rate,
        "attn_backend": m.attn_backend,
        "patch_embed": m.patch_embed,
        "norm_pix_loss": recipe.pretrain.norm_pix_loss,
        "mean": mean,
        "std": std,
    }
    for key in ("pos_embed", "drop_path_schedule"):  # unset: the registered encoder's own (sincos, linear)
        if getattr(m, key) is not None:
            kw[key] = getattr(m, key)
    if m.tubelet_size is not None:
        kw["tubelet_size"] = m.tubelet_size
    return kw


def build_pretrain_model(recipe: Recipe, pretrained: str | None = None) -> nn.Module:
    """The recipe's pretraining model (``model.pretrained`` / ``pretrained``: any pretraining format)."""
    from avion_ds.models import create_model  # lazy: heavy (timm, torchvision)

    source = pretrained if pretrained is not None else (recipe.model.pretrained or None)
    return create_model(recipe.model.name, pretrained=source or None, **model_options(recipe))


def checkpoint_overrides(recipe: Recipe, source: str, options: dict[str, Any]) -> dict[str, Any]:
    """The architecture a pretraining checkpoint fixes beyond the recipe (decoder width / depth, a Hugging
    Face config's LayerNorm eps); an unreadable file or an impossible size is one line (ConfigError)."""
    from avion_ds.models.mae.sizes import file_overrides  # lazy: heavy (timm, torchvision)
    from avion_ds.models.weights.checkpoint import checkpoint_state_dict, read_checkpoint  # lazy: heavy (timm)

    try:
        sd = checkpoint_state_dict(read_checkpoint(source, recipe.model.trust_checkpoint))
        return file_overrides(recipe.model.name, source, sd, options)
    except (OSError, ValueError, TypeError) as e:  # not found, unreadable, untrusted pickle, bad decoder width
        msg = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ConfigError(f"model.pretrained={source}: {msg}") from None


def mask_spec(recipe: Recipe) -> MaskSpec:
    """The per-clip masks the recipe asks for, on the model's token grid (nothing is built)."""
    from avion_ds.models import pretrain_arch  # lazy: heavy (timm, torchvision)

    grid = pretrain_arch(recipe.model.name, **model_options(recipe)).encoder.grid
    p = recipe.pretrain
    return MaskSpec(grid, p.mask_type, p.mask_ratio, p.decoder_mask_type, p.decoder_mask_ratio).validate()


@register_task
class PretrainTask(Task):
    """Masked-autoencoder pretraining (see module doc)."""

    name = "pretrain"
    recipe_defaults = PRETRAIN_DEFAULTS

    def validate_recipe(self, recipe: Recipe) -> None:
        d, p = recipe.data, recipe.pretrain
        if dataset_spec(d).label_kind != "none":
            raise ConfigError(
                f"task={recipe.task!r} with data.dataset={d.dataset!r}: pretraining uses "
                f"data.dataset {' / '.join(map(repr, names_of_kind('none')))} (unlabelled clips), fine-tuning a "
                "labelled dataset"
            )
        if recipe.model.token_merge != 0:
            raise ConfigError(
                f"model.token_merge={recipe.model.token_merge!r}: token merging is a fine-tuning / contrastive "
                "option; the masked-autoencoder encoder does not merge tokens"
            )
        if recipe.model.patch_dropout:
            raise ConfigError(
                f"model.patch_dropout={recipe.model.patch_dropout!r}: masked pretraining already hides "
                "pretrain.mask_ratio of the patches; patch dropout is a fine-tuning / contrastive option"
            )
        if recipe.model.rlt_threshold:
            raise ConfigError(
                f"model.rlt_threshold={recipe.model.rlt_threshold!r}: masked pretraining already hides "
                "pretrain.mask_ratio of the patches; run-length tokenization is a fine-tuning / contrastive option"
            )
        for key, value in (
            ("pretrain.mask_ratio", p.mask_ratio),
            ("pretrain.decoder_mask_ratio", p.decoder_mask_ratio),
        ):
            if not 0.0 < value < 1.0:
                raise ConfigError(f"{key}={value} must be in (0, 1)")
        spec, v = split_view(d, "train", recipe.sections)  # the unlabelled dataset's own keys, where it has them
        clips, scales = getattr(v, "clips_per_video", 1), getattr(v, "multi_scale", [1.0])
        if clips <= 0:
            raise ConfigError(f"{spec.name}.clips_per_video={clips} must be positive")
        if not scales or not all(0 < s <= 1 for s in scales):
            raise ConfigError(f"{spec.name}.multi_scale={scales} must be a non-empty list in (0, 1]")

    def check_model(self, recipe: Recipe) -> ModelSummary:
        from avion_ds.models import create_model, model_flops, pretrain_arch  # lazy: heavy (timm, torchvision)
        from avion_ds.models.vit.model import count_params  # lazy: heavy (timm, torchvision)

        name = recipe.model.name
        try:
            enc = pretrain_arch(name, **model_options(recipe)).encoder
        except (ValueError, TypeError) as e:
            raise ConfigError(f"model: {e}") from None
        with meta_device():  # FLOPs: the encoder over the whole clip (the masked share is less)
            model = create_model(name, pretrained=None, **{**model_options(recipe), "attn_backend": "eager"})
        return ModelSummary(name, count_params(model), model_flops(enc) / 1e9, enc.grid)

    def build_model(
        self,
        recipe: Recipe,
        pretrained: str | None = None,
        run_dir: Path | None = None,
        ds_config: dict[str, Any] | None = None,
    ) -> nn.Module:
        source = pretrained if pretrained is not None else recipe.model.pretrained
        if source and DSPlan.of(ds_config).zero_stage == 3:
            raise ConfigError(
                f"model.pretrained={source}: continuing a pretraining run from weights under ZeRO-3 "
                "is not supported yet; resume from the run's checkpoint instead"
            )
        kw = model_options(recipe)
        if source:  # the decoder's size (and a Hugging Face config's eps) come from the file
            kw = {**kw, **checkpoint_overrides(recipe, str(source), kw)}
        # loaded and reported as every task's weights are: one line, pretrained_report.json, the coverage check
        return build_with_weights(recipe, kw, str(source or ""), run_dir, ds_config)

    def prepare_datasets(self, recipe: Recipe, *datasets: Any) -> None:
        spec = mask_spec(recipe)  # masks are drawn loader-side, per clip
        for ds in datasets:
            ds.masks = spec

    def label_classes(self, recipe: Recipe) -> int:
        return 0

    def synthetic_batch(self, recipe: Recipe, batch_size: int, device: torch.device | str = "cpu") -> dict[str, Any]:

        d, spec = recipe.data, mask_spec(recipe)
        drawn = [spec.draw(np.random.default_rng(i)) for i in range(batch_size)]
        masks = {k: torch.from_numpy(np.stack([m[k] for m in drawn])).to(device) for k in drawn[0]}
        frames = torch.randn(batch_size, 3, d.num_frames, d.size, d.size, device=device)
        return {"frames": frames, "label": masks}

    def loss(
        self, model: Callable[..., Any], x: torch.Tensor, targets: Any, dtype: torch.dtype, recipe: Recipe
    ) -> LossParts:
        out = model(x, **targets)  # float32 frames: the model casts them and computes its targets in fp32
        return (out.loss if hasattr(out, "loss") else out), {}

    def evaluate(self, ctx: EvalContext) -> EvalOutcome:
        return EvalOutcome(evaluate_pretrain(ctx), num_samples=len(ctx.loader.dataset))

    def eval_images(self, ctx: EvalContext, outcome: EvalOutcome) -> dict[str, np.ndarray]:
        """The reconstruction grid of the validation set's first clip (``eval/reconstruction``)."""
        from avion_ds.tasks.pretrain.images import eval_images  # lazy: Pillow (the row names), only with TensorBoard

        return eval_images(ctx)

    def eval_line(self, metrics: dict[str, float], report: dict[str, Any] | None = None) -> str:
        return " ".join(f"{k}={v:.4f}" for k, v in metrics.items())


@torch.no_grad()
def evaluate_pretrain(ctx: EvalContext) -> dict[str, float]:
    """Validation reconstruction loss, the predict-zero baseline and loss / baseline, over all ranks.

    Both are means over every scored token (decoded and hidden from the encoder, as the model's loss)
    of the whole val set: per-clip sums are gathered by dataset index and the DistributedSampler's
    padding repeats dropped (as classification eval does), so ranks and batching do not change them.
    """
    from avion_ds.models.mae.model import pixel_targets  # lazy: heavy (timm, torchvision)

    model, device = ctx.model, ctx.device
    arch = getattr(model, "module", model).arch
    store = PredictionStore()
    with eval_mode(model):
        for batch in ctx.loader:
            frames = batch["frames"].to(device, non_blocking=True)
            x, masks = ctx.augment(frames, {k: v.to(device) for k, v in batch["label"].items()})
            out = model(x, **masks)  # float32 frames: the model casts them and computes its targets in fp32
            decode = masks["mask"] if "decode_mask" not in masks else ~masks["decode_mask"]
            b = x.shape[0]
            targets = pixel_targets(x, arch)[decode].reshape(b, -1, out.pred.shape[-1])
            weight = masks["mask"][decode].reshape(b, -1).float()  # the model's loss weights, in pred's order
            sums = torch.stack(
                [
                    ((out.pred.float() - targets).pow(2).mean(dim=-1) * weight).sum(dim=1),
                    (targets.pow(2).mean(dim=-1) * weight).sum(dim=1),
                    weight.sum(dim=1),
                ],
                dim=1,
            )
            store.add(batch["index"], sums.double(), torch.zeros(b))
    _, sums, _ = store.gather()  # every rank's clips, each dataset index once
    loss_sum, zero_sum, weight = (float(v) for v in sums.sum(dim=0)) if sums.numel() else (0.0, 0.0, 0.0)
    weight = max(weight, 1.0)
    loss, zero = loss_sum / weight, zero_sum / weight
    return {"recon_loss": loss, "zero_baseline": zero, "recon_vs_zero": loss / max(zero, 1e-12)}
