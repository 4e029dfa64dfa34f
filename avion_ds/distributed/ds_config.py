"""The ONE place a DeepSpeed config is built: user JSON + recipe -> a complete, consistent dict.

The JSON files in ``ds_configs/`` say *how* to shard and offload (ZeRO stage, offload devices,
precision switches); the recipe says *what* to train (batch sizes, lr, clipping, schedule).
Every value the two could disagree on is written ``"auto"`` in the JSON and filled here from the
recipe; a concrete JSON value that contradicts the recipe is rejected with the numbers shown,
because DeepSpeed itself either silently picks one or fails deep inside ``initialize``.

Generated configs (``avion-ds plan``, its ``--measure`` probes, ZeRO-3 offload inference) start from
the same hand-tuned JSON (:func:`reference_config`) and change only named knobs through
``overrides`` (:func:`merge_overrides`), so they differ from ``ds_configs/*.json`` exactly there.

Beside it: ``ds_plan`` (the built config read once into a typed, frozen ``DSPlan``: stage, offload,
precision, batch, buckets), ``ds_fields`` (fill one field), ``ds_check``
(the keys, section types and config model DeepSpeed itself accepts), ``ds_optimizer`` (the optimizer
section), ``ds_hidden`` (the ZeRO bucket sizes Hugging Face's configs leave "auto"). Their public names are importable from here as well.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from avion_ds.config import BatchConfig, ConfigError, Recipe
from avion_ds.distributed.ds_check import check_user_config, deepspeed_config_keys, validate_with_deepspeed
from avion_ds.distributed.ds_fields import AUTO, PRECISIONS, accelerator_name, fill_field, torch_dtype
from avion_ds.distributed.ds_hidden import fill_hidden_size_keys, hidden_size_line
from avion_ds.distributed.ds_optimizer import (
    OPTIMIZER_TYPES,
    allow_sgd_under_zero,
    fill_optimizer,
    lion_needs_client,
    scaled_lr,
)
from avion_ds.distributed.ds_plan import DSPlan, stage_of

# the names of ds_fields / ds_check / ds_optimizer / ds_plan that callers import from this module
__all__ = [
    "AUTO",
    "DS_CONFIGS",
    "OPTIMIZER_TYPES",
    "PRECISIONS",
    "BatchPlan",
    "DSPlan",
    "accelerator_name",
    "allow_sgd_under_zero",
    "build_ds_config",
    "check_user_config",
    "deepspeed_config_keys",
    "fixed_batch_recipe",
    "hidden_size_line",
    "lion_needs_client",
    "load_user_config",
    "merge_overrides",
    "reference_config",
    "resolve_batch",
    "resolve_precision",
    "scaled_lr",
    "torch_dtype",
    "validate_with_deepspeed",
]


@dataclass(frozen=True)
class BatchPlan:
    """Resolved batch arithmetic: global = micro x accum x world."""

    global_batch: int
    micro_batch: int
    grad_accum: int
    world_size: int


def resolve_batch(recipe: Recipe, world_size: int) -> BatchPlan:
    """Derive global batch / grad accumulation from the recipe and world size, or explain why not."""
    b = recipe.batch
    micro, accum, glob = b.micro_batch, b.grad_accum, b.global_batch
    if world_size <= 0:
        raise ConfigError(f"world size {world_size} must be positive")
    if glob is None:
        accum = accum or 1
        glob = micro * accum * world_size
    elif accum is None:
        per_step = micro * world_size
        if glob % per_step:
            raise ConfigError(
                f"batch.global_batch {glob} is not divisible by micro {micro} x world {world_size} = {per_step}"
                " (set batch.global_batch, batch.micro_batch or batch.grad_accum so that they divide)"
            )
        accum = glob // per_step
    elif glob != micro * accum * world_size:
        raise ConfigError(
            f"batch.global_batch {glob} != micro {micro} x accum {accum} x world {world_size}"
            f" = {micro * accum * world_size}"
        )
    return BatchPlan(glob, micro, accum, world_size)


def load_user_config(user: dict | str | Path) -> dict[str, Any]:
    """Read the user's DeepSpeed JSON (path or dict); a non-JSON file is a one-line error naming it."""
    if isinstance(user, dict):
        return copy.deepcopy(user)
    path = Path(user)
    if not path.is_file():
        raise ConfigError(f"deepspeed config not found: {path}")
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"deepspeed config {path} is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"deepspeed config {path}: top level must be a JSON object")
    return data


DS_CONFIGS = Path(__file__).resolve().parents[2] / "ds_configs"  # the hand-tuned reference JSONs


def reference_config(name: str) -> dict[str, Any]:
    """``ds_configs/<name>.json`` of this checkout: the settings every generated config starts from."""
    path = DS_CONFIGS / f"{name}.json"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in DS_CONFIGS.glob("*.json"))) or f"none: no {DS_CONFIGS}"
        raise ConfigError(f"reference DeepSpeed config {name!r} not found (known: {known})")
    return load_user_config(path)


def merge_overrides(base: dict[str, Any], overrides: dict[str, Any] | None) -> dict[str, Any]:
    """A copy of ``base`` with ``overrides`` deep-merged: dicts merge key by key, any other value
    replaces, ``None`` removes the key (e.g. ``{"optimizer": None}`` for an inference config)."""
    out = copy.deepcopy(base)
    for key, value in (overrides or {}).items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge_overrides(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def fixed_batch_recipe(micro_batch: int, grad_accum: int, precision: str) -> Recipe:
    """The default recipe with only the batch shape and precision set: what a config built outside a
    training run (planner probes, offload inference) fills its "auto" values from."""
    return dataclasses.replace(
        Recipe(),
        precision=precision,
        batch=BatchConfig(global_batch=None, micro_batch=micro_batch, grad_accum=grad_accum),
    )


def _default_precision(accel: str) -> str:
    if accel == "cuda":
        return "bf16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "fp16"
    return "fp32"


def resolve_precision(cfg: dict[str, Any], recipe: Recipe, accel: str | None = None) -> str:
    """Pick fp32 | bf16 | fp16 from the JSON sections and recipe.precision; conflicts are errors."""
    wanted = {}
    for name in ("bf16", "fp16"):
        enabled = cfg.get(name, {}).get("enabled", False)
        if enabled == AUTO:
            continue
        wanted[name] = bool(enabled)
    json_on = [name for name, on in wanted.items() if on]
    if len(json_on) > 1:
        raise ConfigError("deepspeed config enables both bf16 and fp16; enable at most one")
    rp = recipe.precision
    if rp != "auto":
        if json_on and json_on[0] != rp:
            raise ConfigError(f"recipe precision={rp!r} conflicts with deepspeed config {json_on[0]}.enabled=true")
        return rp
    if json_on:
        return json_on[0]
    has_auto = any(cfg.get(n, {}).get("enabled") == AUTO for n in ("bf16", "fp16"))
    return _default_precision(accel or accelerator_name()) if has_auto else "fp32"


def _fill_scheduler(cfg: dict[str, Any], recipe: Recipe, lr: float, steps_per_epoch: int | None) -> None:
    sched = cfg.get("scheduler")
    if not sched:
        return
    if recipe.optim.layer_decay < 1.0:  # DeepSpeed's schedulers set one lr for every group: lr_scale is lost
        raise ConfigError(
            f"deepspeed config 'scheduler' ({sched.get('type', '?')}) cannot be combined with "
            f"optim.layer_decay={recipe.optim.layer_decay:g}: DeepSpeed's schedulers drop the per-layer "
            "lr scale; remove the scheduler section (the built-in warmup + cosine honours layer "
            "decay) or set optim.layer_decay=1.0"
        )
    if recipe.optim.weight_decay_end is not None:  # the built-in schedule is the one that sets weight decay
        raise ConfigError(
            f"deepspeed config 'scheduler' ({sched.get('type', '?')}) cannot be combined with "
            f"optim.weight_decay_end={recipe.optim.weight_decay_end:g}: remove the scheduler section (the built-in "
            "warmup + cosine also runs the weight-decay schedule) or unset optim.weight_decay_end"
        )
    params = sched.setdefault("params", {})
    autos = [k for k, v in params.items() if v == AUTO]
    if autos and steps_per_epoch is None:
        raise ConfigError(f'deepspeed config scheduler.params {autos} are "auto" but steps per epoch is unknown')
    spe = steps_per_epoch or 0
    values = {
        "total_num_steps": int(recipe.schedule.epochs * spe),
        "warmup_num_steps": int(round(recipe.schedule.warmup_epochs * spe)),
        "warmup_max_lr": lr,
        "warmup_min_lr": 0.0,
        "cos_min_ratio": recipe.optim.min_lr / lr if lr > 0 else 0.0,
    }
    for key in autos:
        if key not in values:
            raise ConfigError(f'deepspeed config scheduler.params.{key}="auto" cannot be derived from the recipe')
        params[key] = values[key]


def _fill_batch(cfg: dict[str, Any], plan: BatchPlan) -> None:
    """The JSON's batch keys: integers or "auto", equal to the recipe's plan; then written from it."""
    tbs = cfg.get("train_batch_size", AUTO)
    mbs = cfg.get("train_micro_batch_size_per_gpu", AUTO)
    gas = cfg.get("gradient_accumulation_steps", AUTO)
    for key, val in (
        ("train_batch_size", tbs),
        ("train_micro_batch_size_per_gpu", mbs),
        ("gradient_accumulation_steps", gas),
    ):
        if val != AUTO and (isinstance(val, bool) or not isinstance(val, int)):
            raise ConfigError(
                f'deepspeed config {key}={val!r} is not an integer (write a number without quotes, or "auto")'
            )
    for key, val, want in (
        ("train_micro_batch_size_per_gpu", mbs, plan.micro_batch),
        ("gradient_accumulation_steps", gas, plan.grad_accum),
    ):
        if val != AUTO and val != want:
            raise ConfigError(
                f"deepspeed config {key}={val} conflicts with the recipe value {want}"
                f" (global {plan.global_batch} = micro {plan.micro_batch} x accum {plan.grad_accum}"
                f" x world {plan.world_size})"
            )
    if tbs != AUTO and tbs != plan.global_batch:
        raise ConfigError(
            f"deepspeed config train_batch_size {tbs} != micro {plan.micro_batch} x accum "
            f"{plan.grad_accum} x world {plan.world_size} = {plan.global_batch}"
        )
    cfg["train_batch_size"] = plan.global_batch
    cfg["train_micro_batch_size_per_gpu"] = plan.micro_batch
    cfg["gradient_accumulation_steps"] = plan.grad_accum


def build_ds_config(
    user: dict | str | Path,
    recipe: Recipe,
    world_size: int,
    steps_per_epoch: int | None = None,
    overrides: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Merge the user's DeepSpeed JSON with the recipe into one complete DeepSpeed config.

    ``overrides`` are deep-merged into the JSON first (:func:`merge_overrides`): the knobs a caller
    sets on top of a reference JSON. Then fills "auto" batch sizes, optimizer lr/betas/eps/weight
    decay, scheduler steps and precision, always writes ``gradient_clipping`` explicitly (DeepSpeed
    defaults it to 1.0 otherwise), fills Hugging Face's "auto" ZeRO bucket sizes from the model's hidden
    size (``ds_hidden``), and rejects values that contradict the recipe with a one-line message showing
    the numbers.
    """
    cfg = merge_overrides(load_user_config(user), overrides)
    check_user_config(cfg)
    plan = resolve_batch(recipe, world_size)

    _fill_batch(cfg, plan)

    # ---- clipping: always explicit (0.0 disables) ----------------------------------------------
    fill_field(cfg, "gradient_clipping", float(recipe.optim.clip_grad), "gradient_clipping", close=True)

    lr = fill_optimizer(cfg, recipe, plan.global_batch)
    allow_sgd_under_zero(cfg, recipe)
    _fill_scheduler(cfg, recipe, lr, steps_per_epoch)

    # ---- precision --------------------------------------------------------------------------
    precision = resolve_precision(cfg, recipe, accelerator_name())
    for name in ("bf16", "fp16"):
        section = cfg.setdefault(name, {})
        section["enabled"] = precision == name

    if recipe.ema.decay > 0 and stage_of(cfg) == 3:
        raise ConfigError(
            f"ema.decay={recipe.ema.decay:g} is not supported with ZeRO-3 (the EMA follows the ZeRO 0-2 master "
            "weights); use ZeRO-0/1/2 (with offload_optimizer for memory) or set ema.decay=0"
        )

    if recipe.model.compile and stage_of(cfg) == 3:
        raise ConfigError(
            "model.compile=true is not supported with ZeRO-3 (its parameter hooks break the compiled blocks); use ZeRO-0/1/2"
        )

    # ---- ZeRO bucket sizes Hugging Face's configs leave "auto": from the model's hidden size -----
    fill_hidden_size_keys(cfg, recipe.model.name)

    cfg.setdefault("steps_per_print", 10**9)  # we log ourselves
    cfg.setdefault("wall_clock_breakdown", False)
    _reject_leftover_auto(cfg)
    return cfg


def _reject_leftover_auto(node: Any, path: str = "") -> None:
    if isinstance(node, dict):
        for k, v in node.items():
            _reject_leftover_auto(v, f"{path}.{k}" if path else str(k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            _reject_leftover_auto(v, f"{path}[{i}]")
    elif node == AUTO:
        raise ConfigError(f'deepspeed config {path}="auto" is not a value avion_ds can fill')
