"""The recipe of a pretraining run for the commands that look at one (`avion-ds reconstruct`)."""

from __future__ import annotations

from pathlib import Path

from avion_ds.config import ConfigError, Recipe
from avion_ds.tasks import load_recipe
from avion_ds.tasks.pretrain.task import PretrainTask


def pretraining_recipe(config: str | Path | None, overrides: list[str]) -> Recipe:
    """The recipe of a pretraining run (``config``: its recipe.yaml); a missing file or any other task is
    refused in one line."""
    if config is None or not Path(config).is_file():
        raise ConfigError("--config is required when --checkpoint is not a run directory with recipe.yaml")
    recipe = load_recipe(config, overrides)
    if recipe.task != PretrainTask.name:
        raise ConfigError(f"{config}: task={recipe.task!r}; reconstruct needs a pretraining run (task: pretrain)")
    return recipe
