"""Dual-encoder weights from the files people start from, into a ``VideoTextDualEncoder``.

Layouts (detected from the keys; the file never changes the architecture):

* ``clip``      OpenAI CLIP / OpenCLIP: ``visual.{conv1,class_embedding,positional_embedding,ln_pre,
  transformer.resblocks.N,ln_post,proj}`` and the text tower at the top level
  (``token_embedding``, ``positional_embedding``, ``transformer.resblocks.N``, ``ln_final``,
  ``text_projection``), ``logit_scale``. A plain state dict, an OpenCLIP training checkpoint
  (``state_dict`` + ``module.``), or OpenAI's TorchScript archive (``clip-torchscript``: its
  tensors are read without running it, see ``torchscript``);
* ``avion``     AVION / LaViLa: ``module.visual.*`` as above plus ``temporal_embedding`` and
  ``image_projection`` (flash-attn runs: ``attn.Wqkv``, ``mlp.fc1/fc2``; "fast conv1": a 2-D patch
  weight), ``module.textual.*`` (``text_projection`` inside), the run's ``args`` beside them;
* ``avion_ds``  our own names.

An ``avion-ds export --format open_clip`` directory (``open_clip_model.safetensors``) reads as ``clip``,
with the video tower's temporal embedding from ``temporal_embedding.safetensors`` beside it (OpenCLIP's
image tower has none; :mod:`avion_ds.models.clip.export` writes both).

Projections: ``projection="auto"`` loads the file's when their sizes equal the model's, else the
model keeps fresh ones; ``"fresh"`` always does (AVION's start from CLIP). Fresh means
``visual.proj``, ``textual.proj`` and ``logit_scale`` all start anew (one embedding space); the
report names the checkpoint keys skipped and the reason. The temporal embedding is resized as
AVION's ``inflate_positional_embeds``: more frames -> linear interpolation along time
(``F.interpolate(mode="linear")``), fewer -> the first frames; a file without one (CLIP) leaves
the model's zeros.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import nn

from avion_ds.models.partition import state_shapes
from avion_ds.models.weights.checkpoint import checkpoint_state_dict, read_checkpoint
from avion_ds.models.weights.report import LoadReport
from avion_ds.storage.torchscript import read_torchscript_state_dict, torchscript_root

logger = logging.getLogger(__name__)

StateDict = dict[str, torch.Tensor]
PROJECTIONS = ("visual.proj", "textual.proj", "logit_scale")
# the normalisation each layout's weights were trained with (a data.mean_std value; None: the file does not
# say): OpenAI CLIP's statistics for CLIP and OpenCLIP (its default), AVION's ``--norm-style openai``
FORMAT_MEAN_STD: dict[str, str | None] = {
    "clip": "clip",
    "clip-torchscript": "clip",
    "avion": "openai",
    "avion_ds": None,
}
OPEN_CLIP_WEIGHTS = "open_clip_model.safetensors"  # the weights of an open_clip export directory
TEMPORAL_SIDE_FILE = "temporal_embedding.safetensors"  # beside them: the video tower's temporal embedding
AVION_MODELS = {  # AVION's --model -> our registered name
    "CLIP_VITB16": "clip_vit_base_patch16_224",
    "CLIP_VITL14": "clip_vit_large_patch14_224",
    "CLIP_VITL14_336PX": "clip_vit_large_patch14_336",
}
_BLOCK = {
    "ln_1": "norm1",
    "ln_2": "norm2",
    "attn.in_proj_weight": "attn.qkv.weight",
    "attn.in_proj_bias": "attn.qkv.bias",
    "attn.Wqkv": "attn.qkv",
    "attn.out_proj": "attn.proj",
    "mlp.c_fc": "mlp.fc1",
    "mlp.c_proj": "mlp.fc2",
    "mlp.fc1": "mlp.fc1",
    "mlp.fc2": "mlp.fc2",
}
_VISUAL = {
    "class_embedding": "cls_token",
    "positional_embedding": "pos_embed",
    "temporal_embedding": "temporal_embed",
    "conv1.weight": "patch_embed.proj.weight",
    "conv1.bias": "patch_embed.proj.bias",
    "ln_pre.weight": "ln_pre.weight",
    "ln_pre.bias": "ln_pre.bias",
    "ln_post.weight": "norm.weight",
    "ln_post.bias": "norm.bias",
    "proj": "proj",
    "image_projection": "proj",
}
_TEXT = {
    "token_embedding.weight": "token_embedding.weight",
    "positional_embedding": "pos_embed",
    "ln_final.weight": "norm.weight",
    "ln_final.bias": "norm.bias",
    "text_projection": "proj",
}
_IGNORED = {"attn_mask", "input_resolution", "context_length", "vocab_size", "textual.attn_mask"}


def detect_clip_format(sd: StateDict) -> str:
    """``avion_ds`` | ``avion`` | ``clip`` for a dual-encoder state dict; ValueError naming its keys."""
    if any(k.startswith(("visual.blocks.", "textual.blocks.")) for k in sd):
        return "avion_ds"
    if any(k.startswith("visual.transformer.resblocks.") for k in sd):
        return "avion" if any(k.startswith("textual.") for k in sd) else "clip"
    raise ValueError(
        "not a CLIP / OpenCLIP / AVION dual-encoder checkpoint (expected visual.transformer.resblocks.* or "
        f"visual.blocks.*); first keys: {list(sd)[:8]}"
    )


def _block_key(rest: str) -> str | None:
    """``ln_1.weight`` / ``attn.in_proj_weight`` / ... of one residual block -> our block suffix."""
    for src, dst in _BLOCK.items():
        if rest == src:
            return dst
        if rest.startswith(src + "."):
            return dst + rest[len(src) :]
    return None


def map_clip_key(key: str, fmt: str) -> str | None:
    """Our name for a ``clip`` / ``avion`` checkpoint key (None: not a weight, e.g. ``attn_mask``);
    unknown keys come back unchanged (reported as unexpected)."""
    if key in _IGNORED:
        return None
    if key == "logit_scale":
        return key
    if key.startswith("visual."):
        tower, rest = "visual", key.removeprefix("visual.")
        table = _VISUAL
    elif fmt == "avion" and key.startswith("textual."):
        tower, rest = "textual", key.removeprefix("textual.")
        table = _TEXT
    elif fmt == "clip":
        tower, rest = "textual", key.removeprefix("text.")  # OpenCLIP CustomTextCLIP: text.*
        table = _TEXT
    else:
        return key
    m = re.match(r"^transformer\.resblocks\.(\d+)\.(.+)$", rest)
    if m:
        suffix = _block_key(m.group(2))
        return f"{tower}.blocks.{m.group(1)}.{suffix}" if suffix else key
    return f"{tower}.{table[rest]}" if rest in table else key


def resize_temporal(embed: torch.Tensor, frames: int) -> torch.Tensor:
    """(T0, D) temporal embedding -> (frames, D): linear interpolation when more frames, the first
    ``frames`` rows when fewer (AVION's ``inflate_positional_embeds``)."""
    t0 = embed.shape[0]
    if frames <= t0:
        return embed[:frames]
    x = embed.float().t().unsqueeze(0)  # (1, D, T0)
    return F.interpolate(x, size=frames, mode="linear").squeeze(0).t().to(embed.dtype)


def resize_spatial(pos: torch.Tensor, side: int) -> torch.Tensor:
    """(1 + s0^2, D) CLIP position table -> (1 + side^2, D): class entry kept, grid bicubic."""
    s0 = int(round((pos.shape[0] - 1) ** 0.5))
    grid = pos[1:].reshape(1, s0, s0, -1).permute(0, 3, 1, 2).float()
    grid = F.interpolate(grid, size=(side, side), mode="bicubic", align_corners=False)
    return torch.cat([pos[:1], grid.permute(0, 2, 3, 1).reshape(side * side, -1).to(pos.dtype)])


def _fit(key: str, v: torch.Tensor, want: torch.Size, model: nn.Module, report: LoadReport) -> torch.Tensor:
    """``v`` in the model's shape ``want``: reshaped, or resized (reported), or ValueError naming the key."""
    if v.numel() == want.numel():
        return v.reshape(want)
    if key == "visual.temporal_embed" and v.shape[-1] == want[-1]:
        report.resized.append(key)
        report.notes.append(f"temporal embedding {v.reshape(-1, want[-1]).shape[0]} -> {want[1]} frames")
        return resize_temporal(v.reshape(-1, want[-1]), want[1]).reshape(want)
    if key == "visual.pos_embed":
        report.resized.append(key)
        return resize_spatial(v.reshape(-1, want[-1]), model.visual.patch_embed.grid[1]).reshape(want)
    if key == "textual.pos_embed" and v.shape[-1] == want[-1]:  # context length: cut or zero-pad (AVION)
        report.resized.append(key)
        out = v.new_zeros(want)
        n = min(v.shape[0], want[0])
        out[:n] = v[:n]
        return out
    raise ValueError(f"checkpoint key {key}: shape {tuple(v.shape)} does not fit the model's {tuple(want)}")


def _projection_mode(mapped: StateDict, target: dict[str, torch.Size], mode: str) -> tuple[bool, str]:
    """(fresh?, why) for the projections and temperature."""
    if mode == "fresh":
        return True, "projection fresh (requested)"
    sizes = {k: tuple(mapped[k].shape) for k in ("visual.proj", "textual.proj") if k in mapped}
    if not sizes:
        return True, "projection fresh (the checkpoint has none)"
    bad = [f"{k} {s} vs model {tuple(target[k])}" for k, s in sizes.items() if k in target and s != tuple(target[k])]
    if bad:
        return True, f"projection fresh (sizes differ: {'; '.join(bad)})"
    return False, "projection loaded (sizes match)"


def open_clip_export(source: str | Path | dict) -> tuple[Path, Path | None] | None:
    """(weights, temporal side file or None) when ``source`` is an open_clip export directory or its
    ``open_clip_model.safetensors``; None otherwise."""
    if isinstance(source, dict):
        return None
    path = Path(source)
    weights = path / OPEN_CLIP_WEIGHTS if path.is_dir() else path
    if weights.name != OPEN_CLIP_WEIGHTS or not weights.is_file():
        return None
    side = weights.with_name(TEMPORAL_SIDE_FILE)
    return weights, side if side.is_file() else None


def read_clip_source(source: str | Path | dict, trust: bool = False) -> tuple[StateDict, Any, bool]:
    """(flat state dict, AVION ``args`` or None, read from a TorchScript archive?); an open_clip export
    directory gives its weights plus the temporal embedding of its side file."""
    if not isinstance(source, dict) and Path(source).is_file() and torchscript_root(source) is not None:
        return read_torchscript_state_dict(source), None, True
    export = open_clip_export(source)
    if export is not None:
        sd = checkpoint_state_dict(read_checkpoint(export[0], trust))
        if export[1] is not None:
            try:
                sd.update(load_file(str(export[1]), device="cpu"))
            except Exception as e:  # corrupt / truncated side file
                msg = (str(e).strip().splitlines() or [type(e).__name__])[0]
                raise ValueError(f"cannot read {export[1]}: {msg}") from e
        return sd, None, False
    ckpt = read_checkpoint(source, trust)
    args = ckpt.get("args") if isinstance(ckpt, dict) else None
    return checkpoint_state_dict(ckpt), args, False


def _check_args(args: Any, model: nn.Module, report: LoadReport) -> None:
    """AVION's run ``args``: the model it trained and its projection size, checked and noted."""
    name = getattr(args, "model", None)
    ours = AVION_MODELS.get(str(name))
    if ours and model.arch.name in AVION_MODELS.values() and ours != model.arch.name:
        raise ValueError(f"checkpoint was trained as AVION {name} (= {ours}); the model is {model.arch.name}")
    fields = ("model", "project_embed_dim", "clip_length")
    report.notes.append("AVION args: " + ", ".join(f"{f}={getattr(args, f, None)}" for f in fields))


def prepare_clip_state_dict(
    model: nn.Module, source: str | Path | dict, trust: bool = False
) -> tuple[StateDict, LoadReport]:
    """Read ``source`` and map / resize it to ``model``'s names and shapes; nothing is loaded yet."""
    sd, args, scripted = read_clip_source(source, trust)
    fmt = detect_clip_format(sd)
    report = LoadReport(format="clip-torchscript" if scripted else fmt)
    report.mean_std = FORMAT_MEAN_STD[report.format]
    if args is not None:
        _check_args(args, model, report)
    export = open_clip_export(source)
    if export is not None and export[1] is not None:
        report.notes.append(f"temporal embedding from {export[1].name} (open_clip export)")
    mapped: StateDict = {}
    for k, v in sd.items():
        name = k if fmt == "avion_ds" else map_clip_key(k, fmt)
        if name is not None:
            mapped[name] = v
    target = state_shapes(model)
    fresh, why = _projection_mode(mapped, target, model.projection)
    report.notes.append(why)
    if fresh:
        report.skipped = sorted(k for k in sd if (k if fmt == "avion_ds" else map_clip_key(k, fmt)) in PROJECTIONS)
        report.fresh = [k for k in PROJECTIONS if k in target]
        mapped = {k: v for k, v in mapped.items() if k not in PROJECTIONS}
    if "visual.temporal_embed" in target and "visual.temporal_embed" not in mapped:
        report.fresh.append("visual.temporal_embed")
        report.notes.append("temporal embedding starts at zeros (none in the checkpoint)")
    out: StateDict = {}
    for k, v in mapped.items():
        out[k] = _fit(k, v, target[k], model, report) if k in target and v.shape != target[k] else v
    return out, report
