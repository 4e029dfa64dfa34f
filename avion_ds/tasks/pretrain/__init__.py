"""Masked-autoencoder pretraining (``task: pretrain``): the task, its ``pretrain`` recipe section and the
reconstruction grid of ``avion-ds reconstruct``."""

from avion_ds.tasks.pretrain.section import PretrainConfig
from avion_ds.tasks.pretrain.task import PretrainTask

__all__ = ["PretrainConfig", "PretrainTask"]
