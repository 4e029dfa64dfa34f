"""Unmasked-teacher distillation (``task: umt``; Li et al., ICCV 2023, OpenGVLab/unmasked_teacher ``single_modality``).

A frozen CLIP video tower (``umt.teacher`` read as the video tower of ``umt.teacher_model``; ``teacher``)
sees every frame at ``umt.clip_input_resolution``; the student, the registered video ViT ``model.name``
(``model``: ``UMTStudent``), sees the visible tokens only and regresses the teacher's l2-normalised
features of the last ``clip_return_layer`` layers at those positions through one decoder per layer
(``losses``). Masks: ``tube`` / ``random`` drawn loader-side, ``attention`` drawn on the device from the
teacher's class attention (``masking``). The loss is ``clip_loss_ratio`` x the distillation loss;
``loss_clip`` is logged beside it. Validation reports ``umt_loss`` (the same loss, the masks fixed) and
``umt_cos`` (the mean cosine of the last layer's student and teacher features).

Teacher rule (what memory accounting counts): frozen, outside the trained module tree (in the student's
``__dict__``), so never in the optimizer, a checkpoint or a ZeRO-3 partition; a full float32 replica on every
rank, rebuilt from ``umt.teacher`` at every start (resume and elastic resume leave it as the file has it).
Recipe defaults are the reference's ViT-B/16 K710 recipe (:data:`UMT_DEFAULTS`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from avion_ds.config import ConfigError
from avion_ds.data.datasets.build import dataset_spec
from avion_ds.data.datasets.registry import names_of_kind
from avion_ds.distributed import dist
from avion_ds.models.meta import meta_device
from avion_ds.tasks.base import EvalOutcome, LossParts, ModelSummary, Task, load_recipe_weights
from avion_ds.tasks.common.evaluation import eval_mode
from avion_ds.tasks.common.predictions import PredictionStore
from avion_ds.tasks.registry import register_task
from avion_ds.tasks.umt.losses import per_clip_loss, visible_targets
from avion_ds.tasks.umt.masking import attention_mask, loader_masks, seeded_attention_mask
from avion_ds.tasks.umt.teacher import build_teacher, tower_arch

if TYPE_CHECKING:
    from avion_ds.config import Recipe
    from avion_ds.tasks.base import EvalContext
    from avion_ds.tasks.umt.model import UMTStudent  # lazy: heavy (timm, torchvision)

# the reference's b16_ptk710_f8_res224.sh; keys the recipe sets win
UMT_DEFAULTS: dict[str, dict[str, Any]] = {
    "model": {"name": "vit_base_patch16_224", "drop_path_rate": 0.1, "num_classes": 0, "tubelet_size": 1},
    "data": {
        "dataset": "videos",
        "num_frames": 8,
        "sampling": "segment",
        "hflip": 0.5,
        "mixup": 0.0,
        "cutmix": 0.0,
        "label_smoothing": 0.0,
    },
    "optim": {"lr": 1.5e-4, "betas": [0.9, 0.95], "weight_decay": 0.05, "layer_decay": 1.0, "min_lr": 1e-5},
    "schedule": {"epochs": 201, "warmup_epochs": 40.0},
}


def student_options(recipe: Recipe) -> dict[str, Any]:
    """``ViTArch`` overrides of the student: the data's clip size, the model section's options."""
    m, d = recipe.model, recipe.data
    kw: dict[str, Any] = {
        "num_frames": d.num_frames,
        "img_size": d.size,
        "drop_path_rate": m.drop_path_rate,
        "attn_backend": m.attn_backend,
        "patch_embed": m.patch_embed,
    }
    for key in ("pos_embed", "drop_path_schedule", "tubelet_size"):
        if getattr(m, key) is not None:
            kw[key] = getattr(m, key)
    return kw


def student_geometry(recipe: Recipe) -> Any:
    """The student's ``ViTArch`` (nothing built); one-line ConfigError naming ``model``."""
    from avion_ds.tasks.umt.model import student_arch  # lazy: heavy (timm, torchvision)

    try:
        return student_arch(recipe.model.name, student_options(recipe))
    except (ValueError, TypeError) as e:
        raise ConfigError(f"model.name={recipe.model.name!r}: {e}") from None


def check_geometry(recipe: Recipe) -> None:
    """Depths against ``clip_return_layer`` and the teacher's per-frame grid against the student's."""
    u = recipe.umt
    student = student_geometry(recipe)
    tower = tower_arch(u.teacher_model, u.clip_input_resolution)
    for who, arch, interval in (
        ("model.name=" + recipe.model.name, student, u.clip_student_return_interval),
        ("umt.teacher_model=" + u.teacher_model, tower, u.clip_return_interval),
    ):
        if arch.depth - int((u.clip_return_layer - 1) * interval) - 1 < 0:
            raise ConfigError(
                f"umt.clip_return_layer={u.clip_return_layer} (interval {interval:g}) is above the depth of "
                f"{who} ({arch.depth} blocks)"
            )
    if student.tubelet_size != 1:
        raise ConfigError(
            f"model.tubelet_size={student.tubelet_size}: the CLIP teacher sees single frames, so the student's "
            "tubelet must be 1 (its tokens then match the teacher's frame by frame)"
        )
    s_grid, t_grid = student.grid[1:], tower.grid[1:]
    if s_grid != t_grid:
        raise ConfigError(
            f"umt.teacher={u.teacher}: the teacher's patch grid {t_grid[0]}x{t_grid[1]} ({u.teacher_model}, "
            f"{tower.patch_size} px patches at umt.clip_input_resolution={u.clip_input_resolution}) cannot match "
            f"the student's {s_grid[0]}x{s_grid[1]} ({recipe.model.name}, {student.patch_size} px patches at "
            f"data.size={recipe.data.size}); set umt.clip_input_resolution={s_grid[0] * tower.patch_size}"
        )


def build_student(recipe: Recipe, out_dim: int, ds_config: dict[str, Any] | None) -> UMTStudent:
    """The student (partitioned under a ZeRO-3 ``ds_config``), fresh weights."""
    from avion_ds.models.weights.loading import build_partitioned  # lazy: heavy (timm, torchvision)
    from avion_ds.tasks.umt.model import UMTStudent  # lazy: heavy (timm, torchvision)

    u, arch = recipe.umt, student_geometry(recipe)
    return build_partitioned(
        lambda: UMTStudent(arch, out_dim, u.clip_return_layer, u.clip_student_return_interval), ds_config
    )


@register_task
class UMTTask(Task):
    """Unmasked-teacher distillation (see module doc)."""

    name = "umt"
    recipe_defaults = UMT_DEFAULTS

    def validate_recipe(self, recipe: Recipe) -> None:
        d, u = recipe.data, recipe.umt
        if dataset_spec(d).label_kind != "none":
            raise ConfigError(
                f"task={recipe.task!r} with data.dataset={d.dataset!r}: UMT distils on unlabelled clips, "
                f"data.dataset {' / '.join(map(repr, names_of_kind('none')))}"
            )
        if not 0.0 < u.mask_ratio < 1.0:
            raise ConfigError(f"umt.mask_ratio={u.mask_ratio} must be in (0, 1)")
        if u.clip_return_layer < 1:
            raise ConfigError(f"umt.clip_return_layer={u.clip_return_layer} must be at least 1")
        for key in ("clip_return_interval", "clip_student_return_interval"):
            if getattr(u, key) <= 0:
                raise ConfigError(f"umt.{key}={getattr(u, key)} must be positive")
        if recipe.model.token_merge != 0:
            raise ConfigError(f"model.token_merge={recipe.model.token_merge!r}: the UMT student does not merge tokens")
        if recipe.model.patch_dropout:
            raise ConfigError(
                f"model.patch_dropout={recipe.model.patch_dropout!r}: the UMT student already sees only the visible "
                "tokens of umt.mask_ratio; patch dropout is a fine-tuning / contrastive option"
            )
        if recipe.model.rlt_threshold:
            raise ConfigError(
                f"model.rlt_threshold={recipe.model.rlt_threshold!r}: the UMT student already sees only the "
                "visible tokens of umt.mask_ratio; run-length tokenization is a fine-tuning / contrastive option"
            )
        if not u.teacher:
            raise ConfigError("umt.teacher is required: the CLIP weights (a file or a dual-encoder run) to distil")
        check_geometry(recipe)

    def check_model(self, recipe: Recipe) -> ModelSummary:
        """The student's size; the teacher file read and checked (a CLIP visual tower of ``teacher_model``),
        the teacher kept for ``build_model`` of this process (the file is read once)."""
        from avion_ds.models import model_flops  # lazy: heavy (timm, torchvision)

        arch = student_geometry(recipe)
        teacher = build_teacher(recipe.umt, recipe.model.trust_checkpoint, recipe.data.mean_std, keep=True)
        from avion_ds.models.vit.model import count_params  # lazy: heavy (timm, torchvision)
        from avion_ds.tasks.umt.model import UMTStudent  # lazy: heavy (timm, torchvision)

        u = recipe.umt
        with meta_device():
            model = UMTStudent(arch, teacher.output_dim, u.clip_return_layer, u.clip_student_return_interval)
        return ModelSummary(recipe.model.name, count_params(model), model_flops(arch) / 1e9, arch.grid)

    def build_model(
        self,
        recipe: Recipe,
        pretrained: str | None = None,
        run_dir: Path | None = None,
        ds_config: dict[str, Any] | None = None,
    ) -> nn.Module:
        teacher = build_teacher(recipe.umt, recipe.model.trust_checkpoint, recipe.data.mean_std)
        model = build_student(recipe, teacher.output_dim, ds_config)
        load_recipe_weights(model, recipe, pretrained, run_dir)
        model.attach_teacher(teacher)
        if dist.is_main():
            print(f"{teacher.describe()} from {recipe.umt.teacher}", flush=True)
        return model

    def memory_estimator(self, recipe: Recipe) -> Callable[..., Any] | None:
        """The student's visible-token step plus the replicated teacher (``memory.umt_estimate``)."""
        from avion_ds.tasks.umt.memory import umt_estimator  # lazy: heavy (the planner imports timm)

        return umt_estimator(recipe, student_geometry(recipe))

    def prepare_datasets(self, recipe: Recipe, *datasets: Any) -> None:
        spec = loader_masks(student_geometry(recipe).grid, recipe.umt.mask_type, recipe.umt.mask_ratio)
        for ds in datasets:
            ds.masks = spec

    def label_classes(self, recipe: Recipe) -> int:
        return 0

    def synthetic_batch(self, recipe: Recipe, batch_size: int, device: torch.device | str = "cpu") -> dict[str, Any]:
        d = recipe.data
        spec = loader_masks(student_geometry(recipe).grid, recipe.umt.mask_type, recipe.umt.mask_ratio)
        masks = np.stack([spec.draw(np.random.default_rng(i))["mask"] for i in range(batch_size)])
        frames = torch.randn(batch_size, 3, d.num_frames, d.size, d.size, device=device)
        return {"frames": frames, "label": {"mask": torch.from_numpy(masks).to(device)}}

    def loss(
        self, model: Callable[..., Any], x: torch.Tensor, targets: Any, dtype: torch.dtype, recipe: Recipe
    ) -> LossParts:
        per_clip = distill(model, x, targets["mask"], dtype, recipe, seeds=targets.get("mask_seed"))
        loss_clip = per_clip.mean()
        return recipe.umt.clip_loss_ratio * loss_clip, {"loss_clip": loss_clip.detach()}

    def evaluate(self, ctx: EvalContext) -> EvalOutcome:
        return EvalOutcome(evaluate_umt(ctx), num_samples=len(ctx.loader.dataset))

    def eval_line(self, metrics: dict[str, float], report: dict[str, Any] | None = None) -> str:
        return " ".join(f"{k}={v:.4f}" for k, v in metrics.items())


def teacher_of(model: Any, device: torch.device) -> Any:
    """The frozen teacher of a (DeepSpeed-wrapped) student, moved to ``device`` (the frames'; a student whose
    parameters ZeRO offloads to the CPU still computes on the accelerator)."""
    teacher = getattr(model, "module", model).frozen_teacher
    if next(teacher.parameters()).device != device:
        teacher.to(device)
    return teacher


def distill(
    model: Callable[..., Any],
    x: torch.Tensor,
    mask: torch.Tensor | None,
    dtype: torch.dtype,
    recipe: Recipe,
    generator: torch.Generator | None = None,
    out: dict[str, torch.Tensor] | None = None,
    seeds: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-clip distillation loss (B,) of float32 frames ``x``: the teacher's targets (no gradient), the
    attention mask drawn from its class attention (``mask``, the loader's, is then unused): each clip from its
    ``seeds`` entry (the loader's ``mask_seed``) when given, else all from ``generator``; the student on the
    visible tokens. ``out`` (optional) receives ``student`` and ``target`` features."""
    u = recipe.umt
    feats, attn = teacher_of(model, x.device)(x)
    if u.mask_type == "attention" and seeds is not None:
        mask = seeded_attention_mask(attn, seeds.reshape(-1).tolist(), u.mask_ratio)
    elif u.mask_type == "attention":
        mask = attention_mask(attn, x.shape[0], u.mask_ratio, generator)
    target = visible_targets(feats, mask)
    student = model(x.to(dtype), mask)
    if out is not None:
        out.update(student=student, target=target)
    return per_clip_loss(student, target, u.clip_loss_type)


@torch.no_grad()
def evaluate_umt(ctx: EvalContext) -> dict[str, float]:
    """Validation ``umt_loss`` and ``umt_cos`` (last layer) over all ranks, each clip once; attention masks
    are drawn per clip from its ``mask_seed`` (validation's clips keep epoch 0's), else from a generator seeded
    by the recipe's seed and the batch's first dataset index."""
    store = PredictionStore()
    with eval_mode(ctx.model):
        for batch in ctx.loader:
            frames = batch["frames"].to(ctx.device, non_blocking=True)
            x, masks = ctx.augment(frames, {k: v.to(ctx.device) for k, v in batch["label"].items()})
            gen = torch.Generator(device=ctx.device)
            gen.manual_seed(int(ctx.recipe.seed) * 1_000_003 + int(batch["index"].reshape(-1)[0]))
            feats: dict[str, torch.Tensor] = {}
            loss = distill(ctx.model, x, masks["mask"], ctx.dtype, ctx.recipe, gen, feats, masks.get("mask_seed"))
            cos = (feats["student"][-1].float() * feats["target"][-1]).sum(-1).mean(-1)
            store.add(batch["index"], torch.stack([loss, cos], dim=1).double(), torch.zeros(x.shape[0]))
    _, sums, _ = store.gather()
    n = max(int(sums.shape[0]), 1)
    loss_sum, cos_sum = (float(v) for v in sums.sum(dim=0)) if sums.numel() else (0.0, 0.0)
    return {"umt_loss": loss_sum / n, "umt_cos": cos_sum / n}
