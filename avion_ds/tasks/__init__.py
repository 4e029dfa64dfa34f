"""Tasks: what differs between kinds of training, as objects the engine asks (see ``base``).

``recipe.task`` names a registered :class:`~avion_ds.tasks.base.Task` (``registry``); reading a recipe
goes through :func:`load_recipe` here, which applies the task's defaults and checks. A task is one
package (``task`` with the ``@register_task`` class, ``section`` with its registered recipe section) plus
its import line below; a task of another package is imported by ``--plugin MODULE`` (``cli.plugins``).
Code more than one task uses lives in ``common``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from avion_ds.config import ConfigError, load_recipe_data, recipe_from_dict
from avion_ds.data.datasets.build import dataset_problem, heads_problem
from avion_ds.data.datasets.protocols import check_recipe as check_protocol
from avion_ds.tasks import contrastive, finetune, mir, pretrain, umt, zero_shot  # noqa: F401 - registration: one line per task
from avion_ds.tasks.base import EvalContext, EvalOutcome, ModelSummary, Task
from avion_ds.tasks.registry import get_task, register_task, task_names

if TYPE_CHECKING:
    from avion_ds.config import Recipe


def build_recipe(data: dict[str, Any]) -> Recipe:
    """A validated Recipe from a plain mapping: the task's defaults under the mapping's keys, the generic
    checks, then the task's own; ``task`` is filled with the resolved name."""
    if not isinstance(data.get("task", ""), str):
        raise ConfigError(f"task={data.get('task')!r} is not one of {', '.join(task_names())}")
    task = get_task(data.get("task", ""))
    recipe = recipe_from_dict({**data, "task": task.name}, task.recipe_defaults)
    problem = (  # registered datasets, heads they need, protocol (data layer)
        dataset_problem(recipe.data)
        or heads_problem(recipe.data, recipe.model.heads, recipe.sections)
        or check_protocol(recipe)
    )
    if problem:
        raise ConfigError(problem)
    task.validate_recipe(recipe)
    return recipe


def load_recipe(path: str | Path | None, overrides: list[str] | None = None) -> Recipe:
    """THE recipe loader: YAML (or defaults when ``path`` is None) + dotted overrides, task defaults, checks."""
    return build_recipe(load_recipe_data(path, overrides))


def task_of(recipe: Recipe) -> Task:
    """The task a built recipe names."""
    return get_task(recipe.task)


__all__ = [
    "EvalContext",
    "EvalOutcome",
    "ModelSummary",
    "Task",
    "build_recipe",
    "get_task",
    "load_recipe",
    "register_task",
    "task_names",
    "task_of",
]
