"""The dual encoder `avion-ds embed` and `avion-ds search` read: a run directory (its recipe and a
complete checkpoint) or a weights file (ours, AVION, LaViLa, OpenAI CLIP) with a recipe or a model name.
Every check runs before a weight is read; weights without both towers are refused in one line."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from avion_ds.config import ConfigError, Recipe
from avion_ds.engine import preflight as pf
from avion_ds.engine.ema import eval_weights
from avion_ds.engine.export import consolidated
from avion_ds.engine.run_checkpoints import check_tag
from avion_ds.models import load_pretrained
from avion_ds.storage.run_dir import latest_complete, resolve_tag
from avion_ds.tasks import load_recipe
from avion_ds.tasks.zero_shot.task import ZeroShotTask


@dataclass
class LoadedEncoder:
    """The recipe, the model (eval mode, float32 on CPU) and what identifies its weights."""

    recipe: Recipe
    model: nn.Module
    checkpoint: str
    tag: str | None
    fingerprint: str


def fingerprint(model: nn.Module) -> str:
    """A short hash of the projections and the class token: equal for the same weights, different otherwise."""
    h = hashlib.sha256(type(model).__name__.encode())
    state = model.state_dict()
    for key in sorted(k for k in state if k.endswith("proj") or "class_token" in k or "cls_token" in k):
        h.update(key.encode())
        h.update(state[key].detach().float().contiguous().cpu().numpy().tobytes())
    return h.hexdigest()[:16]


def resolve_encoder(
    checkpoint: str, tag: str | None, config: str | None, model_name: str | None, overrides: list[str]
) -> tuple[Recipe, Path | None, str | None]:
    """(recipe, run directory or None, checkpoint tag) with every check done; ConfigError otherwise."""
    path = Path(checkpoint)
    if not path.exists():
        raise ConfigError(f"--checkpoint not found: {path}")
    run_dir = path if path.is_dir() else None
    if config is None and run_dir is not None and (run_dir / "recipe.yaml").is_file():
        config = str(run_dir / "recipe.yaml")
    if config is not None:
        recipe = load_recipe(config, [*overrides, *([f"model.name={model_name}"] if model_name else [])])
    elif model_name:
        recipe = load_recipe(None, [f"task={ZeroShotTask.name}", f"model.name={model_name}", *overrides])
    else:
        raise ConfigError(
            "--checkpoint is a weights file: name its model with --model (e.g. clip_vit_base_patch16_224)"
        )
    ZeroShotTask().check_model(recipe)  # a dual encoder, geometry right
    if run_dir is not None:
        tag = resolve_tag(run_dir, tag) or latest_complete(run_dir)
        if tag is None:
            raise ConfigError(f"--checkpoint {run_dir}: no complete checkpoint in {run_dir / 'checkpoints'}")
        check_tag(run_dir, tag, flag="--tag")
    elif tag is not None:
        raise ConfigError(f"--tag {tag}: --checkpoint {checkpoint} is a weights file, not a run directory")
    pf.check_weights_source(str(checkpoint), recipe.model.trust_checkpoint, "--checkpoint", tag)
    return recipe, run_dir, tag


def load_encoder(
    checkpoint: str,
    tag: str | None = None,
    config: str | None = None,
    model_name: str | None = None,
    overrides: list[str] | None = None,
) -> LoadedEncoder:
    """The checked, loaded dual encoder (see module doc)."""
    recipe, run_dir, tag = resolve_encoder(checkpoint, tag, config, model_name, list(overrides or []))
    task = ZeroShotTask()
    if run_dir is None:
        model = task.build_model(recipe, pretrained=str(checkpoint))  # refuses a checkpoint without both towers
    else:
        model = task.build_model(recipe, pretrained="")
        weights = consolidated(run_dir, tag, recipe.model.trust_checkpoint, eval_weights(recipe))
        load_pretrained(model, weights, strict=True)
    model.eval()
    with torch.no_grad():
        fp = fingerprint(model)
    return LoadedEncoder(recipe, model, str(checkpoint), tag, fp)
