"""Model helpers only tests use: a model from a recipe's model section, the registered
masked-autoencoder names, the ZeRO-0 gradient norm as a float."""

from __future__ import annotations

from typing import Any

from torch import nn

from avion_ds.engine.train_state import zero0_grad_norm_tensor
from avion_ds.models.activation_checkpointing import apply_configured
from avion_ds.models.mae.sizes import pretrain_names
from avion_ds.models.registry import create_model


def create_model_from_config(model_cfg: Any, num_frames: int, img_size: int, **overrides: Any) -> nn.Module:
    """Build the model a recipe's ``ModelConfig`` describes (input size from the data section),
    load its pretrained weights and apply its activation checkpointing settings."""
    options = {
        "num_frames": num_frames,
        "img_size": img_size,
        "num_classes": model_cfg.num_classes,
        "heads": model_cfg.heads,
        "drop_path_rate": model_cfg.drop_path_rate,
        "head_drop_rate": model_cfg.head_drop_rate,
        "attn_backend": model_cfg.attn_backend,
        "patch_embed": model_cfg.patch_embed,
    }
    for key in ("pool", "pos_embed", "drop_path_schedule"):  # unset (None): the registered model's own
        if getattr(model_cfg, key, None) is not None:
            options[key] = getattr(model_cfg, key)
    options.update(overrides)
    model = create_model(model_cfg.name, pretrained=model_cfg.pretrained or None, **options)
    if model_cfg.activation_checkpointing:
        apply_configured(model, model_cfg)
    return model


def list_mae_models() -> list[str]:
    """The registered masked-autoencoder (pretraining) model names."""
    return pretrain_names()


def zero0_grad_norm(engine: Any, loss_scale: float | None = None) -> float | None:
    """Pre-clipping grad norm for ZeRO-0 (grads are all-reduced); under fp16 pass the loss scale."""
    norm = zero0_grad_norm_tensor(engine, loss_scale)
    return None if norm is None else float(norm)
