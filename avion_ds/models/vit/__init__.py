"""The VideoMAE-style video ViT family: ``model`` (``VideoViT``, its blocks), ``sizes`` (the registered
``vit_*`` names), ``weights`` (one checkpoint filter per format), ``kinetics710`` (Kinetics-710 head
label maps) and ``hf`` (export to Hugging Face transformers)."""

from avion_ds.models.vit import sizes  # noqa: F401 - registers the vit_* sizes
from avion_ds.models.vit.model import VideoViT, count_params

__all__ = ["VideoViT", "count_params"]
