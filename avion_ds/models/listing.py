"""`avion-ds models`: the registered sizes with parameter counts and forward GFLOPs per clip.

Parameters are counted on a model built on the meta device (no memory is allocated, so even
ViT-g lists instantly); FLOPs come from :func:`avion_ds.models.model_flops`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from avion_ds.models.arch import ViTArch


def video_arch(name: str) -> ViTArch | None:
    """The video transformer a registered ``name`` builds with no overrides (a classifier's own arch, a
    dual encoder's video tower, a pretraining model's encoder); None for an unknown name."""
    from avion_ds.models.mae import get_mae_arch
    from avion_ds.models.registry import get_arch

    if name.startswith("pretrain_"):
        try:
            return get_mae_arch(name).encoder
        except ValueError:
            return None
    try:
        arch = get_arch(name)
    except ValueError:
        return None
    return getattr(arch, "vision", arch)


def describe(
    name: str, num_frames: int | None = None, img_size: int | None = None, num_classes: int | None = None
) -> dict[str, object]:
    """One row: name, width/depth/heads, input, parameters (meta build) and forward GFLOPs per clip."""
    import torch

    from avion_ds.models.flops import model_flops
    from avion_ds.models.mae import get_mae_arch
    from avion_ds.models.registry import create_model, get_arch
    from avion_ds.models.vit import count_params

    over: dict[str, int] = {}
    if num_frames is not None:
        over["num_frames"] = num_frames
    if img_size is not None:
        over["img_size"] = img_size
    if num_classes is not None:
        over["num_classes"] = num_classes
    pretrain = name.startswith("pretrain_")
    if not pretrain and hasattr(get_arch(name), "vision"):  # a dual encoder has no classifier
        over.pop("num_classes", None)
    if pretrain:  # masked-autoencoder sizes: encoder geometry; FLOPs depend on the mask ratio (not listed)
        over.pop("num_classes", None)
        arch = get_mae_arch(name, **over).encoder
    else:
        arch = get_arch(name, **over)
    with torch.device("meta"):
        params = count_params(create_model(name, attn_backend="eager", **over))
    flops = None if pretrain else model_flops(arch) / 1e9
    if hasattr(arch, "vision"):  # dual encoder: the video tower's geometry, FLOPs of both towers
        arch = arch.vision
    return {
        "name": name,
        "width": arch.embed_dim,
        "depth": arch.depth,
        "heads": arch.num_heads,
        "input": f"{arch.num_frames}x{arch.img_size}",
        "patch": f"{arch.tubelet_size}x{arch.patch_size}",
        "classes": "-" if pretrain or not arch.num_classes else arch.num_classes,
        "params_m": params / 1e6,
        "gflops": flops,
    }


def gflops_text(gflops: float) -> str:
    """GFLOPs with one decimal from 1 up, two significant digits below (a test-size model is not 0.0)."""
    return f"{gflops:.1f}" if gflops >= 1 else f"{gflops:.2g}"
