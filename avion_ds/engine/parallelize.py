"""The ONE place memory features are applied: activation checkpointing, then ``deepspeed.initialize``.

ZeRO stage, offload and precision come from the built DeepSpeed config; activation checkpointing
from the recipe (``model.activation_checkpointing``, ``checkpoint_every``, ``checkpoint_first_n``,
``checkpoint_impl``). With ``checkpoint_impl: deepspeed`` the JSON's ``activation_checkpointing``
section (e.g. ``cpu_checkpointing``) is handed to ``deepspeed.checkpointing.configure``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from avion_ds.config import Recipe
from avion_ds.engine.ds_config import scaled_lr
from avion_ds.engine.optim import client_adamw, optimizer_groups
from avion_ds.engine.schedule import WarmupCosine


def apply_memory_features(model: nn.Module, recipe: Recipe, ds_config: dict[str, Any]) -> nn.Module:
    """Wrap blocks for activation checkpointing as the recipe asks (no-op otherwise)."""
    m = recipe.model
    if not m.activation_checkpointing:
        return model
    from avion_ds.models import apply_activation_checkpointing

    if m.checkpoint_impl == "deepspeed":
        import deepspeed

        ac = dict(ds_config.get("activation_checkpointing", {}))
        deepspeed.checkpointing.configure(
            None,
            partition_activations=bool(ac.get("partition_activations", False)),
            contiguous_checkpointing=bool(ac.get("contiguous_memory_optimization", False)),
            num_checkpoints=ac.get("number_checkpoints"),
            checkpoint_in_cpu=bool(ac.get("cpu_checkpointing", False)),
            synchronize=bool(ac.get("synchronize_checkpoint_boundary", False)),
            profile=bool(ac.get("profile", False)),
        )
    return apply_activation_checkpointing(model, every=m.checkpoint_every, first_n=m.checkpoint_first_n,
                                          impl=m.checkpoint_impl)


def base_lr(recipe: Recipe, ds_config: dict[str, Any]) -> float:
    """Peak lr: the (filled) JSON optimizer lr, else the recipe's linearly scaled lr."""
    params = ds_config.get("optimizer", {}).get("params", {})
    return float(params["lr"]) if "lr" in params else scaled_lr(recipe, int(ds_config["train_batch_size"]))


def parallelize(model: nn.Module, recipe: Recipe, ds_config: dict[str, Any], steps_per_epoch: int,
                optimizer: torch.optim.Optimizer | None = None) -> Any:
    """Apply activation checkpointing, build param groups + schedule, return the DeepSpeed engine.

    The optimizer is DeepSpeed's (from the JSON ``optimizer`` section) over our parameter groups,
    or a client torch AdamW when the JSON has none (ZeRO accepts torch Adam/AdamW). The schedule
    is the JSON ``scheduler`` when present, else per-iteration warmup + cosine that honours each
    group's ``lr_scale`` (layer-wise decay).
    """
    import deepspeed

    model = apply_memory_features(model, recipe, ds_config)
    lr = base_lr(recipe, ds_config)
    groups = optimizer_groups(model, recipe)
    if optimizer is None and "optimizer" not in ds_config:
        optimizer = client_adamw(groups, recipe, lr)

    lr_scheduler = None
    if "scheduler" not in ds_config:
        total = int(recipe.schedule.epochs * steps_per_epoch)
        warmup = int(round(recipe.schedule.warmup_epochs * steps_per_epoch))
        min_lr = recipe.optim.min_lr

        def lr_scheduler(opt: torch.optim.Optimizer) -> WarmupCosine:
            return WarmupCosine(opt, lr, min_lr, warmup, total)

    engine, _, _, _ = deepspeed.initialize(
        model=model,
        model_parameters=groups if optimizer is None else None,
        optimizer=optimizer,
        lr_scheduler=lr_scheduler,
        config=ds_config,
    )
    return engine


def unwrap(engine_or_model: Any) -> nn.Module:
    """The bare model inside a DeepSpeed engine (or the model itself)."""
    return getattr(engine_or_model, "module", engine_or_model)
