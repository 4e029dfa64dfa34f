"""Pretraining checkpoints both ways: official VideoMAE / V2, Hugging Face ``VideoMAEForPreTraining``
and our own layout, into (and out of) a :class:`~avion_ds.models.mae.model.VideoMAEPretrain`.

Layouts (detected from the keys):

* ``avion_ds``  ``encoder.*`` (a ``VideoViT``; ``encoder.fc_norm`` is the final token norm),
  ``decoder.{blocks,norm,head}.*``, ``encoder_to_decoder.weight``, ``mask_token``;
* ``videomae``  official (``model`` key): the same, with ``encoder.norm`` for the token norm, a
  Conv3d ``encoder.patch_embed.proj.weight`` and ``gamma_1`` / ``gamma_2`` LayerScale;
* ``hf``        ``videomae.*`` encoder (``layernorm`` = token norm), ``decoder.decoder_layers.N.*``,
  ``decoder.{norm,head}``, ``encoder_to_decoder.weight``, ``mask_token``.

The encoder half reuses the fine-tuning filters of :mod:`avion_ds.models.vit.weights` (one place per
key map); the decoder blocks go through the same maps. ``load_weights`` sends a pretraining model
here; fine-tuning models take the encoder of any of these through ``load_weights`` /
``create_model(..., pretrained=...)``. Every layout's weights were trained on ImageNet-normalised frames
(``FORMAT_MEAN_STD``). The decoder's width and depth differ
between releases (VideoMAE V1 ViT-H: 640 wide; V2: 512): :func:`decoder_dims` reads them from a file.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch
from torch import nn

from avion_ds.models.partition import state_shapes
from avion_ds.models.vit.weights import FILTERS
from avion_ds.models.weights.checkpoint import checkpoint_state_dict, read_checkpoint
from avion_ds.models.weights.hf_config import hf_config, layer_norm_eps_note
from avion_ds.models.weights.report import LoadReport

StateDict = dict[str, torch.Tensor]
_SHARED = ("encoder_to_decoder.weight", "mask_token")
_DECODER_BLOCK = re.compile(r"^decoder\.(?:blocks|decoder_layers)\.(\d+)\.")


def detect_mae_format(sd: StateDict) -> str:
    """``avion_ds`` | ``videomae`` | ``hf`` for a pretraining state dict; ValueError otherwise."""
    keys = list(sd)
    if any(k.startswith("decoder.decoder_layers.") for k in keys) or any(k.startswith("videomae.") for k in keys):
        return "hf"
    if "encoder.blocks.0.attn.qkv.weight" in sd and "encoder_to_decoder.weight" in sd:
        return "videomae" if "encoder.norm.weight" in sd else "avion_ds"
    raise ValueError(
        "not a VideoMAE pretraining checkpoint (expected encoder.* / decoder.* / encoder_to_decoder, "
        f"or Hugging Face videomae.* / decoder.decoder_layers.*); first keys: {keys[:8]}"
    )


def _gamma(k: str) -> str:
    return re.sub(r"\.gamma_([12])$", r".ls\1.gamma", k)


def _encoder_norm(out: StateDict) -> StateDict:
    """The pretraining encoder's last LayerNorm is ``norm`` in VideoMAE / HF layouts; ours runs it as the
    encoder ViT's ``fc_norm`` (the fine-tuning filters no longer remap it: VideoMAE's fine-tuning does not)."""
    for suffix in ("weight", "bias"):
        key = f"encoder.norm.{suffix}"
        if key in out and f"encoder.fc_norm.{suffix}" not in out:
            out[f"encoder.fc_norm.{suffix}"] = out.pop(key)
    return out


def from_official(sd: StateDict, model: nn.Module, report: LoadReport) -> StateDict:
    """Official VideoMAE / V2 pretraining keys -> ours."""
    enc = {k: v for k, v in sd.items() if k.startswith("encoder.")}
    out = {f"encoder.{k}": v for k, v in FILTERS["videomae"](enc, model.encoder, report).items()}
    out.update({_gamma(k): v for k, v in sd.items() if k.startswith("decoder.") or k in _SHARED})
    out.update({k: v for k, v in sd.items() if k not in enc and k not in out and not k.startswith("decoder.")})
    return _encoder_norm(out)


def from_hf(sd: StateDict, model: nn.Module, report: LoadReport) -> StateDict:
    """Hugging Face ``VideoMAEForPreTraining`` keys -> ours (decoder layers through the same block map)."""
    enc = {k: v for k, v in sd.items() if k.startswith("videomae.")}
    out = {f"encoder.{k}": v for k, v in FILTERS["hf"](enc, model.encoder, report).items()}
    dec = {
        re.sub(r"^decoder\.decoder_layers\.", "videomae.encoder.layer.", k): v
        for k, v in sd.items()
        if k.startswith("decoder.decoder_layers.")
    }
    out.update({f"decoder.{k}": v for k, v in FILTERS["hf"](dec, model.encoder, report).items()})
    out.update({k: v for k, v in sd.items() if not k.startswith(("videomae.", "decoder.decoder_layers."))})
    return _encoder_norm(out)


_MAE_FILTERS = {"avion_ds": lambda sd, model, report: dict(sd), "videomae": from_official, "hf": from_hf}
# the normalisation each layout's weights were trained with (a data.mean_std value; None: our own files
# follow their run's recipe)
FORMAT_MEAN_STD: dict[str, str | None] = {"avion_ds": None, "videomae": "imagenet", "hf": "imagenet"}


def decoder_dims(sd: StateDict) -> dict[str, int]:
    """``decoder_dim`` / ``decoder_depth`` a pretraining state dict (any layout, unwrapped) was
    trained with, from the ``encoder_to_decoder`` shape and the decoder block indices; what the
    keys do not show is left out (the head count never shows in the shapes)."""
    out: dict[str, int] = {}
    w = sd.get("encoder_to_decoder.weight")
    if isinstance(w, torch.Tensor) and w.dim() == 2:
        out["decoder_dim"] = int(w.shape[0])
    blocks = {int(m.group(1)) for k in sd if (m := _DECODER_BLOCK.match(k))}
    if blocks:
        out["decoder_depth"] = max(blocks) + 1
    return out


def config_eps(source: str | Path | dict) -> float | None:
    """The ``layer_norm_eps`` of the config.json beside a Hugging Face ``source`` (None without one)."""
    config = hf_config(source)
    eps = config.get("layer_norm_eps") if config else None
    return float(eps) if isinstance(eps, (int, float)) and not isinstance(eps, bool) else None


def prepare_mae_state_dict(
    model: nn.Module, source: str | Path | dict, trust: bool = False
) -> tuple[StateDict, LoadReport]:
    """Read ``source`` and map it to ``model``'s names; shapes are checked against the model's
    logical shapes (also under ZeRO-3), one-line ValueError naming the key. Nothing is loaded."""
    sd = checkpoint_state_dict(read_checkpoint(source, trust))
    fmt = detect_mae_format(sd)
    report = LoadReport(format=f"{fmt} (pretraining)", mean_std=FORMAT_MEAN_STD[fmt])
    note = layer_norm_eps_note(source, model.arch.encoder.norm_eps)
    if note:
        report.notes.append(note)
    sd = _MAE_FILTERS[fmt](sd, model, report)
    target = state_shapes(model)
    for k, v in sd.items():
        if k in target and v.shape != target[k] and v.numel() != target[k].numel():
            raise ValueError(
                f"checkpoint key {k}: shape {tuple(v.shape)} does not fit the model's {tuple(target[k])}"
                f"{_decoder_hint(sd, model)}"
            )
    return sd, report


def _decoder_hint(sd: StateDict, model: nn.Module) -> str:
    dims = decoder_dims(sd)
    want = {"decoder_dim": model.arch.decoder_dim, "decoder_depth": model.arch.decoder_depth}
    diff = {k: v for k, v in dims.items() if v != want[k]}
    if not diff:
        return ""
    return (
        f" (the checkpoint's decoder has {', '.join(f'{k}={v}' for k, v in diff.items())}; build the model "
        "with create_model(name, pretrained=FILE), which takes them from the file, or pass them)"
    )
