"""The registered video ViT sizes (VideoMAE / VideoMAEv2; tubelet 2x16x16, 16 frames x 224 px unless noted)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from avion_ds.models.arch import ViTArch
from avion_ds.models.registry import Arch, build_registered, register_arch, register_model
from avion_ds.models.vit.model import VideoViT


def _build(name: str, pretrained: str | Path | dict | None, overrides: dict[str, Any]) -> VideoViT:
    """Build the registered ``name`` with ``overrides``, then load ``pretrained``."""
    return build_registered(name, pretrained, overrides, VideoViT)  # type: ignore[return-value]


def _arch(name: str, **fields: Any) -> Arch:
    """Register the ``ViTArch`` of ``name``."""
    return register_arch(name, ViTArch(name=name, **fields))


_arch("vit_test_tiny", embed_dim=64, depth=2, num_heads=2, num_frames=4, img_size=32, num_classes=10)
_arch("vit_test_small", embed_dim=96, depth=4, num_heads=3, num_frames=8, img_size=64, num_classes=10)
_arch("vit_small_patch16_224", embed_dim=384, depth=12, num_heads=6)
_arch("vit_base_patch16_224", embed_dim=768, depth=12, num_heads=12)
_arch("vit_large_patch16_224", embed_dim=1024, depth=24, num_heads=16)
_arch("vit_huge_patch16_224", embed_dim=1280, depth=32, num_heads=16)
_arch("vit_giant_patch14_224", embed_dim=1408, depth=40, num_heads=16, mlp_ratio=48 / 11, patch_size=14)


@register_model
def vit_test_tiny(pretrained: Any = None, **overrides: Any) -> VideoViT:
    """Test size: 64 wide, 2 deep, 2 heads, 4 frames x 32 px, 10 classes (CPU tests)."""
    return _build("vit_test_tiny", pretrained, overrides)


@register_model
def vit_test_small(pretrained: Any = None, **overrides: Any) -> VideoViT:
    """Test size: 96 wide, 4 deep, 3 heads, 8 frames x 64 px, 10 classes (CPU smoke runs)."""
    return _build("vit_test_small", pretrained, overrides)


@register_model
def vit_small_patch16_224(pretrained: Any = None, **overrides: Any) -> VideoViT:
    """ViT-S/16: 384 wide, 12 deep, 6 heads (~22M)."""
    return _build("vit_small_patch16_224", pretrained, overrides)


@register_model
def vit_base_patch16_224(pretrained: Any = None, **overrides: Any) -> VideoViT:
    """ViT-B/16 (VideoMAE): 768 wide, 12 deep, 12 heads (~87M with a 400-class head)."""
    return _build("vit_base_patch16_224", pretrained, overrides)


@register_model
def vit_large_patch16_224(pretrained: Any = None, **overrides: Any) -> VideoViT:
    """ViT-L/16 (VideoMAE): 1024 wide, 24 deep, 16 heads (~304M)."""
    return _build("vit_large_patch16_224", pretrained, overrides)


@register_model
def vit_huge_patch16_224(pretrained: Any = None, **overrides: Any) -> VideoViT:
    """ViT-H/16 (VideoMAE): 1280 wide, 32 deep, 16 heads (~633M)."""
    return _build("vit_huge_patch16_224", pretrained, overrides)


@register_model
def vit_giant_patch14_224(pretrained: Any = None, **overrides: Any) -> VideoViT:
    """ViT-g/14 (VideoMAEv2): 1408 wide, 40 deep, 16 heads, mlp_ratio 48/11 (~1.01B)."""
    return _build("vit_giant_patch14_224", pretrained, overrides)
