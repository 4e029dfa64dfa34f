"""Optimizer parameter groups: no weight decay for norms/biases/position embeddings, layer-wise lr decay.

The groups carry an ``lr_scale`` that the schedule multiplies into every lr it sets, so the same
groups work with DeepSpeed's JSON optimizer (handed to ``deepspeed.initialize`` as
``model_parameters``) and with a client ``torch.optim.AdamW``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from avion_ds.config import Recipe
from avion_ds.distributed.ds_fields import accelerator_name
from avion_ds.distributed.ds_optimizer import lion_needs_client
from avion_ds.distributed.ds_plan import DSPlan
from avion_ds.models.partition import full_ndim


def _strip_wrappers(name: str) -> str:
    """Remove activation-checkpoint / DDP wrapper segments so names match the bare model's."""
    for seg in ("_checkpoint_wrapped_module.", "_fsdp_wrapped_module.", "_orig_mod."):
        name = name.replace(seg, "")
    return name.removeprefix("module.")


def _no_decay_names(model: nn.Module) -> set[str]:
    fn = getattr(model, "no_weight_decay", None)
    return set(fn()) if callable(fn) else set()


def _num_layers(model: nn.Module) -> int:
    """Number of layer ids (0 = embeddings, 1..depth = blocks, depth+1 = head)."""
    depth = getattr(model, "depth", None)
    if depth is None:
        blocks = getattr(model, "blocks", None)
        depth = len(blocks) if blocks is not None else 0
    return int(depth) + 2


def avion_no_decay(name: str, p: torch.Tensor) -> bool:
    """AVION's rule (``scripts/main_lavila_pretrain.py`` lines 155-157, the same in
    ``scripts/main_lavila_finetune_cls.py`` lines 199-202: ``p.ndim < 2 or 'bias' in n or 'ln'
    in n or 'bn' in n or 'pos_embed' in n or 'positional_embedding' in n``) on our names: 1-d tensors,
    biases, norms, position embeddings and the class token (1-d in AVION) are not decayed; the temporal
    embedding, the token embedding, the patch embedding and the projections are."""
    return full_ndim(p) < 2 or "bias" in name or "norm" in name or "pos_embed" in name or name.endswith("cls_token")


def param_groups(
    model: nn.Module, weight_decay: float, layer_decay: float = 1.0, no_decay: str = "model"
) -> list[dict[str, Any]]:
    """Group trainable parameters by (decay?, layer id) with ``lr_scale = layer_decay ** (L-1-id)``.

    ``no_decay="model"``: no decay for parameters named by ``model.no_weight_decay()`` and every
    parameter with ndim <= 1 (norm weights, biases); ``"avion"``: :func:`avion_no_decay`. Layer ids come
    from ``model.layer_id(name)`` when layer decay < 1.
    """
    skip = _no_decay_names(model) if no_decay == "model" else set()
    layer_id = getattr(model, "layer_id", None)
    use_layers = layer_decay < 1.0 and callable(layer_id)
    n_layers = _num_layers(model)
    groups: dict[tuple[bool, int], dict[str, Any]] = {}
    for raw_name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        name = _strip_wrappers(raw_name)
        if no_decay == "avion":
            exempt = avion_no_decay(name, p)
        else:
            exempt = full_ndim(p) <= 1 or name in skip or name.endswith(".bias")
        lid = int(layer_id(name)) if use_layers else n_layers - 1
        key = (exempt, lid)
        if key not in groups:
            scale = layer_decay ** (n_layers - 1 - lid) if use_layers else 1.0
            groups[key] = {
                "params": [],
                "names": [],
                "weight_decay": 0.0 if exempt else weight_decay,
                "lr_scale": scale,
            }
        groups[key]["params"].append(p)
        groups[key]["names"].append(name)
    return [groups[k] for k in sorted(groups)]


def optimizer_groups(model: nn.Module, recipe: Recipe) -> list[dict[str, Any]]:
    """Parameter groups for ``deepspeed.initialize(model_parameters=...)`` (names dropped)."""
    out = []
    o = recipe.optim
    for g in param_groups(model, o.weight_decay, o.layer_decay, o.no_decay):
        out.append({k: v for k, v in g.items() if k != "names"})
    return out


def _start_lr(groups: list[dict[str, Any]], lr: float) -> None:
    """Each group's first lr (``lr x lr_scale``) where the group does not set one; the schedule sets the rest."""
    for g in groups:
        g.setdefault("lr", lr * g.get("lr_scale", 1.0))


def client_lion(
    groups: list[dict[str, Any]], recipe: Recipe, lr: float, params: dict[str, Any], cpu: bool
) -> torch.optim.Optimizer:
    """DeepSpeed's own Lion over ``groups`` as a client optimizer: ``DeepSpeedCPULion`` when ``cpu`` (CPU
    accelerator or offloaded optimizer), else ``FusedLion``. ``params``: the filled JSON optimizer params
    (lr, betas, weight decay), if any; the recipe's otherwise."""
    from deepspeed.ops.lion import DeepSpeedCPULion, FusedLion  # lazy: deepspeed takes seconds to import

    lr = float(params.get("lr", lr))
    betas = tuple(params.get("betas", recipe.optim.betas))
    wd = float(params.get("weight_decay", recipe.optim.weight_decay))
    _start_lr(groups, lr)
    return (DeepSpeedCPULion if cpu else FusedLion)(groups, lr=lr, betas=betas, weight_decay=wd)


def client_optimizer(
    groups: list[dict[str, Any]], recipe: Recipe, lr: float, ds_config: dict[str, Any], plan: DSPlan
) -> tuple[torch.optim.Optimizer | None, dict[str, Any]]:
    """(client optimizer or None, config for ``deepspeed.initialize``): None and the config as is when the
    JSON ``optimizer`` is DeepSpeed's to build; otherwise the recipe's optimizer (``optim.name``) over
    ``groups`` and the config without its ``optimizer`` section (DeepSpeed takes one or the other).
    ``plan``: ``ds_config``'s plan (offload, optimizer type)."""
    section = ds_config.get("optimizer")
    if section is not None and not lion_needs_client(plan):
        return None, ds_config
    rest = {k: v for k, v in ds_config.items() if k != "optimizer"}
    if recipe.optim.name == "lion":
        cpu = accelerator_name() == "cpu" or plan.offloads_optimizer
        return client_lion(groups, recipe, lr, (section or {}).get("params", {}), cpu), rest
    if recipe.optim.name == "sgd":
        return client_sgd(groups, recipe, lr), rest
    return client_adamw(groups, recipe, lr), rest


def client_sgd(groups: list[dict[str, Any]], recipe: Recipe, lr: float) -> torch.optim.Optimizer:
    """A torch SGD over ``groups`` as AVION's CLS script builds it (momentum ``optim.betas[0]``, no
    Nesterov, coupled weight decay); used when the DeepSpeed JSON has no ``optimizer`` section."""
    _start_lr(groups, lr)
    return torch.optim.SGD(
        groups, lr=lr, momentum=recipe.optim.betas[0], nesterov=False, weight_decay=recipe.optim.weight_decay
    )


def client_adamw(groups: list[dict[str, Any]], recipe: Recipe, lr: float) -> torch.optim.Optimizer:
    """A torch AdamW over ``groups``; used when the DeepSpeed JSON has no ``optimizer`` section."""
    _start_lr(groups, lr)
    return torch.optim.AdamW(
        groups, lr=lr, betas=tuple(recipe.optim.betas), eps=recipe.optim.eps, weight_decay=recipe.optim.weight_decay
    )
