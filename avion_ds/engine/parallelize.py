"""The ONE place memory features are applied: activation checkpointing, then ``deepspeed.initialize``.

ZeRO stage, offload and precision come from the built DeepSpeed config's plan (``DSPlan``); activation checkpointing
from the recipe (``model.activation_checkpointing``, ``activation_checkpoint_every``, ``activation_checkpoint_first_n``,
``activation_checkpoint_impl``, ``activation_checkpoint_policy``), then ``model.compile`` (each block compiled). With ``activation_checkpoint_impl: deepspeed`` the JSON's ``activation_checkpointing``
section (e.g. ``cpu_checkpointing``) is handed to ``deepspeed.checkpointing.configure``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from avion_ds.config import Recipe
from avion_ds.distributed.ds_optimizer import scaled_lr
from avion_ds.distributed.ds_plan import DSPlan
from avion_ds.engine.lion_guard import guard_zero_direction, is_deepspeed_lion
from avion_ds.engine.optim import client_optimizer, optimizer_groups
from avion_ds.engine.schedule import WarmupCosine
from avion_ds.models.activation_checkpointing import apply_configured, compile_blocks


def apply_memory_features(model: nn.Module, recipe: Recipe, ds_config: dict[str, Any]) -> nn.Module:
    """Wrap blocks for activation checkpointing, then compile them, as the recipe asks (no-op otherwise)."""
    m = recipe.model
    if m.activation_checkpointing:
        _checkpoint(model, recipe, ds_config)
    if m.compile:
        compile_blocks(model)
    return model


def _checkpoint(model: nn.Module, recipe: Recipe, ds_config: dict[str, Any]) -> None:
    m = recipe.model

    if m.activation_checkpoint_impl == "deepspeed":
        import deepspeed  # lazy: deepspeed takes seconds to import

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
    apply_configured(model, m)


@dataclass(frozen=True)
class Parallelized:
    """What ``parallelize`` made: the DeepSpeed engine, the plan of the config it was built from, and the
    gradient clipping it left to the Trainer."""

    engine: Any
    plan: DSPlan
    clip_grad: float = 0.0  # > 0: the Trainer clips to this norm (fp32 ZeRO-0, see ``trim_engine``)


def trim_engine(ds_config: dict[str, Any], plan: DSPlan) -> tuple[dict[str, Any], float]:
    """The config handed to DeepSpeed and the clip norm the Trainer applies itself (0: none).

    fp32 ZeRO-0 is the one case where DeepSpeed clips with a Python loop of per-tensor norms over the
    module's gradients (``clip_fp32_gradients``) while the Trainer already needs that norm (logging); the
    Trainer clips with ``torch.nn.utils.clip_grad_norm_`` instead (same rule: ``max_norm / (norm + 1e-6)``
    capped at 1) and DeepSpeed gets ``gradient_clipping: 0``. Every other case clips inside DeepSpeed's
    optimizer wrappers and is left alone. ``run_dir/ds_config.json`` keeps the user's value.
    """
    clip = plan.gradient_clipping
    if clip > 0 and plan.zero_stage == 0 and plan.precision == "fp32":
        return {**ds_config, "gradient_clipping": 0.0}, clip
    return ds_config, 0.0


def base_lr(recipe: Recipe, plan: DSPlan) -> float:
    """Peak lr: the (filled) JSON optimizer lr, else the recipe's linearly scaled lr."""
    if plan.optimizer_lr is not None:
        return plan.optimizer_lr
    assert plan.global_batch is not None, "a built config states train_batch_size"
    return scaled_lr(recipe, plan.global_batch)


def schedule_bounds(recipe: Recipe, plan: DSPlan) -> tuple[float, float, float | None]:
    """(peak lr, cosine end lr, warmup start lr or None) the built-in schedule runs with: the bounds scaled
    by the batch like the lr under ``optim.scale_lr_bounds`` (AVION CLS scales lr_start / lr_end like lr)."""
    lr = base_lr(recipe, plan)
    o, start = recipe.optim, recipe.schedule.warmup_start_lr
    bound = lr / o.lr if o.scale_lr_bounds else 1.0
    return lr, o.min_lr * bound, None if start is None else start * bound


def parallelize(
    model: nn.Module,
    recipe: Recipe,
    ds_config: dict[str, Any],
    steps_per_epoch: int,
    optimizer: torch.optim.Optimizer | None = None,
    plan: DSPlan | None = None,
) -> Parallelized:
    """Apply activation checkpointing, build param groups + schedule, make the DeepSpeed engine.

    The optimizer is DeepSpeed's (from the JSON ``optimizer`` section) over our parameter groups,
    or, when the JSON has none, a client optimizer of ``optim.name`` (torch AdamW or DeepSpeed's Lion; also
    DeepSpeed's CPU Lion for a JSON Lion on the CPU accelerator, see ``client_optimizer``). The schedule
    is the JSON ``scheduler`` when present, else per-iteration warmup + cosine that honours each
    group's ``lr_scale`` (layer-wise decay) and runs ``optim.weight_decay_end``'s weight-decay schedule. Step the engine with ``Trainer.train_step``: for fp32
    ZeRO-0 it does the gradient clipping (``trim_engine``). ``plan``: the config's plan as start-up
    resolved it (``RunSetup.ds_plan``); read from ``ds_config`` when not given.
    """
    import deepspeed  # lazy: deepspeed takes seconds to import

    plan = plan if plan is not None else DSPlan.of(ds_config)
    model = apply_memory_features(model, recipe, ds_config)
    lr, min_lr, start = schedule_bounds(recipe, plan)
    groups = optimizer_groups(model, recipe)
    config = ds_config
    if optimizer is None:
        optimizer, config = client_optimizer(groups, recipe, lr, ds_config, plan)

    lr_scheduler = None
    if not plan.has_scheduler:
        total = int(recipe.schedule.epochs * steps_per_epoch)
        warmup = int(round(recipe.schedule.warmup_epochs * steps_per_epoch))
        o, sched = recipe.optim, recipe.schedule
        if sched.fix_lr:  # AVION --fix-lr: the base lr throughout (no warmup, no decay)
            warmup, min_lr = 0, lr
        wd = None if o.weight_decay_end is None else (o.weight_decay, o.weight_decay_end)

        def lr_scheduler(opt: torch.optim.Optimizer) -> WarmupCosine:
            return WarmupCosine(opt, lr, min_lr, warmup, total, weight_decay=wd, warmup_start=start)

    config, own_clip = trim_engine(config, plan)
    with fp32_master_shared(plan):
        engine, _, _, _ = deepspeed.initialize(
            model=model,
            model_parameters=groups if optimizer is None else None,
            optimizer=optimizer,
            lr_scheduler=lr_scheduler,
            config=config,
        )
    trim_zero0(engine, plan)
    if is_deepspeed_lion(engine.basic_optimizer):  # sign(0) = 0 as AVION's Lion (client or JSON-built)
        guard_zero_direction(engine.basic_optimizer)
    return Parallelized(engine, plan, own_clip)


@contextlib.contextmanager
def fp32_master_shared(plan: DSPlan) -> Iterator[None]:
    """fp32 ZeRO-3 without optimizer offload: the optimizer's fp32 "master" partition IS the parameter
    partition, not a second copy of it.

    DeepSpeed 0.19.8's ``DeepSpeedZeroOptimizer_Stage3._create_fp32_partitions`` shares the partition
    when its dtype and device already match (its own branch for fp32 weights), but compares
    ``tensor.device`` (a ``torch.device``) with ``self.device``, the accelerator's device NAME (a str),
    which is never equal: every rank cloned its whole fp32 partition (+0.5x the fp32 model per rank
    on 2 ranks, measured in bench/memory_large.py ``train``). During that call ``self.device`` is the
    same device as a ``torch.device``, so the comparison holds; nothing else changes.
    """
    if plan.zero_stage != 3 or plan.precision != "fp32" or plan.offloads_optimizer:
        yield
        return
    from deepspeed.runtime.zero.stage3 import (  # lazy: deepspeed takes seconds to import
        DeepSpeedZeroOptimizer_Stage3 as Stage3,
    )

    original = Stage3._create_fp32_partitions

    def create(self: Any) -> None:
        name = self.device
        self.device = torch.device(name) if isinstance(name, str) else name
        try:
            original(self)
        finally:
            self.device = name

    Stage3._create_fp32_partitions = create
    try:
        yield
    finally:
        Stage3._create_fp32_partitions = original


def trim_zero0(engine: Any, plan: DSPlan) -> None:
    """ZeRO-0 on ONE data-parallel rank (fp32 / fp16): DeepSpeed's gradient "all-reduce" would only flatten,
    divide by 1 and copy back every gradient; its public ``enable_backward_allreduce`` switch turns it off
    (identical results)."""
    if plan.zero_stage == 0 and plan.precision != "bf16" and engine.dp_world_size == 1:
        engine.enable_backward_allreduce = False


def inner_module(engine_or_model: Any) -> nn.Module:
    """The bare model inside a DeepSpeed engine (or the model itself)."""
    return getattr(engine_or_model, "module", engine_or_model)
