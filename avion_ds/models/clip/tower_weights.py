"""A dual encoder's video tower into a ``VideoViT`` classifier (fine-tuning from contrastive weights).

Source ``dual_encoder`` of :mod:`~avion_ds.models.vit.weights` (registered in its ``FILTERS`` on
import): our ``VideoTextDualEncoder`` (``visual.*``, ``textual.*``, ``logit_scale``; a plain state dict,
DeepSpeed ``module.``, a run directory or an ``avion-ds export`` file), AVION / LaViLa
(``module.visual.transformer.resblocks...``, ``module.textual...``) and OpenAI CLIP / OpenCLIP
(``visual.transformer...``, the text tower at the top level), keys mapped by
:func:`~avion_ds.models.clip.weights.map_clip_key`.

``visual.<name>`` loads as ``<name>`` (a ``vit_clip_*`` classifier has the tower's names). The text
tower, ``logit_scale`` and ``visual.proj`` (a classifier has no projection) are reported ``dropped``,
with a note counting them; keys neither tower knows stay ``unexpected``. AVION's fine-tuned classifiers
(``VideoClassifier``: ``module.visual.*`` + ``module.fc_cls.*``, e.g. its EK-100 CLS releases) load whole:
``fc_cls`` becomes the model's one classifier (``head`` or its only ``heads.<name>``; a head of another
size stays fresh, reported ``dropped``). The temporal embedding is
resized as for the dual encoder (AVION's ``inflate_positional_embeds``: linear in time for more
frames, the first frames for fewer), the spatial position table bicubic for another image size; a
file without a temporal embedding (CLIP) leaves the model's zeros. Without ``fc_cls`` the classifier head
is ``fresh``.
"""

from __future__ import annotations

import torch

from avion_ds.models.clip.weights import (
    FORMAT_MEAN_STD,
    PROJECTIONS,
    detect_clip_format,
    map_clip_key,
    resize_spatial,
    resize_temporal,
)
from avion_ds.models.partition import state_shapes
from avion_ds.models.vit.model import VideoViT
from avion_ds.models.vit.weights import DUAL_ENCODER, FILTERS
from avion_ds.models.weights.report import LoadReport

StateDict = dict[str, torch.Tensor]
LAYOUTS = {"avion_ds": "ours", "avion": "AVION / LaViLa", "clip": "OpenAI CLIP / OpenCLIP"}
_HEADS = ("head.", "heads.")


def _fit(key: str, v: torch.Tensor, want: torch.Size, model: VideoViT, report: LoadReport) -> torch.Tensor:
    """``v`` (a video-tower tensor named ``key`` in the model) in the model's shape where it can be:
    reshaped (CLIP's 0-d / 2-d tables, 4-D conv1), temporal / spatial tables resized (reported); a
    patch weight of another size goes on as 5-D for ``vit.weights``' resizing, anything else unchanged
    (``vit.weights`` names a shape it cannot fit)."""
    if v.shape == want:
        return v
    dim = want[-1]
    if v.numel() == want.numel():
        return v.reshape(want)
    if key == "temporal_embed" and v.shape[-1] == dim:
        frames = v.reshape(-1, dim).shape[0]
        report.resized.append(key)
        report.notes.append(f"temporal embedding {frames} -> {want[1]} frames")
        return resize_temporal(v.reshape(-1, dim), want[1]).reshape(want)
    if key == "pos_embed" and v.shape[-1] == dim and model.arch.pos_embed == "clip":
        report.resized.append(key)
        return resize_spatial(v.reshape(-1, dim), model.patch_embed.grid[1]).reshape(want)
    if key == "patch_embed.proj.weight" and v.dim() == 4:  # CLIP's conv1 (D, C, p, p): one frame deep
        return v.unsqueeze(2)
    return v


def _classifier_prefix(target: dict[str, torch.Size]) -> str | None:
    """Where AVION's ``fc_cls`` goes: ``head.`` or the only ``heads.<name>.``; None for several heads."""
    heads = sorted({k.split(".")[1] for k in target if k.startswith("heads.")})
    if len(heads) == 1:
        return f"heads.{heads[0]}."
    return "head." if not heads and "head.weight" in target else None


def filter_dual_encoder(sd: StateDict, model: VideoViT, report: LoadReport) -> StateDict:
    """The video tower of a dual-encoder state dict under the model's names (see the module doc)."""
    layout = detect_clip_format(sd)
    report.mean_std = FORMAT_MEAN_STD[layout]  # the dual encoder's own normalisation
    target = state_shapes(model)
    out: StateDict = {}
    text: list[str] = []
    other: list[str] = []
    classifier = _classifier_prefix(target)
    for key, v in sd.items():
        name = key if layout == "avion_ds" else map_clip_key(key, layout)
        if name is None:  # not a weight (CLIP's attn_mask, TorchScript attributes)
            continue
        sub = name.removeprefix("visual.")
        if name.startswith("fc_cls.") and classifier is not None:  # AVION's VideoClassifier head
            mine = classifier + name.removeprefix("fc_cls.")
            if target.get(mine) == v.shape:
                out[mine] = v
            else:  # another class count: the model's head stays fresh
                other.append(key)
        elif name.startswith("visual.") and sub in target:
            out[sub] = _fit(sub, v, target[sub], model, report)
        elif name.startswith("textual."):
            text.append(key)
        elif name in PROJECTIONS:
            other.append(key)
        else:
            out[key] = v  # unknown: reported unexpected
    report.dropped.extend(text + other)
    what = [f"text tower ({len(text)} tensors)"] if text else []
    fc_cls = classifier is not None and classifier + "weight" in out
    source = "AVION VideoClassifier (visual + fc_cls)" if "fc_cls.weight" in sd else f"dual encoder ({LAYOUTS[layout]})"
    report.notes.append(
        f"{source}: video tower loaded"
        + (f", classifier from fc_cls ({sd['fc_cls.weight'].shape[0]} classes)" if fc_cls else "")
        + (f"; dropped {', '.join(what + sorted(other))}" if text or other else "")
    )
    if "temporal_embed" in target and "temporal_embed" not in out:
        report.fresh.append("temporal_embed")
        report.notes.append("temporal embedding starts at zeros (none in the checkpoint)")
    head = [k for k in target if k.startswith(_HEADS) and k not in out]
    if head:
        report.fresh.extend(head)
        report.notes.append("classifier head fresh")
    return out


FILTERS[DUAL_ENCODER] = filter_dual_encoder
