"""Video ViT model family: registry, VideoMAE-style blocks, attention backends, activation
checkpointing, pretrained loading and FLOPs; the CLIP-style video-text dual encoders and their
tokenizer (in avion_ds.data.tokenizer)."""

from avion_ds.models.activation_checkpointing import (
    apply_activation_checkpointing,
    remove_activation_checkpointing,
)
from avion_ds.models.arch import ViTArch
from avion_ds.models.attention import resolve_backend
from avion_ds.models.clip import ClipArch, VideoTextDualEncoder
from avion_ds.models.flops import model_flops
from avion_ds.models.mae import MAEArch, VideoMAEPretrain, get_mae_arch
from avion_ds.models.registry import (
    create_model,
    get_arch,
    list_models,
    register_model,
)
from avion_ds.models.text_tower import TextArch, TextTransformer
from avion_ds.models.vit import VideoViT, count_params
from avion_ds.models.weights.formats import LoadReport, load_pretrained
from avion_ds.models.weights.mae_formats import load_pretrained_mae

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
    "get_arch",
    "get_mae_arch",
    "list_models",
    "load_pretrained",
    "load_pretrained_mae",
    "model_flops",
    "register_model",
    "remove_activation_checkpointing",
    "resolve_backend",
]
