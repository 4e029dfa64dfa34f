"""Video ViT model family: registry, VideoMAE-style blocks, attention backends, activation
checkpointing, pretrained loading and FLOPs."""

from .arch import ViTArch
from .attention import resolve_backend
from .checkpointing import (
    apply_activation_checkpointing,
    remove_activation_checkpointing,
)
from .flops import model_flops
from .pretrain import MAEArch, VideoMAEPretrain, get_mae_arch
from .pretrained import LoadReport, load_pretrained
from .pretrained_mae import load_pretrained_mae
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
    "MAEArch",
    "ViTArch",
    "VideoMAEPretrain",
    "VideoViT",
    "apply_activation_checkpointing",
    "count_params",
    "create_model",
    "create_model_from_config",
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
