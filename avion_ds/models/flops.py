"""Analytic forward FLOPs of a video ViT (for MFU): matmuls as 2 * multiply-accumulates.

Counted: tubelet embedding, q/k/v projection, attention scores Q K^T and A V, output projection,
MLP, classifier(s), the CLIP projection; for a dual encoder both towers (one caption of the full
context per clip; the causal text attention counted in full, as the kernels compute it). Not counted: norms, softmax, GELU, residual adds (elementwise; how far that puts
us from DeepSpeed's flops profiler is bounded in tests/models/test_flops.py). Training step FLOPs ~=
3x forward (4x with full activation checkpointing: one more forward).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from avion_ds.models.arch import ViTArch
from avion_ds.models.registry import registered_arch


def block_flops(n: int, d: int, hidden: int) -> int:
    """One transformer block on ``n`` tokens of width ``d``."""
    return (
        2 * n * d * 3 * d  # qkv
        + 2 * n * n * d  # Q K^T (all heads)
        + 2 * n * n * d  # A V
        + 2 * n * d * d  # output projection
        + 2 * n * d * hidden * 2  # fc1 + fc2
    )


def arch_flops(arch: Any) -> int:
    """Forward FLOPs for one clip of ``arch``: a ``ViTArch``, or an architecture that counts its own
    (``forward_flops()``, e.g. a ``ClipArch``: both towers)."""
    own = getattr(arch, "forward_flops", None)
    if callable(own):
        return int(own())
    t, h, w = arch.grid
    n_patch = t * h * w
    n = n_patch + (1 if arch.pool == "cls" else 0)
    d = arch.embed_dim
    patch_in = arch.in_chans * arch.tubelet_size * arch.patch_size * arch.patch_size
    embed = 2 * n_patch * patch_in * d
    classes = sum(arch.heads.values()) if arch.heads else arch.num_classes
    proj = 2 * d * (arch.proj_dim or 0)
    return int(embed + arch.depth * block_flops(n, d, arch.mlp_hidden) + proj + 2 * arch.feature_dim * classes)


def _is_arch(obj: Any) -> bool:
    """A ``ViTArch`` or an architecture that counts its own FLOPs."""
    return isinstance(obj, ViTArch) or callable(getattr(obj, "forward_flops", None))


def model_flops(
    name_or_model: str | nn.Module | ViTArch, num_frames: int | None = None, img_size: int | None = None
) -> int:
    """Forward FLOPs per clip for a registered name, a built VideoViT / dual encoder or their arch.

    ``num_frames`` / ``img_size`` override the model's own input size (e.g. 16 vs 8 frames).
    """
    if isinstance(name_or_model, str):
        arch = registered_arch(name_or_model)
    elif _is_arch(name_or_model):
        arch = name_or_model
    else:
        arch = getattr(name_or_model, "arch", None)
        if arch is None:
            arch = getattr(getattr(name_or_model, "module", None), "arch", None)  # DeepSpeed engine / DDP
        if not _is_arch(arch):
            raise TypeError(
                f"model_flops: expected a model name, VideoViT, dual encoder or their arch, "
                f"got {type(name_or_model).__name__}"
            )
    overrides = {}
    if num_frames is not None:
        overrides["num_frames"] = num_frames
    if img_size is not None:
        overrides["img_size"] = img_size
    if overrides:
        arch = arch.replace(**overrides)
    return arch_flops(arch)
