"""Video-text contrastive pretraining (``task: contrastive``): the task, its ``contrastive`` recipe section
and its losses (ClipLoss, the feature cache)."""

from avion_ds.tasks.contrastive.section import ContrastiveConfig
from avion_ds.tasks.contrastive.task import ContrastiveTask

__all__ = ["ContrastiveConfig", "ContrastiveTask"]
