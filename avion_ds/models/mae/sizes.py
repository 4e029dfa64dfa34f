"""The registered VideoMAE / VideoMAE V2 pretraining sizes and their architectures (``pretrain_arch``)."""

from __future__ import annotations

import dataclasses
import difflib
import logging
from typing import Any

from avion_ds.models.arch import ViTArch
from avion_ds.models.mae.model import MAEArch, VideoMAEPretrain
from avion_ds.models.mae.weights import config_eps, decoder_dims
from avion_ds.models.registry import register_model
from avion_ds.models.weights.checkpoint import checkpoint_state_dict, read_checkpoint
from avion_ds.models.weights.loading import load_weights

logger = logging.getLogger(__name__)

_MAE_ARCHS: dict[str, MAEArch] = {}
_MAE_FIELDS = ("decoder_dim", "decoder_depth", "decoder_heads", "decoder_norm_eps", "norm_pix_loss", "mean", "std")


def _mae(name: str, encoder: dict[str, Any], **decoder: Any) -> None:
    enc = ViTArch(name=name, num_classes=0, drop_path_rate=0.0, **encoder).validate()
    _MAE_ARCHS[name] = MAEArch(encoder=enc, **decoder)


def pretrain_arch(name: str, **overrides: Any) -> MAEArch:
    """The ``MAEArch`` a registered pretraining name builds, with overrides applied: decoder /
    target fields by name, every other key a ``ViTArch`` field of the encoder."""
    if name not in _MAE_ARCHS:
        close = difflib.get_close_matches(name, list(_MAE_ARCHS), n=3, cutoff=0.5)
        raise ValueError(f"unknown pretraining model {name!r}; known: {', '.join(close or sorted(_MAE_ARCHS))}")
    base = _MAE_ARCHS[name]
    for key in ("num_classes", "heads"):
        value = overrides.pop(key, None)
        if value not in (None, 0):
            raise ValueError(f"{name}: a pretraining model has no classifier; got {key}={value!r}")
    mae = {k: overrides.pop(k) for k in list(overrides) if k in _MAE_FIELDS}
    if overrides.get("token_merge", 0) not in (0, None):
        raise ValueError(
            f"{name}: token_merge={overrides['token_merge']!r}: the pretraining encoder does not merge tokens"
        )
    if overrides.get("pool", "mean") != "mean":
        raise ValueError(
            f"{name}: pool expected 'mean' (the encoder's final norm is fc_norm), got {overrides['pool']!r}"
        )
    return dataclasses.replace(base, encoder=base.encoder.replace(**overrides), **mae)


def pretrain_names() -> list[str]:
    """The registered pretraining (masked-autoencoder) names, sorted."""
    return sorted(_MAE_ARCHS)


def file_overrides(name: str, source: Any, sd: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """What a pretraining checkpoint fixes of ``name``'s architecture beyond ``overrides``: the decoder's
    width and depth (from the shapes) and the LayerNorm eps (a Hugging Face config.json's ``layer_norm_eps``),
    where they differ from the registered size; one-line ValueError for a width the heads do not divide."""
    base = pretrain_arch(name, **overrides)
    inferred: dict[str, Any] = {
        k: v for k, v in decoder_dims(sd).items() if k not in overrides and v != getattr(base, k)
    }
    eps = config_eps(source)
    if eps is not None and "norm_eps" not in overrides and eps != base.encoder.norm_eps:
        inferred["norm_eps"] = eps
    if "decoder_dim" in inferred and "decoder_heads" not in overrides and inferred["decoder_dim"] % base.decoder_heads:
        raise ValueError(
            f"{name}: {_source_name(source)} has a {inferred['decoder_dim']} wide decoder, not divisible "
            f"by {base.decoder_heads} heads; pass decoder_heads="
        )
    return inferred


def _build(name: str, pretrained: Any, overrides: dict[str, Any]) -> VideoMAEPretrain:
    """Build ``name``; with ``pretrained``, the decoder's width and depth are the file's (VideoMAE V1
    and V2 differ: ViT-H 640 vs 512 wide) and so is a Hugging Face config's LayerNorm eps, unless given in
    ``overrides``, and the file is read once."""
    if pretrained is None or pretrained == "":
        return VideoMAEPretrain(pretrain_arch(name, **overrides))
    sd = checkpoint_state_dict(read_checkpoint(pretrained))
    base = pretrain_arch(name, **overrides)
    inferred = file_overrides(name, pretrained, sd, overrides)
    if inferred:
        logger.info(
            "%s: %s from %s (registered: decoder dim %d, depth %d)",
            name,
            ", ".join(f"{k}={v}" for k, v in inferred.items()),
            _source_name(pretrained),
            base.decoder_dim,
            base.decoder_depth,
        )
    model = VideoMAEPretrain(pretrain_arch(name, **overrides, **inferred))
    report = load_weights(model, sd)
    logger.info("%s: loaded %s from %s", name, report.summary(), _source_name(pretrained))
    return model


def _source_name(source: Any) -> str:
    return "a state dict" if isinstance(source, dict) else str(source)


# VideoMAE V2 modeling_pretrain sizes: decoder depth 4; S 192 wide / 3 heads, B 384 / 6, L H g 512 / 8.
_mae(
    "pretrain_videomae_test_tiny",
    {"embed_dim": 64, "depth": 2, "num_heads": 2, "num_frames": 4, "img_size": 32},
    decoder_dim=32,
    decoder_depth=1,
    decoder_heads=2,
)
_mae(
    "pretrain_videomae_small_patch16_224",
    {"embed_dim": 384, "depth": 12, "num_heads": 6},
    decoder_dim=192,
    decoder_heads=3,
)
_mae("pretrain_videomae_base_patch16_224", {"embed_dim": 768, "depth": 12, "num_heads": 12})
_mae(
    "pretrain_videomae_large_patch16_224",
    {"embed_dim": 1024, "depth": 24, "num_heads": 16},
    decoder_dim=512,
    decoder_heads=8,
)
_mae(
    "pretrain_videomae_huge_patch16_224",
    {"embed_dim": 1280, "depth": 32, "num_heads": 16},
    decoder_dim=512,
    decoder_heads=8,
)
# VideoMAE (V1) modeling_pretrain: the same sizes, except ViT-H's decoder (640 wide, 8 heads).
_mae(
    "pretrain_videomae_v1_huge_patch16_224",
    {"embed_dim": 1280, "depth": 32, "num_heads": 16},
    decoder_dim=640,
    decoder_heads=8,
)
_mae(
    "pretrain_videomae_giant_patch14_224",
    {"embed_dim": 1408, "depth": 40, "num_heads": 16, "mlp_ratio": 48 / 11, "patch_size": 14},
    decoder_dim=512,
    decoder_heads=8,
)


@register_model
def pretrain_videomae_test_tiny(pretrained: Any = None, **overrides: Any) -> VideoMAEPretrain:
    """Test size: encoder vit_test_tiny (64 wide, 2 deep, 4 frames x 32 px), decoder 32 wide, 1 deep."""
    return _build("pretrain_videomae_test_tiny", pretrained, overrides)


@register_model
def pretrain_videomae_small_patch16_224(pretrained: Any = None, **overrides: Any) -> VideoMAEPretrain:
    """VideoMAE ViT-S/16 pretraining: decoder 4 x 192 wide, 3 heads."""
    return _build("pretrain_videomae_small_patch16_224", pretrained, overrides)


@register_model
def pretrain_videomae_base_patch16_224(pretrained: Any = None, **overrides: Any) -> VideoMAEPretrain:
    """VideoMAE ViT-B/16 pretraining: decoder 4 x 384 wide, 6 heads."""
    return _build("pretrain_videomae_base_patch16_224", pretrained, overrides)


@register_model
def pretrain_videomae_large_patch16_224(pretrained: Any = None, **overrides: Any) -> VideoMAEPretrain:
    """VideoMAE ViT-L/16 pretraining: decoder 4 x 512 wide, 8 heads."""
    return _build("pretrain_videomae_large_patch16_224", pretrained, overrides)


@register_model
def pretrain_videomae_huge_patch16_224(pretrained: Any = None, **overrides: Any) -> VideoMAEPretrain:
    """VideoMAE ViT-H/16 pretraining: decoder 4 x 512 wide, 8 heads."""
    return _build("pretrain_videomae_huge_patch16_224", pretrained, overrides)


@register_model
def pretrain_videomae_v1_huge_patch16_224(pretrained: Any = None, **overrides: Any) -> VideoMAEPretrain:
    """VideoMAE (V1) ViT-H/16 pretraining: decoder 4 x 640 wide, 8 heads (V2's ViT-H: 512)."""
    return _build("pretrain_videomae_v1_huge_patch16_224", pretrained, overrides)


@register_model
def pretrain_videomae_giant_patch14_224(pretrained: Any = None, **overrides: Any) -> VideoMAEPretrain:
    """VideoMAE V2 ViT-g/14 pretraining: decoder 4 x 512 wide, 8 heads, mlp_ratio 48/11."""
    return _build("pretrain_videomae_giant_patch14_224", pretrained, overrides)
