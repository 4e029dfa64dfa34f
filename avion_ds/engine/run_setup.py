"""Start-up, computed once: every check that can fail cheaply, BEFORE any process group, worker or model.

:func:`prepare_training` reads the recipe and the DeepSpeed JSON, checks data paths, manifest, labels,
model geometry (meta device), weights file, runtime support, batch arithmetic and run-dir identity,
builds the datasets (their annotation files are read here, so a bad row is one line, exit 2) and
returns ONE :class:`RunSetup` that the run uses as it is: the batch plan, steps per epoch, the
resolved DeepSpeed config (handed to DeepSpeed) and its plan (:class:`DSPlan`, what the rest of the run
asks about stage, offload, precision and batch) are computed here and nowhere else.
:func:`prepare_eval` is the same path for `avion-ds eval`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from avion_ds.config import ConfigError, Recipe
from avion_ds.data import build_dataset
from avion_ds.data.errors import DataError, KeyedInputError
from avion_ds.distributed import dist
from avion_ds.distributed.ds_check import validate_with_deepspeed
from avion_ds.distributed.ds_config import BatchPlan, build_ds_config, load_user_config, resolve_batch
from avion_ds.distributed.ds_fields import accelerator_name
from avion_ds.distributed.ds_plan import DSPlan
from avion_ds.engine import preflight as pf
from avion_ds.engine.open_run import OpenedRun
from avion_ds.models.attention import Attention, describe_backend
from avion_ds.tasks import ModelSummary, Task, task_of


@dataclass
class RunSetup:
    """Everything a run needs that start-up resolved (see module doc)."""

    recipe: Recipe
    task: Task
    summary: ModelSummary
    world: int
    plan: BatchPlan
    user_ds: dict[str, Any]
    ds_config: dict[str, Any]  # for deepspeed.initialize / zero.Init and run_dir/ds_config.json
    steps_per_epoch: int
    train_set: Any
    val_set: Any
    ds_plan: DSPlan  # ds_config read once: what library code asks


def optimizer_steps_per_epoch(micro_batches: int, clips: int, recipe: Recipe, plan: BatchPlan) -> int:
    """Optimizer steps per epoch from the micro-batches one rank sees (capped by schedule.steps_per_epoch)."""
    steps = micro_batches // plan.grad_accum
    if recipe.schedule.steps_per_epoch:
        steps = min(steps, recipe.schedule.steps_per_epoch)
    if steps <= 0:
        raise ConfigError(
            f"data.train_csv has {clips} clips: fewer than one optimizer step of {plan.global_batch} "
            f"(micro {plan.micro_batch} x accum {plan.grad_accum} x world {plan.world_size})"
        )
    return steps


def build_split(recipe: Recipe, task: Task, split: str, views: bool) -> Any:
    """The dataset of ``split`` (eval views when ``views``), given what the task draws loader-side; its
    annotation errors are one-line ConfigErrors (no process group exists yet)."""
    e = recipe.eval
    kw = {"temporal_views": e.temporal_views, "spatial_views": e.spatial_views} if views else {}
    try:
        ds = build_dataset(recipe.data, split, seed=recipe.seed, sections=recipe.sections, **kw)
    except KeyedInputError as err:  # names its own key (a file key of the dataset)
        raise ConfigError(str(err)) from None
    except (ValueError, FileNotFoundError, DataError) as err:
        raise ConfigError(f"data.{split}_csv: {err}") from None
    ds.defer_errors = True  # bad samples reported through the loop (named once, fatal on every rank)
    pf.check_chunk_sample(ds, ds.root_key)
    task.prepare_datasets(recipe, ds)
    return ds


def prepare_training(recipe: Recipe, deepspeed_config: dict | str | Path) -> RunSetup:
    """The checked, resolved setup of a training run (see module doc); raises ConfigError (one line)."""
    task = task_of(recipe)
    summary = pf.check_training_inputs(recipe, task)
    user_ds = load_user_config(deepspeed_config)
    world = dist.env_world_size()
    plan = resolve_batch(recipe, world)
    train_set = build_split(recipe, task, "train", views=False)
    val_set = build_split(recipe, task, "val", views=True)
    steps = optimizer_steps_per_epoch(len(train_set) // world // plan.micro_batch, len(train_set), recipe, plan)
    ds_config = build_ds_config(user_ds, recipe, world, steps_per_epoch=steps)  # every conflict surfaces now
    validate_with_deepspeed(ds_config)
    ds_plan = DSPlan.of(ds_config)
    pf.check_plan(recipe, ds_plan, accelerator_name())
    return RunSetup(recipe, task, summary, world, plan, user_ds, ds_config, steps, train_set, val_set, ds_plan)


@dataclass
class EvalSetup:
    """What `avion-ds eval` resolved before any process group: the recipe's task, the opened weights
    (a run directory's checkpoint ``tag``, or a weights file: ``engine.open_run``) and the dataset."""

    recipe: Recipe
    task: Task
    opened: OpenedRun
    dataset: Any

    @property
    def run_dir(self) -> Path | None:
        return self.opened.run_dir

    @property
    def tag(self) -> str | None:
        return self.opened.tag


def prepare_eval(opened: OpenedRun, split: str) -> EvalSetup:
    """The checked setup of an evaluation (the same checks as training's, for ``split`` only); the
    weights were checked by ``open_run``."""
    assert opened.recipe is not None, "open_run(recipe_of=...) gives the recipe"
    recipe = opened.recipe
    task = task_of(recipe)
    pf.check_run_inputs(recipe, task, need_train=split == "train")
    dataset = build_split(recipe, task, split, views=True)
    return EvalSetup(recipe, task, opened, dataset)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def backends_line(model: torch.nn.Module, recipe: Recipe, device: torch.device, dtype: torch.dtype) -> str:
    """Which attention kernel and video decoder actually run (never a silent fallback)."""
    attn = next((m for m in model.modules() if isinstance(m, Attention)), None)
    a = "none"
    if attn is not None:
        a = describe_backend(attn.backend, device, dtype, attn.head_dim, attn.size_bias, attn.packed)
    d = recipe.data
    where = f"helper process, timeout {d.decode_timeout_s:g} s" if d.decode_timeout_s > 0 else "in-process"
    return f"attention backend {a} | decoder {d.decoder} ({where}, {d.decoder_threads} thread(s) per worker)"


# ---------------------------------------------------------------------------------------------
# the run
# ---------------------------------------------------------------------------------------------
