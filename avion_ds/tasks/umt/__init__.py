"""Unmasked-teacher distillation (``task: umt``): the task, its ``umt`` recipe section, the frozen CLIP
teacher, the student with its CLIP decoders, the masks and the losses."""

from avion_ds.tasks.umt.section import UMTConfig
from avion_ds.tasks.umt.task import UMTTask

__all__ = ["UMTConfig", "UMTTask"]
