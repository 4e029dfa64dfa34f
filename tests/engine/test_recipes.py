"""Shipped recipes load, and build a DeepSpeed config with every shipped JSON at their intended scale."""

from __future__ import annotations

from pathlib import Path

import pytest

from avion_ds.distributed.ds_config import build_ds_config
from avion_ds.tasks import load_recipe

REPO = Path(__file__).resolve().parents[2]
RECIPES = sorted((REPO / "launch" / "recipes").glob("*.yaml"))


@pytest.mark.parametrize("path", RECIPES, ids=[p.stem for p in RECIPES])
def test_recipe_loads_and_builds(path: Path) -> None:
    recipe = load_recipe(path)
    world = 2 if "demo" in path.stem else 8
    for ds in sorted((REPO / "ds_configs").glob("*.json")):
        cfg = build_ds_config(ds, recipe, world_size=world, steps_per_epoch=100)
        assert cfg["train_batch_size"] == recipe.batch.global_batch
    if recipe.data.dataset == "epic":
        want = {"action"} if recipe.epic.label == "action" else {"verb", "noun"}
        assert set(recipe.model.heads or {}) == want
