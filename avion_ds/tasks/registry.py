"""``recipe.task`` -> :class:`~avion_ds.tasks.base.Task`; task modules register themselves here."""

from __future__ import annotations

from avion_ds.config import ConfigError
from avion_ds.tasks.base import Task

_TASKS: dict[str, type[Task]] = {}
DEFAULT_TASK = "finetune"


def register_task(cls: type[Task]) -> type[Task]:
    """Class decorator: make ``cls`` the task named ``cls.name``."""
    _TASKS[cls.name] = cls
    return cls


def task_names() -> list[str]:
    return sorted(_TASKS)


def get_task(name: str) -> Task:
    """The task registered as ``name`` ("" = the default, fine-tuning); one-line ConfigError otherwise."""
    cls = _TASKS.get(name or DEFAULT_TASK)
    if cls is None:
        raise ConfigError(
            f"task={name!r} is not one of {', '.join(task_names())}; a task of another package is imported with "
            "--plugin MODULE"
        )
    return cls()
