"""timm-style model registry: one small registered constructor per size.

``create_model(name, pretrained=None, **overrides)`` looks the name up, builds the architecture
with overrides applied, constructs the model and optionally loads weights through
``load_pretrained`` (weights never change the architecture). Models are any ``nn.Module``: the
video ViTs here, the pretraining models (``mae``), the video-text dual encoders (``clip``); an
architecture is any dataclass with a ``name`` and a validating ``replace`` (``ViTArch``,
``ClipArch``).
"""

from __future__ import annotations

import difflib
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, Self

from torch import nn

from avion_ds.models.arch import ViTArch
from avion_ds.models.vit import VideoViT

logger = logging.getLogger(__name__)


class Arch(Protocol):
    """What the registry needs of an architecture description."""

    name: str

    def validate(self) -> Self: ...

    def replace(self, **overrides: Any) -> Self: ...


_MODELS: dict[str, Callable[..., nn.Module]] = {}
_ARCHS: dict[str, Arch] = {}


def register_model(fn: Callable[..., nn.Module]) -> Callable[..., nn.Module]:
    """Register a constructor under its function name."""
    _MODELS[fn.__name__] = fn
    return fn


def register_arch(name: str, arch: Arch) -> Arch:
    """Record the (validated) architecture a registered name builds, for ``get_arch``."""
    _ARCHS[name] = arch.validate()
    return _ARCHS[name]


def list_models(pattern: str | None = None) -> list[str]:
    """Sorted registered names, optionally filtered by a substring."""
    return sorted(n for n in _MODELS if pattern is None or pattern in n)


def _unknown(name: str) -> ValueError:
    close = difflib.get_close_matches(name, list(_MODELS), n=3, cutoff=0.5)
    hint = f"; did you mean {', '.join(close)}?" if close else f"; known: {', '.join(list_models())}"
    return ValueError(f"unknown model {name!r}{hint}")


def get_arch(name: str, **overrides: Any) -> Any:
    """The architecture a registered name builds, with overrides applied (nothing is allocated)."""
    if name not in _ARCHS:
        raise _unknown(name)
    return _ARCHS[name].replace(**overrides)


def create_model(name: str, pretrained: str | Path | dict | None = None, **overrides: Any) -> nn.Module:
    """Build a registered model; ``pretrained`` is any checkpoint ``load_pretrained`` understands.

    overrides: any ``ViTArch`` field, e.g. num_frames, img_size, tubelet_size, num_classes, heads,
    drop_path_rate, head_drop_rate, attn_backend, patch_embed, pool, pos_embed; for a dual encoder
    (``clip_*``) also ``text_<field>``, ``proj_dim``, ``freeze_logit_scale`` and ``projection``
    (see ``avion_ds.models.clip``).
    """
    if name not in _MODELS:
        raise _unknown(name)
    return _MODELS[name](pretrained=pretrained, **overrides)


def build_registered(
    name: str,
    pretrained: str | Path | dict | None,
    overrides: dict[str, Any],
    construct: Callable[[Any], nn.Module],
) -> nn.Module:
    """``construct`` the registered architecture with ``overrides``, then load ``pretrained`` (any
    format the model's loader knows; partitioned models are filled shard by shard)."""
    model = construct(_ARCHS[name].replace(**overrides))
    if pretrained is not None and pretrained != "":
        from avion_ds.models.weights.sharded import load_pretrained_sharded

        report = load_pretrained_sharded(model, pretrained)
        logger.info("%s: loaded %s", name, report.summary())
    return model


def _build(name: str, pretrained: str | Path | dict | None, overrides: dict[str, Any]) -> VideoViT:
    return build_registered(name, pretrained, overrides, VideoViT)  # type: ignore[return-value]


def _arch(name: str, **fields: Any) -> Arch:
    return register_arch(name, ViTArch(name=name, **fields))


# ----------------------------------------------------------------------------------------------
# sizes (VideoMAE / VideoMAEv2; tubelet 2x16x16, 16 frames x 224 px unless noted)
# ----------------------------------------------------------------------------------------------
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
