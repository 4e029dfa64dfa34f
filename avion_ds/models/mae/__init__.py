"""The VideoMAE / VideoMAE V2 masked-autoencoder pretraining family: ``model`` (``VideoMAEPretrain``,
``MAEArch``), ``sizes`` (the registered ``pretrain_videomae_*`` names, ``pretrain_arch``) and ``weights``
(official, Hugging Face and our pretraining layouts)."""

from avion_ds.models.mae.model import MAEArch, VideoMAEPretrain
from avion_ds.models.mae.sizes import pretrain_arch

__all__ = ["MAEArch", "VideoMAEPretrain", "pretrain_arch"]
