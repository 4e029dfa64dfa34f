"""The optimizer section of a DeepSpeed config, filled from the recipe (AdamW, Lion, SGD).

The lr is the recipe's, scaled to the global batch (:func:`scaled_lr`); Adam keys an optimizer has no
use for are refused unless "auto"; Lion on the CPU accelerator becomes a client optimizer.
"""

from __future__ import annotations

from typing import Any

from avion_ds.config import FLOAT32_MAX, ConfigError, Recipe
from avion_ds.distributed.ds_fields import AUTO, accelerator_name, fill_field
from avion_ds.distributed.ds_plan import DSPlan, offload_of, stage_of


def scaled_lr(recipe: Recipe, global_batch: int) -> float:
    """Linear scaling rule: lr = base lr x global_batch / base_batch (when optim.scale_lr)."""
    o = recipe.optim
    return o.lr * global_batch / o.base_batch if o.scale_lr else o.lr


def fill_optimizer(cfg: dict[str, Any], recipe: Recipe, global_batch: int) -> float:
    """The JSON optimizer's "auto" values from the recipe (lr scaled to the global batch); returns that lr."""
    accel = accelerator_name()
    lr = scaled_lr(recipe, global_batch)
    if not abs(lr) <= FLOAT32_MAX:  # each recipe value is checked alone; the scaled product can still overflow
        o = recipe.optim
        raise ConfigError(
            f"optim.lr={o.lr:g} x global batch {global_batch} / optim.base_batch {o.base_batch} "
            f"= {lr:.4g} overflows float32 (largest {FLOAT32_MAX:.4g}); lower optim.lr"
        )
    if "optimizer" in cfg:
        opt = cfg["optimizer"]
        _fill_optimizer_type(opt, recipe)
        params = opt.setdefault("params", {})
        where = "optimizer.params"
        fill_field(params, "lr", lr, f"{where}.lr", close=True)
        if recipe.optim.name == "sgd":
            _fill_sgd(params, recipe, where)
            return lr
        fill_field(params, "betas", [float(b) for b in recipe.optim.betas], f"{where}.betas")
        if recipe.optim.name == "lion":
            _drop_foreign_keys(params, ("eps", "torch_adam"), where, "DeepSpeed's Lion", "")
        else:
            fill_field(params, "eps", float(recipe.optim.eps), f"{where}.eps", close=True)
        fill_field(params, "weight_decay", float(recipe.optim.weight_decay), f"{where}.weight_decay", close=True)
        # on the CPU accelerator, plain torch AdamW avoids a ~35 s FusedAdam JIT build; offload
        # needs DeepSpeed's CPU Adam, which DeepSpeed picks itself.
        if (
            str(opt.get("type", "")).lower() in ("adam", "adamw")
            and accel == "cpu"
            and offload_of(cfg, "optimizer") is None
        ):
            params.setdefault("torch_adam", True)
        if params.get("torch_adam") == AUTO:
            params["torch_adam"] = accel == "cpu" and offload_of(cfg, "optimizer") is None
    return lr


# optim.name -> the DeepSpeed optimizer.type it writes ("SGD": DeepSpeed builds torch.optim.SGD)
OPTIMIZER_TYPES = {"adamw": "AdamW", "lion": "Lion", "sgd": "SGD"}


def _drop_foreign_keys(params: dict[str, Any], keys: tuple[str, ...], where: str, name: str, hint: str) -> None:
    """Remove the Adam keys an optimizer named ``name`` has no use for: "auto" silently, a value in one line."""
    for key in [k for k in keys if k in params]:
        if params[key] != AUTO:
            raise ConfigError(
                f'deepspeed config {where}.{key}={params[key]!r}: {name} has no {key} (remove it or write "auto"{hint})'
            )
        del params[key]


def _fill_sgd(params: dict[str, Any], recipe: Recipe, where: str) -> None:
    """AVION's CLS optimizer (``scripts/main_lavila_finetune_cls.py`` line 221: ``torch.optim.SGD(lr,
    momentum=betas[0], weight_decay=wd)``): momentum ``optim.betas[0]``, no Nesterov, coupled weight decay;
    the Adam keys (betas, eps, torch_adam) are refused unless "auto", then removed."""
    _drop_foreign_keys(params, ("betas", "eps", "torch_adam"), where, "SGD", "; optim.betas[0] is its momentum")
    fill_field(params, "momentum", float(recipe.optim.betas[0]), f"{where}.momentum", close=True)
    fill_field(params, "nesterov", False, f"{where}.nesterov")
    fill_field(params, "weight_decay", float(recipe.optim.weight_decay), f"{where}.weight_decay", close=True)


def allow_sgd_under_zero(cfg: dict[str, Any], recipe: Recipe) -> None:
    """``optim.name: sgd``: DeepSpeed's ZeRO asks ``zero_allow_untested_optimizer`` for torch's SGD, and its
    optimizer offload ``zero_force_ds_cpu_optimizer: false`` (SGD runs as is on the CPU partitions)."""
    if recipe.optim.name != "sgd":
        return
    if stage_of(cfg) > 0:
        fill_field(cfg, "zero_allow_untested_optimizer", True, "zero_allow_untested_optimizer")
    if offload_of(cfg, "optimizer") is not None:
        fill_field(cfg, "zero_force_ds_cpu_optimizer", False, "zero_force_ds_cpu_optimizer")


def _fill_optimizer_type(opt: dict[str, Any], recipe: Recipe) -> None:
    """``optimizer.type`` "auto" (or absent) from ``optim.name``; Lion or SGD in only one of the two is a
    conflict (other JSON types, e.g. Adam, are the JSON's choice under ``optim.name: adamw``)."""
    name = recipe.optim.name
    given = opt.get("type", AUTO)
    if given == AUTO or given is None:
        opt["type"] = OPTIMIZER_TYPES[name]
        return
    kind = str(given).lower()
    if any((kind == own) != (name == own) for own in ("lion", "sgd")):
        raise ConfigError(
            f"deepspeed config optimizer.type={given!r} conflicts with the recipe value optim.name={name!r}"
            ' (write "auto" in the JSON or change the recipe)'
        )


def lion_needs_client(plan: DSPlan, accel: str | None = None) -> bool:
    """True when a built config's Lion cannot be DeepSpeed's JSON optimizer: on the CPU accelerator without
    offload DeepSpeed would build its GPU-only FusedLion, so the engine gets DeepSpeed's CPU Lion as a client
    optimizer instead (``engine.optim.client_optimizer``)."""
    lion = (plan.optimizer_type or "").lower() == "lion"
    return lion and (accel or accelerator_name()) == "cpu" and not plan.offloads_optimizer
