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
from avion_ds.engine.open_run import OpenedRun, RecipeOf, load_line, open_run
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


def _recipe_of(model_name: str | None) -> RecipeOf:
    """How the encoder's recipe is built: the given recipe file (``--model`` overriding its model), or the
    zero-shot task's defaults for a weights file named by ``--model``."""

    def build(config: str | Path | None, overrides: list[str]) -> Recipe:
        named = [f"model.name={model_name}"] if model_name else []
        if config is not None:
            recipe = load_recipe(config, [*overrides, *named])
        elif model_name:
            recipe = load_recipe(None, [f"task={ZeroShotTask.name}", *named, *overrides])
        else:
            raise ConfigError(
                "--checkpoint is a weights file: name its model with --model (e.g. clip_vit_base_patch16_224)"
            )
        ZeroShotTask().check_model(recipe)  # a dual encoder, geometry right
        return recipe

    return build


def open_encoder(
    checkpoint: str, tag: str | None, config: str | None, model_name: str | None, overrides: list[str]
) -> OpenedRun:
    """The checked dual encoder's weights (``engine.open_run``: trust from this command line only)."""
    return open_run(checkpoint, tag=tag, config=config, overrides=overrides, recipe_of=_recipe_of(model_name))


def load_encoder(
    checkpoint: str,
    tag: str | None = None,
    config: str | None = None,
    model_name: str | None = None,
    overrides: list[str] | None = None,
    command: str = "avion-ds embed",
) -> LoadedEncoder:
    """The checked, loaded dual encoder (see module doc); prints the notes and the load line."""
    opened = open_encoder(checkpoint, tag, config, model_name, list(overrides or []))
    recipe = opened.recipe
    assert recipe is not None
    task = ZeroShotTask()
    report = None
    if opened.run_dir is None:
        model = task.build_model(recipe, pretrained=str(checkpoint))  # refuses a checkpoint without both towers
    else:
        model = task.build_model(recipe, pretrained="")
        report = opened.load_into(model)
    print(load_line(command, opened, report), flush=True)
    model.eval()
    with torch.no_grad():
        fp = fingerprint(model)
    return LoadedEncoder(recipe, model, str(checkpoint), opened.tag, fp)
