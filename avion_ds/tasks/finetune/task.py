"""Fine-tuning a video ViT classifier: one head (Kinetics, SSv2) or several (EPIC verb + noun), or EPIC's
ONE action head as AVION trains it (``epic.label: action``, ``model.heads: {action: N}``).

Loss: cross-entropy per head (label smoothing / mixup targets from the device augmentation), summed;
evaluation: multi-view softmax averaged per clip, top-k / mean-class (EPIC: verb, noun, action; the action
head adds AVION's metrics, :mod:`avion_ds.tasks.common.action_head_metrics`), the protocol report and per-sample scores;
TensorBoard gets a confusion matrix per head at each evaluation.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from avion_ds.config import ConfigError
from avion_ds.data.datasets.build import dataset_spec, split_view
from avion_ds.data.datasets.epic_actions import MAP_ORDER
from avion_ds.data.datasets.protocols import eval_report
from avion_ds.data.datasets.registry import heads_keys, names_of_kind, section_value
from avion_ds.models.meta import meta_device
from avion_ds.tasks.base import (
    EvalOutcome,
    LossParts,
    ModelSummary,
    Task,
    build_with_weights,
    check_token_merge,
    maps_kinetics710_head,
)
from avion_ds.tasks.common.action_head_metrics import action_head_metrics
from avion_ds.tasks.common.classification_metrics import SCORES
from avion_ds.tasks.common.evaluation import confusion_images, evaluate_model
from avion_ds.tasks.common.predictions import per_sample_records
from avion_ds.tasks.finetune.losses import total_loss
from avion_ds.tasks.registry import register_task

if TYPE_CHECKING:
    from avion_ds.config import Recipe
    from avion_ds.tasks.base import EvalContext


def dataset_heads(recipe: Recipe) -> tuple[str, ...] | None:
    """The label heads ``data.dataset`` declares in the dataset registry (None = one integer label)."""
    spec, view = split_view(recipe.data, "train", recipe.sections)
    return spec.label_heads(view)


def model_kwargs(recipe: Recipe) -> dict[str, Any]:
    """The ``create_model`` keyword arguments a recipe implies (frames/size from the data section)."""
    m = recipe.model
    kw: dict[str, Any] = {
        "num_frames": recipe.data.num_frames,
        "img_size": recipe.data.size,
        "drop_path_rate": m.drop_path_rate,
        "head_drop_rate": m.head_drop_rate,
        "head_init": m.head_init,
        "attn_backend": m.attn_backend,
        "patch_embed": m.patch_embed,
    }
    for key in ("pool", "pos_embed", "drop_path_schedule"):  # unset: the registered model's own (VideoMAE mean /
        # sincos / linear, CLIP layout cls / clip / uniform)
        if getattr(m, key) is not None:
            kw[key] = getattr(m, key)
    if m.tubelet_size is not None:
        kw["tubelet_size"] = m.tubelet_size
    if m.token_merge != 0:  # off: the registered model exactly
        kw["token_merge"] = m.token_merge
    if m.patch_dropout:
        kw["patch_dropout"] = m.patch_dropout
    if m.rlt_threshold:  # off: the registered model exactly
        kw["rlt_threshold"] = m.rlt_threshold
    if m.heads is not None:
        kw["heads"] = dict(m.heads)
    else:
        kw["num_classes"] = m.num_classes
    return kw


def check_heads(recipe: Recipe) -> None:
    """The model's heads must be the labels the dataset yields (EPIC: verb + noun or action; Kinetics: one)."""
    want = dataset_heads(recipe)
    heads = recipe.model.heads
    if want is None:
        if heads is not None:
            raise ConfigError(
                f"model.heads={heads} but data.dataset={recipe.data.dataset!r} yields one integer "
                "label; use model.num_classes instead of model.heads"
            )
        return
    if heads is None or set(heads) != set(want):
        spec, view = split_view(recipe.data, "train", recipe.sections)
        key = spec.heads_key
        label = f", {key}={section_value(recipe.sections, key)!r}" if key else ""
        raise ConfigError(
            f"model.heads={heads} does not match the labels of data.dataset={recipe.data.dataset!r}{label}: "
            f"it needs exactly the heads {', '.join(want)} (e.g. {spec.heads_text(view, want)})"
        )


@register_task
class FinetuneTask(Task):
    """Supervised classification (see module doc)."""

    name = "finetune"

    def validate_recipe(self, recipe: Recipe) -> None:
        d = recipe.data
        spec = dataset_spec(d)
        if spec.label_kind == "none":
            raise ConfigError(
                f"task={recipe.task!r} with data.dataset={d.dataset!r}: fine-tuning needs a labelled "
                f"dataset ({', '.join(names_of_kind('class'))}); unlabelled clips are for task: pretrain"
            )
        for key, owners in heads_keys().items():  # a heads choice of another dataset (epic.label)
            value = section_value(recipe.sections, key)
            if value != section_value({}, key) and spec.heads_key != key:
                raise ConfigError(
                    f"{key}={value!r} applies to data.dataset={' / '.join(map(repr, owners))} only "
                    f"(recipe has {d.dataset!r}); remove it"
                )

    def check_model(self, recipe: Recipe) -> ModelSummary:
        from avion_ds.models import create_model, model_flops, registered_arch  # lazy: heavy (timm, torchvision)
        from avion_ds.models.vit.model import count_params  # lazy: heavy (timm, torchvision)

        check_heads(recipe)
        name = recipe.model.name
        base = registered_arch(name)
        tubelet = recipe.model.tubelet_size or base.tubelet_size
        if recipe.data.size % base.patch_size:
            raise ConfigError(
                f"data.size={recipe.data.size} is not divisible by the patch size {base.patch_size} "
                f"of {name}; use a multiple of {base.patch_size}"
            )
        if recipe.data.num_frames % tubelet:
            raise ConfigError(
                f"data.num_frames={recipe.data.num_frames} is not divisible by the tubelet size "
                f"{tubelet} of {name}; use a multiple of {tubelet}"
            )
        kw = model_kwargs(recipe)
        check_token_merge(recipe, name, kw)
        try:
            arch = registered_arch(name, **kw)
        except ValueError as e:  # ViTArch.validate: one line naming the field
            raise ConfigError(f"model: {e}") from None
        with meta_device():  # parameters only: the backend (checked in check_runtime) changes none; sdpa
            # builds with every option (eager has no packed form for run-length tokenization)
            model = create_model(name, pretrained=None, **{**kw, "attn_backend": "sdpa"})
        return ModelSummary(name, count_params(model), model_flops(arch) / 1e9, arch.grid)

    def build_model(
        self,
        recipe: Recipe,
        pretrained: str | None = None,
        run_dir: Path | None = None,
        ds_config: dict[str, Any] | None = None,
    ) -> nn.Module:
        kw = model_kwargs(recipe)
        return build_with_weights(
            recipe, kw, pretrained, run_dir, ds_config, kinetics_head=maps_kinetics710_head(recipe)
        )

    def label_classes(self, recipe: Recipe) -> int | dict[str, int]:
        # the MODEL's heads, not the dataset's: a CSV that lacks the top classes must not shrink targets
        return dict(recipe.model.heads) if recipe.model.heads is not None else recipe.model.num_classes

    def synthetic_batch(self, recipe: Recipe, batch_size: int, device: torch.device | str = "cpu") -> dict[str, Any]:
        d = recipe.data
        frames = torch.randn(batch_size, 3, d.num_frames, d.size, d.size, device=device)
        classes = self.label_classes(recipe)
        if isinstance(classes, dict):
            label: Any = {h: torch.randint(0, n, (batch_size,), device=device) for h, n in classes.items()}
        else:
            label = torch.randint(0, max(1, classes), (batch_size,), device=device)
        return {"frames": frames, "label": label}

    def loss(
        self, model: Callable[..., Any], x: torch.Tensor, targets: Any, dtype: torch.dtype, recipe: Recipe
    ) -> LossParts:

        loss, heads = total_loss(model(x.to(dtype)), targets, recipe.data.label_smoothing)
        return loss, {f"loss_{h}": v for h, v in heads.items()}

    def evaluate(self, ctx: EvalContext) -> EvalOutcome:
        metrics, (index, scores, labels), failed = evaluate_model(ctx)
        ds = ctx.loader.dataset
        report = {"scores": SCORES, **eval_report(ctx.recipe.eval.protocol, ctx.views, ds, index)}
        action_map = getattr(ds, "action_map", None)
        if action_map is not None:  # ONE action head: the usual EPIC keys from it, and AVION's
            metrics = action_head_metrics(scores["action"], labels["action"], action_map)
            report["action_label_map"] = {"num_actions": len(action_map), "order": MAP_ORDER}
        return EvalOutcome(metrics, report, failed, per_sample_records(index, scores, labels), int(index.numel()))

    def eval_images(self, ctx: EvalContext, outcome: EvalOutcome) -> dict[str, np.ndarray]:
        """A confusion matrix per head (``eval/confusion_<head>``), from the evaluation's per-sample rows."""
        return confusion_images(outcome.per_sample, self.label_classes(ctx.recipe))
