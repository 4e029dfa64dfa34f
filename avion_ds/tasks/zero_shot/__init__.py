"""Zero-shot classification by text prompts (``task: zeroshot``): the task, its ``zeroshot`` recipe
section and the class names / prompt templates it reads."""

from avion_ds.tasks.zero_shot.section import ZeroShotConfig
from avion_ds.tasks.zero_shot.task import ZeroShotTask

__all__ = ["ZeroShotConfig", "ZeroShotTask"]
