"""Video ViT model family: registry, VideoMAE-style blocks, attention backends, activation
checkpointing, pretrained loading and FLOPs."""

from .arch import ViTArch
from .attention import resolve_backend
from .checkpointing import (
    apply_activation_checkpointing,
    remove_activation_checkpointing,
)
from .flops import model_flops
from .pretrained import LoadReport, load_pretrained
from .registry import (
    create_model,
    create_model_from_config,
    get_arch,
    list_models,
    register_model,
)
from .vit import VideoViT, count_params

__all__ = [
    "LoadReport",
    "ViTArch",
    "VideoViT",
    "apply_activation_checkpointing",
    "count_params",
    "create_model",
    "create_model_from_config",
    "get_arch",
    "list_models",
    "load_pretrained",
    "model_flops",
    "register_model",
    "remove_activation_checkpointing",
    "resolve_backend",
]
