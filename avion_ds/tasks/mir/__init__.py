"""EPIC-100 multi-instance retrieval fine-tuning (``task: mir``): the task and its max-margin loss."""

from avion_ds.tasks.mir.task import MirFinetuneTask

__all__ = ["MirFinetuneTask"]
