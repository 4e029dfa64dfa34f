"""Video model families, one folder each (architecture, registered sizes, weight adapter): ``vit`` (the
VideoMAE-style video ViT classifiers), ``mae`` (masked-autoencoder pretraining), ``clip`` (CLIP-style
video-text dual encoders and classifiers on their video tower). Shared here: the registry, the
architecture dataclass, attention backends, blocks' parts, activation checkpointing, ZeRO-3
construction, FLOPs, the listing and generic weight loading (``weights/``). The CLIP tokenizer is in
avion_ds.data.tokenizer."""

from avion_ds.models.activation_checkpointing import (
    apply_activation_checkpointing,
    remove_activation_checkpointing,
)
from avion_ds.models.arch import ViTArch
from avion_ds.models.attention import resolve_backend
from avion_ds.models.clip import ClipArch, TextArch, TextTransformer, VideoTextDualEncoder
from avion_ds.models.flops import model_flops
from avion_ds.models.mae import MAEArch, VideoMAEPretrain, pretrain_arch
from avion_ds.models.registry import (
    create_model,
    list_models,
    register_model,
    registered_arch,
)
from avion_ds.models.vit import VideoViT, count_params
from avion_ds.models.weights.loading import load_weights
from avion_ds.models.weights.report import LoadReport

__all__ = [
    "ClipArch",
    "LoadReport",
    "MAEArch",
    "TextArch",
    "TextTransformer",
    "ViTArch",
    "VideoMAEPretrain",
    "VideoTextDualEncoder",
    "VideoViT",
    "apply_activation_checkpointing",
    "count_params",
    "create_model",
    "list_models",
    "load_weights",
    "model_flops",
    "pretrain_arch",
    "register_model",
    "registered_arch",
    "remove_activation_checkpointing",
    "resolve_backend",
]
