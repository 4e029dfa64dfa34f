"""The CLIP-style video-text dual encoder family (AVION / LaViLa): ``model`` (``VideoTextDualEncoder``,
``ClipArch``), ``text_tower`` (CLIP's causal text transformer), ``sizes`` (the registered ``clip_*`` dual
encoders and ``vit_clip_*`` tower classifiers), ``weights`` (OpenAI CLIP / OpenCLIP / AVION files) and
``tower_weights`` (a dual encoder's video tower into a classifier)."""

from avion_ds.models.clip import sizes  # noqa: F401 - registers the clip_* and vit_clip_* sizes
from avion_ds.models.clip.model import ClipArch, VideoTextDualEncoder
from avion_ds.models.clip.text_tower import TextArch, TextTransformer

__all__ = ["ClipArch", "TextArch", "TextTransformer", "VideoTextDualEncoder"]
