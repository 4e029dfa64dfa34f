"""Analytic forward FLOPs of a video ViT (for MFU): matmuls as 2 * multiply-accumulates.

Counted: tubelet embedding, q/k/v projection, attention scores Q K^T and A V, output projection,
MLP, classifier(s). Not counted: norms, softmax, GELU, residual adds (elementwise; how far that puts
us from DeepSpeed's flops profiler is bounded in tests/models/test_flops.py). Training step FLOPs ~=
3x forward (4x with full activation checkpointing: one more forward).
"""

from __future__ import annotations

from torch import nn

from avion_ds.models.arch import ViTArch


def arch_flops(arch: ViTArch) -> int:
    """Forward FLOPs for one clip of ``arch``."""
    t, h, w = arch.grid
    n_patch = t * h * w
    n = n_patch + (1 if arch.pool == "cls" else 0)
    d = arch.embed_dim
    hidden = arch.mlp_hidden
    patch_in = arch.in_chans * arch.tubelet_size * arch.patch_size * arch.patch_size
    embed = 2 * n_patch * patch_in * d
    per_block = (
        2 * n * d * 3 * d  # qkv
        + 2 * n * n * d  # Q K^T (all heads)
        + 2 * n * n * d  # A V
        + 2 * n * d * d  # output projection
        + 2 * n * d * hidden * 2  # fc1 + fc2
    )
    classes = sum(arch.heads.values()) if arch.heads else arch.num_classes
    return int(embed + arch.depth * per_block + 2 * d * classes)


def model_flops(
    name_or_model: str | nn.Module | ViTArch, num_frames: int | None = None, img_size: int | None = None
) -> int:
    """Forward FLOPs per clip for a registered name, a built VideoViT or a ViTArch.

    ``num_frames`` / ``img_size`` override the model's own input size (e.g. 16 vs 8 frames).
    """
    if isinstance(name_or_model, str):
        from avion_ds.models.registry import get_arch

        arch = get_arch(name_or_model)
    elif isinstance(name_or_model, ViTArch):
        arch = name_or_model
    else:
        arch = getattr(name_or_model, "arch", None)
        if arch is None:
            arch = getattr(getattr(name_or_model, "module", None), "arch", None)  # DeepSpeed engine / DDP
        if not isinstance(arch, ViTArch):
            raise TypeError(
                f"model_flops: expected a model name, VideoViT or ViTArch, got {type(name_or_model).__name__}"
            )
    overrides = {}
    if num_frames is not None:
        overrides["num_frames"] = num_frames
    if img_size is not None:
        overrides["img_size"] = img_size
    if overrides:
        arch = arch.replace(**overrides)
    return arch_flops(arch)
