"""The registered CLIP-style dual encoders (``clip_*``) and the classifiers on their video towers (``vit_clip_*``).

Importing this module also registers the ``dual_encoder`` weight format of the video ViT loader
(:mod:`~avion_ds.models.clip.tower_weights`), which the ``vit_clip_*`` classifiers load through.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from avion_ds.models.arch import ViTArch
from avion_ds.models.clip import tower_weights  # noqa: F401 - registers the dual-encoder source of load_weights
from avion_ds.models.clip.model import ClipArch, VideoTextDualEncoder
from avion_ds.models.clip.text_tower import TextArch
from avion_ds.models.registry import build_registered, register_arch, register_model, registered_arch
from avion_ds.models.vit.model import VideoViT


def _clip(name: str, vision: dict[str, Any], text: dict[str, Any], proj_dim: int = 256) -> None:
    """Register the ``ClipArch`` of ``name``: ``vision`` / ``text`` fields over the CLIP layout defaults."""
    fields: dict[str, Any] = {
        "tubelet_size": 1,
        "num_frames": 4,
        "num_classes": 0,
        "pool": "cls",
        "pos_embed": "clip",
        "k_bias": True,
        "patch_embed_bias": False,
        "ln_pre": True,
        "proj_dim": proj_dim,
        "drop_path_schedule": "uniform",  # AVION: every block of the video tower drops at drop_path_rate
    }
    v = ViTArch(name=name, **(fields | vision))
    register_arch(name, ClipArch(name=name, vision=v, text=TextArch(name=f"{name}.text", proj_dim=proj_dim, **text)))


def _build(name: str, pretrained: str | Path | dict | None, overrides: dict[str, Any]) -> VideoTextDualEncoder:
    """Build the registered dual encoder ``name``; ``projection`` (an override) says how its projections load."""
    projection = overrides.pop("projection", "auto")
    return build_registered(name, pretrained, overrides, lambda arch: VideoTextDualEncoder(arch, projection))


_clip(
    "clip_vit_test_tiny",
    {"embed_dim": 64, "depth": 2, "num_heads": 2, "patch_size": 8, "num_frames": 2, "img_size": 32},
    {"embed_dim": 32, "depth": 2, "num_heads": 2},
    proj_dim=16,
)
_clip("clip_vit_base_patch16_224", {"embed_dim": 768, "depth": 12, "num_heads": 12}, {"embed_dim": 512, "num_heads": 8})
_clip(
    "clip_vit_large_patch14_224",
    {"embed_dim": 1024, "depth": 24, "num_heads": 16, "patch_size": 14},
    {"embed_dim": 768, "num_heads": 12},
)
_clip(
    "clip_vit_large_patch14_336",
    {"embed_dim": 1024, "depth": 24, "num_heads": 16, "patch_size": 14, "img_size": 336},
    {"embed_dim": 768, "num_heads": 12},
)

# OpenAI's CLIP geometry exactly (QuickGELU, eps 1e-5, its projection width): its released weights, zero-shot
_OPENAI = {"act": "quick_gelu", "norm_eps": 1e-5}
_clip(
    "clip_openai_vit_base_patch16_224",
    {"embed_dim": 768, "depth": 12, "num_heads": 12, **_OPENAI},
    {"embed_dim": 512, "num_heads": 8, **_OPENAI},
    proj_dim=512,
)
_clip(
    "clip_openai_vit_large_patch14_224",
    {"embed_dim": 1024, "depth": 24, "num_heads": 16, "patch_size": 14, **_OPENAI},
    {"embed_dim": 768, "num_heads": 12, **_OPENAI},
    proj_dim=768,
)


@register_model
def clip_vit_test_tiny(pretrained: Any = None, **overrides: Any) -> VideoTextDualEncoder:
    """Test size: video 64 wide, 2 deep, 8 px patches, 2 frames x 32 px; text 32 wide, 2 deep; 16-d space."""
    return _build("clip_vit_test_tiny", pretrained, overrides)


@register_model
def clip_vit_base_patch16_224(pretrained: Any = None, **overrides: Any) -> VideoTextDualEncoder:
    """CLIP ViT-B/16 dual encoder (AVION): video 768/12/12, text 512/8 x 12, 256-d space, 4 frames."""
    return _build("clip_vit_base_patch16_224", pretrained, overrides)


@register_model
def clip_vit_large_patch14_224(pretrained: Any = None, **overrides: Any) -> VideoTextDualEncoder:
    """CLIP ViT-L/14 dual encoder (AVION): video 1024/24/16, text 768/12 x 12, 256-d space, 4 frames."""
    return _build("clip_vit_large_patch14_224", pretrained, overrides)


@register_model
def clip_vit_large_patch14_336(pretrained: Any = None, **overrides: Any) -> VideoTextDualEncoder:
    """CLIP ViT-L/14 at 336 px dual encoder: as clip_vit_large_patch14_224 on 336 px frames."""
    return _build("clip_vit_large_patch14_336", pretrained, overrides)


@register_model
def clip_openai_vit_base_patch16_224(pretrained: Any = None, **overrides: Any) -> VideoTextDualEncoder:
    """OpenAI CLIP ViT-B/16 exactly (QuickGELU, eps 1e-5, 512-d space) over 4 frames: ViT-B-16.pt as released."""
    return _build("clip_openai_vit_base_patch16_224", pretrained, overrides)


@register_model
def clip_openai_vit_large_patch14_224(pretrained: Any = None, **overrides: Any) -> VideoTextDualEncoder:
    """OpenAI CLIP ViT-L/14 exactly (QuickGELU, eps 1e-5, 768-d space) over 4 frames: ViT-L-14.pt as released."""
    return _build("clip_openai_vit_large_patch14_224", pretrained, overrides)


# ----------------------------------------------------------------------------------------------
# classifiers on a dual encoder's video tower (fine-tuning from contrastive / CLIP / AVION weights)
# ----------------------------------------------------------------------------------------------
def _tower_classifier(name: str, dual_encoder: str, num_classes: int) -> None:
    """Register ``name`` as the video tower of the registered ``dual_encoder`` (its ``ViTArch``: CLIP
    layout, exact-erf GELU, eps 1e-6) with a classifier on the class token after ``norm`` (CLIP's
    ``ln_post``) in place of the projection, as AVION's ``VideoClassifier``."""
    tower = registered_arch(dual_encoder).vision
    register_arch(name, tower.replace(name=name, proj_dim=None, num_classes=num_classes))


def _build_classifier(name: str, pretrained: str | Path | dict | None, overrides: dict[str, Any]) -> VideoViT:
    """Build the registered tower classifier ``name``, then load ``pretrained``."""
    return build_registered(name, pretrained, overrides, VideoViT)  # type: ignore[return-value]


_tower_classifier("vit_clip_test_tiny", "clip_vit_test_tiny", num_classes=10)
_tower_classifier("vit_clip_base_patch16_224", "clip_vit_base_patch16_224", num_classes=400)
_tower_classifier("vit_clip_large_patch14_224", "clip_vit_large_patch14_224", num_classes=400)


@register_model
def vit_clip_test_tiny(pretrained: Any = None, **overrides: Any) -> VideoViT:
    """Test size: clip_vit_test_tiny's video tower (64 wide, 2 deep, 8 px patches, 2 frames x 32 px), 10 classes."""
    return _build_classifier("vit_clip_test_tiny", pretrained, overrides)


@register_model
def vit_clip_base_patch16_224(pretrained: Any = None, **overrides: Any) -> VideoViT:
    """clip_vit_base_patch16_224's video tower (768/12/12, per-frame 16 px patches, 4 frames) + classifier."""
    return _build_classifier("vit_clip_base_patch16_224", pretrained, overrides)


@register_model
def vit_clip_large_patch14_224(pretrained: Any = None, **overrides: Any) -> VideoViT:
    """clip_vit_large_patch14_224's video tower (1024/24/16, per-frame 14 px patches, 4 frames) + classifier."""
    return _build_classifier("vit_clip_large_patch14_224", pretrained, overrides)
