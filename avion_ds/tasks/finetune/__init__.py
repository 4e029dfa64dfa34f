"""Supervised fine-tuning of a video classifier (``task: finetune``, the default): the task, its losses."""

from avion_ds.tasks.finetune.task import FinetuneTask

__all__ = ["FinetuneTask"]
