"""A dual encoder back out, in the layouts :mod:`avion_ds.models.clip.weights` reads: OpenCLIP and AVION.

* ``open_clip``  a directory ``open_clip.create_model("local-dir:DIR")`` loads (weights included):
  ``open_clip_config.json`` (``model_cfg`` with our sizes, activation and LayerNorm eps; ``preprocess_cfg``
  with the run's image size and mean / std), ``open_clip_model.safetensors`` (the state dict OpenCLIP's
  ``CLIP`` takes with ``load_state_dict(strict=True)``: ``visual.conv1`` / ``class_embedding`` /
  ``positional_embedding`` / ``transformer.resblocks.N`` / ``ln_post`` / ``proj``, the text tower at the
  top level, a 0-d ``logit_scale``). OpenCLIP's image tower has no time: a video tower's temporal
  embedding (models of 2+ frames) goes to ``temporal_embedding.safetensors`` beside it
  (``visual.temporal_embedding``, (frames, width)), which our loader reads back with the state dict.
* ``avion``  AVION's ``checkpoint_best.pt``: ``{"epoch", "state_dict": {"module.visual.*",
  "module.textual.*", "module.logit_scale"}, "args": Namespace(model, clip_length, project_embed_dim,
  context_length, vocab_size, ...)}`` as its ``main_lavila_*`` scripts read it (``visual.image_projection``,
  ``visual.temporal_embedding``, ``textual.text_projection``; standard, not flash-attn, block names).

What the target cannot express (another block layout, quick GELU in one tower only, ...) is refused with
one ValueError line naming the field.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from avion_ds.models.arch import ViTArch
from avion_ds.models.clip.model import VideoTextDualEncoder
from avion_ds.models.clip.weights import AVION_MODELS, OPEN_CLIP_WEIGHTS, TEMPORAL_SIDE_FILE

StateDict = dict[str, torch.Tensor]
OPEN_CLIP_CONFIG = "open_clip_config.json"
_BLOCK = {
    "norm1.": "ln_1.",
    "norm2.": "ln_2.",
    "attn.qkv.weight": "attn.in_proj_weight",
    "attn.qkv.bias": "attn.in_proj_bias",
    "attn.proj.": "attn.out_proj.",
    "mlp.fc1.": "mlp.c_fc.",
    "mlp.fc2.": "mlp.c_proj.",
}
_VISUAL = {
    "cls_token": "class_embedding",
    "pos_embed": "positional_embedding",
    "patch_embed.proj.weight": "conv1.weight",
    "ln_pre.weight": "ln_pre.weight",
    "ln_pre.bias": "ln_pre.bias",
    "norm.weight": "ln_post.weight",
    "norm.bias": "ln_post.bias",
    "proj": "proj",
}
_TEXT = {
    "token_embedding.weight": "token_embedding.weight",
    "pos_embed": "positional_embedding",
    "norm.weight": "ln_final.weight",
    "norm.bias": "ln_final.bias",
    "proj": "text_projection",
}
_ROW = re.compile(r"^blocks\.(\d+)\.(.+)$")


def _check_tower(a: Any, tower: str) -> None:
    """One-line ValueError when a tower is not in CLIP's block layout (fused q/k/v bias, no LayerScale)."""
    if not (a.qkv_bias and a.k_bias):
        raise ValueError(
            f"{tower} tower qkv_bias={a.qkv_bias}, k_bias={a.k_bias}: CLIP's blocks have a fused q/k/v bias"
        )
    if a.layer_scale is not None:
        raise ValueError(f"{tower} tower layer_scale={a.layer_scale}: CLIP's blocks have no LayerScale")


def check_clip_exportable(model: VideoTextDualEncoder) -> None:
    """Raise ValueError (one line naming the field) when OpenCLIP's / AVION's CLIP cannot hold ``model``."""
    v, t = model.arch.vision, model.arch.text
    if v.pos_embed != "clip" or v.pool != "cls" or not v.ln_pre or v.patch_embed_bias or v.tubelet_size != 1:
        raise ValueError(
            f"video tower pos_embed={v.pos_embed!r}, pool={v.pool!r}, ln_pre={v.ln_pre}, "
            f"patch_embed_bias={v.patch_embed_bias}, tubelet_size={v.tubelet_size}: not CLIP's image tower layout"
        )
    _check_tower(v, "video")
    _check_tower(t, "text")
    if not t.causal:
        raise ValueError("text tower causal=False: CLIP's text tower is causal")
    if v.act != t.act or v.act not in ("gelu", "quick_gelu"):
        raise ValueError(f"act video {v.act!r} / text {t.act!r}: CLIP runs one of gelu / quick_gelu in both towers")
    if not v.proj_dim or v.proj_dim != t.proj_dim:
        raise ValueError(f"proj_dim video {v.proj_dim} / text {t.proj_dim}: CLIP projects both towers to one width")
    if v.rlt:
        raise ValueError(
            f"video tower rlt_threshold={v.rlt_threshold!r}: CLIP has no run-length tokenization (its run-length "
            "embedding would be lost); export --format safetensors"
        )


def _block_name(rest: str) -> str:
    for ours, theirs in _BLOCK.items():
        if rest == ours or (ours.endswith(".") and rest.startswith(ours)):
            return theirs + rest[len(ours) :] if ours.endswith(".") else theirs
    raise KeyError(f"no CLIP name for block key {rest!r}")


def to_open_clip_state_dict(model: VideoTextDualEncoder) -> tuple[StateDict, torch.Tensor | None]:
    """(OpenCLIP ``CLIP`` state dict of ``model``, its temporal embedding (frames, width) or None)."""
    check_clip_exportable(model)
    out: StateDict = {}
    temporal = None
    conv = model.visual.patch_embed.conv_weight_shape  # (D, C, 1, p, p)
    for k, v in model.state_dict().items():
        v = v.detach().clone()
        tower, _, rest = k.partition(".")
        if k == "logit_scale":
            out[k] = v.reshape(())
        elif k == "visual.temporal_embed":
            temporal = v.reshape(v.shape[-2], v.shape[-1])
        elif tower in ("visual", "textual") and (m := _ROW.match(rest)):
            prefix = "visual.transformer" if tower == "visual" else "transformer"
            out[f"{prefix}.resblocks.{m.group(1)}.{_block_name(m.group(2))}"] = v
        elif tower == "visual" and rest in _VISUAL:
            if rest == "patch_embed.proj.weight":
                v = v.reshape(conv).squeeze(2)
            elif rest in ("cls_token", "pos_embed"):
                v = v.reshape(-1, v.shape[-1]).squeeze(0)
            out[f"visual.{_VISUAL[rest]}"] = v
        elif tower == "textual" and rest in _TEXT:
            out[_TEXT[rest]] = v
        else:
            raise KeyError(f"no OpenCLIP name for {k!r}")
    return out, temporal


def open_clip_model_cfg(model: VideoTextDualEncoder) -> dict[str, Any]:
    """OpenCLIP's ``model_cfg`` describing ``model`` (``open_clip.create_model`` builds it)."""
    check_clip_exportable(model)
    v, t = model.arch.vision, model.arch.text
    return {
        "embed_dim": v.proj_dim,
        "quick_gelu": v.act == "quick_gelu",
        "vision_cfg": {
            "image_size": v.img_size,
            "layers": v.depth,
            "width": v.embed_dim,
            "head_width": v.head_dim,
            "mlp_ratio": v.mlp_ratio,
            "patch_size": v.patch_size,
            "norm_kwargs": {"eps": v.norm_eps},
        },
        "text_cfg": {
            "context_length": t.context_length,
            "vocab_size": t.vocab_size,
            "width": t.embed_dim,
            "heads": t.num_heads,
            "layers": t.depth,
            "mlp_ratio": t.mlp_ratio,
            "norm_kwargs": {"eps": t.norm_eps},
        },
    }


def save_open_clip(
    model: VideoTextDualEncoder, out_dir: str | Path, preprocess: dict[str, Any] | None = None
) -> dict[str, Path]:
    """Write the ``open_clip`` directory (module doc); returns the files written by role
    (``config``, ``weights``, and ``temporal`` for a model of 2+ frames)."""
    sd, temporal = to_open_clip_state_dict(model)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = {"config": out_dir / OPEN_CLIP_CONFIG, "weights": out_dir / OPEN_CLIP_WEIGHTS}
    config = {"model_cfg": open_clip_model_cfg(model), "preprocess_cfg": preprocess or {}}
    written["config"].write_text(json.dumps(config, indent=2) + "\n")
    save_file({k: v.contiguous() for k, v in sd.items()}, str(written["weights"]), metadata={"format": "pt"})
    side = out_dir / TEMPORAL_SIDE_FILE
    if temporal is not None:
        save_file({"visual.temporal_embedding": temporal.contiguous()}, str(side), metadata={"format": "pt"})
        written["temporal"] = side
    elif side.exists():  # a previous export of more frames: not this model's
        side.unlink()
    return written


def avion_model_name(arch: ViTArch | Any) -> str | None:
    """AVION's ``--model`` of our registered dual encoder ``arch.name`` (None: AVION has no such size)."""
    return next((avion for avion, ours in AVION_MODELS.items() if ours == arch.name), None)


def to_avion_checkpoint(model: VideoTextDualEncoder, norm_style: str = "openai") -> dict[str, Any]:
    """AVION's ``checkpoint_best.pt`` contents for ``model`` (module doc); ``norm_style``: its
    ``--norm-style`` (``openai`` or ``timm``), recorded in ``args``."""
    v = model.arch.vision
    if v.act != "gelu":
        raise ValueError(f"act={v.act!r}: AVION's towers run exact GELU (nn.GELU); export with --format open_clip")
    sd, temporal = to_open_clip_state_dict(model)
    out: StateDict = {}
    for k, t in sd.items():
        if k == "visual.proj":
            k = "visual.image_projection"
        elif not k.startswith(("visual.", "logit_scale")):
            k = f"textual.{k}"
        out[f"module.{k}"] = t
    if temporal is not None:
        out["module.visual.temporal_embedding"] = temporal
    t = model.arch.text
    args = argparse.Namespace(
        model=avion_model_name(model.arch) or model.arch.name,
        clip_length=v.num_frames,
        project_embed_dim=v.proj_dim,
        context_length=t.context_length,
        vocab_size=t.vocab_size,
        norm_style=norm_style,
        pretrain_zoo="openai",
        pretrain_path=None,
        use_flash_attn=False,
        use_fast_conv1=False,
    )
    return {"epoch": 0, "state_dict": out, "args": args}  # epoch: AVION's scripts only print it


def save_avion(model: VideoTextDualEncoder, out: str | Path, norm_style: str = "openai") -> Path:
    """Write AVION's ``checkpoint_best.pt`` layout of ``model`` to ``out``."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    torch.save(to_avion_checkpoint(model, norm_style), out)
    return out
