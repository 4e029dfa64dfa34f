"""Video-text contrastive pretraining (AVION / LaViLa on Ego4D narrations), evaluated zero-shot on
EPIC-Kitchens-100 Multi-Instance Retrieval.

The model is a registered dual encoder (``clip_vit_*``); batches carry the narration tokens
(``batch["label"]["tokens"]``). The loss is AVION's ``ClipLoss`` (``tasks/contrastive/losses.py``), and a
gradient-accumulation window is ONE contrastive batch of micro x accum x world clips (feature cache:
``whole_window``). ``contrastive.freeze_temperature`` / ``freeze_visual`` / ``freeze_text`` freeze the
temperature or a tower; ``schedule.fix_lr`` keeps the lr constant (AVION ``--fix-lr``).

Evaluation (every ``eval.every_epochs``): on an ``epic_mir`` validation set, the zero-shot MIR protocol
of AVION's ``validate_mir``: every row's video and narration embedded, gathered from all ranks and put
back in CSV row order (the sampler's padding dropped), similarity ``(V T^T + 1) / 2`` in float32 with
the columns the sentence file lists, then mAP / nDCG both ways (``tasks.common.retrieval_metrics.mir_metrics``); the
best checkpoint is kept by ``avg_map``. Any other validation set gives the contrastive accuracies over
the whole set. Recipe defaults are AVION's ``main_lavila_pretrain.py`` defaults (:data:`CONTRASTIVE_DEFAULTS`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from avion_ds.config import ConfigError
from avion_ds.data.datasets.build import dataset_spec
from avion_ds.data.datasets.registry import names_of_kind
from avion_ds.data.tokenizer import tokenize
from avion_ds.distributed import dist
from avion_ds.distributed.master_weights import clamp_parameter_
from avion_ds.models.meta import meta_device
from avion_ds.tasks.base import EvalOutcome, LossParts, ModelSummary, Task, build_with_weights, check_token_merge
from avion_ds.tasks.common.retrieval_eval import evaluate_retrieval
from avion_ds.tasks.registry import register_task

if TYPE_CHECKING:
    from avion_ds.config import Recipe
    from avion_ds.tasks.base import EvalContext

# AVION scripts/main_lavila_pretrain.py defaults (get_args_parser); keys the recipe sets win
# the datasets it reads: video-text pairs (dataset registry label_kind)
PAIR_KINDS = ("narration", "retrieval")
CONTRASTIVE_DEFAULTS: dict[str, dict[str, Any]] = {
    "model": {"name": "clip_vit_base_patch16_224", "drop_path_rate": 0.0, "num_classes": 0},
    "data": {
        "dataset": "ego4d",
        "val_dataset": "epic_mir",
        "num_frames": 4,  # --clip-length 4
        "sampling": "segment",
        "fps": 30.0,  # video_loader(fps=30) for Ego4D
        "crop_scale": [0.5, 1.0],  # fast_rrc rrc_params (224, (0.5, 1.0))
        "mean_std": "openai",  # --norm-style openai
        "hflip": 0.0,
        "mixup": 0.0,
        "cutmix": 0.0,
        "label_smoothing": 0.0,
    },
    "optim": {
        "lr": 3e-5,  # --lr 3e-5, not scaled by the batch
        "scale_lr": False,
        "min_lr": 1e-5,  # --lr-end
        "betas": [0.9, 0.999],
        "eps": 1e-8,
        "weight_decay": 0.01,  # --wd
        "layer_decay": 1.0,
        "no_decay": "avion",
        "clip_grad": 0.0,  # --grad-clip-norm None
    },
    "schedule": {"epochs": 5, "warmup_epochs": 1.0, "warmup_start_lr": 1e-6},  # --lr-start 1e-6 (start_warmup_value)
}


def _encoder_kwargs(recipe: Recipe) -> dict[str, Any]:
    m, d = recipe.model, recipe.data
    own = {} if m.drop_path_schedule is None else {"drop_path_schedule": m.drop_path_schedule}
    if m.token_merge != 0:  # the video tower's; off: the registered model exactly
        own["token_merge"] = m.token_merge
    if m.patch_dropout:  # the video tower's, in training
        own["patch_dropout"] = m.patch_dropout
    if m.rlt_threshold:  # the video tower's, in training and evaluation; off: the registered model exactly
        own["rlt_threshold"] = m.rlt_threshold
    return own | {
        "num_frames": d.num_frames,
        "img_size": d.size,
        "drop_path_rate": m.drop_path_rate,
        "attn_backend": m.attn_backend,
        "patch_embed": m.patch_embed,
        "freeze_logit_scale": recipe.contrastive.freeze_temperature,
    }


def freeze_towers(model: nn.Module, recipe: Recipe) -> list[str]:
    """Turn off gradients of the towers the recipe freezes; their names."""
    c, frozen = recipe.contrastive, []
    for tower, flag in (("visual", c.freeze_visual), ("textual", c.freeze_text)):
        if flag:
            getattr(model, tower).requires_grad_(False)
            frozen.append(tower)
    return frozen


@register_task
class ContrastiveTask(Task):
    """Video-text contrastive pretraining (see module doc)."""

    name = "contrastive"
    recipe_defaults = CONTRASTIVE_DEFAULTS
    whole_window = True
    best_metric = "avg_map"

    def validate_recipe(self, recipe: Recipe) -> None:
        d, e, c = recipe.data, recipe.eval, recipe.contrastive
        pairs = names_of_kind(*PAIR_KINDS)
        if dataset_spec(d).label_kind not in PAIR_KINDS:
            raise ConfigError(
                f"task={recipe.task!r} with data.dataset={d.dataset!r}: contrastive pretraining reads "
                f"video-narration pairs ({', '.join(pairs)})"
            )
        if dataset_spec(d, "val").label_kind not in PAIR_KINDS:
            raise ConfigError(
                f"data.val_dataset={d.val_dataset!r}: the contrastive task evaluates on {' or '.join(pairs)}"
            )
        if e.temporal_views != 1 or e.spatial_views != 1:
            raise ConfigError(
                f"eval.temporal_views={e.temporal_views}, eval.spatial_views={e.spatial_views}: zero-shot "
                "retrieval embeds one view per clip (set both to 1)"
            )
        if c.freeze_visual and c.freeze_text:
            raise ConfigError(
                "contrastive.freeze_visual=true and contrastive.freeze_text=true: both towers frozen leave at most "
                "the temperature to train; unfreeze one tower"
            )
        if d.mixup or d.cutmix:
            raise ConfigError(f"data.mixup={d.mixup}, data.cutmix={d.cutmix}: mixing clips breaks video-text pairs")

    def check_model(self, recipe: Recipe) -> ModelSummary:
        from avion_ds.models import ClipArch, create_model, model_flops, registered_arch  # lazy: timm, torchvision
        from avion_ds.models.vit.model import count_params  # lazy: heavy (timm, torchvision)

        name = recipe.model.name
        base = registered_arch(name)
        if not isinstance(base, ClipArch):
            raise ConfigError(f"model.name={name!r} is not a video-text dual encoder (e.g. clip_vit_base_patch16_224)")
        if recipe.data.size % base.patch_size:
            raise ConfigError(
                f"data.size={recipe.data.size} is not divisible by the patch size {base.patch_size} of {name}"
            )
        kw = _encoder_kwargs(recipe)
        check_token_merge(recipe, name, kw)
        try:
            arch = registered_arch(name, **kw)
        except ValueError as e:
            raise ConfigError(f"model: {e}") from None
        with meta_device():
            model = create_model(name, pretrained=None, **{**kw, "attn_backend": "sdpa"})
        return ModelSummary(name, count_params(model), model_flops(arch) / 1e9, arch.vision.grid)

    def build_model(
        self,
        recipe: Recipe,
        pretrained: str | None = None,
        run_dir: Path | None = None,
        ds_config: dict[str, Any] | None = None,
    ) -> nn.Module:

        model = build_with_weights(recipe, _encoder_kwargs(recipe), pretrained, run_dir, ds_config)
        frozen = freeze_towers(model, recipe)
        if frozen and dist.is_main():
            print(f"frozen towers: {', '.join(frozen)}", flush=True)
        return model

    def after_step(self, engine: Any) -> None:
        """AVION's ``logit_scale.data.clamp_(0, 4.6052)`` after every step, master weight included."""
        from avion_ds.models.clip.model import LOGIT_SCALE_MAX  # lazy: heavy (timm, torchvision)

        scale = getattr(engine.module, "logit_scale", None)
        if scale is not None and scale.requires_grad:
            clamp_parameter_(engine.optimizer, scale, 0.0, LOGIT_SCALE_MAX)

    def label_classes(self, recipe: Recipe) -> int:
        return 0  # targets are narration tokens, passed through the augmentation untouched

    def synthetic_batch(self, recipe: Recipe, batch_size: int, device: torch.device | str = "cpu") -> dict[str, Any]:

        d = recipe.data
        frames = torch.randn(batch_size, 3, d.num_frames, d.size, d.size, device=device)
        tokens = tokenize([f"#C C moves object {i}" for i in range(batch_size)]).to(device)
        return {"frames": frames, "label": {"tokens": tokens}}

    # ------------------------------------------------------------------ the loss
    def loss(
        self, model: Callable[..., Any], x: torch.Tensor, targets: Any, dtype: torch.dtype, recipe: Recipe
    ) -> LossParts:
        return next(iter(self.window_losses(model, [x], [targets], dtype, recipe)))

    def window_losses(
        self, model: Callable[..., Any], xs: list[torch.Tensor], targets: list[Any], dtype: torch.dtype, recipe: Recipe
    ) -> Iterator[LossParts]:
        from avion_ds.tasks.contrastive.losses import feature_cache_losses  # lazy: imports avion_ds.models

        def encode(i: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            out = model(xs[i].to(dtype), targets[i]["tokens"])
            return out.video, out.text, out.logit_scale

        return feature_cache_losses(encode, len(xs), self.pair_loss())

    def pair_loss(self) -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor], LossParts]:
        """The loss of a batch of (video, text, logit scale) over all ranks: AVION's ClipLoss here."""
        from avion_ds.tasks.contrastive.losses import clip_loss  # lazy: imports avion_ds.models

        return clip_loss

    # ------------------------------------------------------------------ evaluation
    def evaluate(self, ctx: EvalContext) -> EvalOutcome:
        return evaluate_retrieval(ctx)

    def eval_line(self, metrics: dict[str, float], report: dict[str, Any] | None = None) -> str:
        line = " ".join(f"{k}={v:.3f}" for k, v in metrics.items())
        r = report or {}
        if "t2v_rprecision" in r:  # the headline of a retrieval eval (docs/video_text.md)
            line += f" | text->video R-precision {r['t2v_rprecision']:.1f}% (chance {r['t2v_rprecision_chance']:.1f}%)"
        return line
