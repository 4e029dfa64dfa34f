"""`avion-ds models`: the registered sizes with parameter counts and forward GFLOPs per clip.

Parameters are counted on a model built on the meta device (no memory is allocated, so even
ViT-g lists instantly; ``meta_device``: its weight init skipped); FLOPs come from
:func:`avion_ds.models.model_flops`.
"""

from __future__ import annotations

from typing import Any

from avion_ds.models.arch import ViTArch
from avion_ds.models.flops import model_flops
from avion_ds.models.mae.sizes import pretrain_arch, pretrain_names
from avion_ds.models.meta import meta_device
from avion_ds.models.registry import create_model, registered_arch
from avion_ds.models.vit.model import count_params


def _any_arch(name: str, **overrides: Any) -> Any:
    """The architecture object of any registered name: ``ViTArch``, ``ClipArch`` or ``MAEArch``."""
    return pretrain_arch(name, **overrides) if name in pretrain_names() else registered_arch(name, **overrides)


def video_transformer_arch(name: str) -> ViTArch | None:
    """The ``ViTArch`` of the video transformer a registered ``name`` runs with no overrides (a
    classifier's own arch, a dual encoder's video tower, a pretraining model's encoder); None for an
    unknown name."""
    try:
        return _any_arch(name).video_transformer
    except ValueError:
        return None


def describe(
    name: str, num_frames: int | None = None, img_size: int | None = None, num_classes: int | None = None
) -> dict[str, object]:
    """One row: name, width/depth/heads, input, parameters (meta build) and forward GFLOPs per clip."""
    over: dict[str, int] = {}
    if num_frames is not None:
        over["num_frames"] = num_frames
    if img_size is not None:
        over["img_size"] = img_size
    pretrain = name in pretrain_names()
    arch = _any_arch(name, **over)
    classifier = isinstance(arch, ViTArch)  # a dual encoder and a pretraining model have no classifier
    if classifier and num_classes is not None:
        over["num_classes"] = num_classes
        arch = arch.replace(num_classes=num_classes)
    with meta_device():
        params = count_params(create_model(name, attn_backend="eager", **over))
    # a pretraining model's FLOPs depend on the mask ratio (not listed); a dual encoder's count both towers
    flops = None if pretrain else model_flops(arch) / 1e9
    video = arch.video_transformer
    return {
        "name": name,
        "width": video.embed_dim,
        "depth": video.depth,
        "heads": video.num_heads,
        "input": f"{video.num_frames}x{video.img_size}",
        "patch": f"{video.tubelet_size}x{video.patch_size}",
        "classes": video.num_classes if classifier and video.num_classes else "-",
        "params_m": params / 1e6,
        "gflops": flops,
    }


def gflops_text(gflops: float) -> str:
    """GFLOPs with one decimal from 1 up, two significant digits below (a test-size model is not 0.0)."""
    return f"{gflops:.1f}" if gflops >= 1 else f"{gflops:.2g}"
