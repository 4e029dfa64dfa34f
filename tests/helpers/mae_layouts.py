"""Our masked-autoencoder weights written in the reference layouts (official VideoMAE / V2, Hugging Face
``VideoMAEForPreTraining``): the inverse of ``avion_ds.models.mae.weights``, for round-trip tests."""

from __future__ import annotations

import re
from typing import Any

import torch

from avion_ds.models.mae.model import VideoMAEPretrain
from avion_ds.models.mae.weights import _SHARED
from avion_ds.models.vit.weights import HF_BLOCK_KEYS

StateDict = dict[str, torch.Tensor]


def _conv_patch(model: VideoMAEPretrain, sd: StateDict) -> StateDict:
    key = "encoder.patch_embed.proj.weight"
    sd[key] = sd[key].reshape(model.encoder.patch_embed.conv_weight_shape)
    return sd


def to_official(model: VideoMAEPretrain) -> dict[str, Any]:
    """Our weights as an official VideoMAE / V2 pretraining checkpoint ``{"model": ...}``."""
    sd = _conv_patch(model, {k: v.detach().clone() for k, v in model.state_dict().items()})
    out = {}
    for k, v in sd.items():
        k = re.sub(r"\.ls([12])\.gamma$", r".gamma_\1", k)
        out["encoder.norm." + k.removeprefix("encoder.fc_norm.") if k.startswith("encoder.fc_norm.") else k] = v
    return {"model": out}


def _hf_block(prefix: str, rest: str, v: torch.Tensor, d: int, out: StateDict) -> None:
    if rest == "attn.qkv.weight":
        for j, name in enumerate(("query", "key", "value")):
            out[f"{prefix}attention.attention.{name}.weight"] = v[j * d : (j + 1) * d]
        return
    inverse = {ours: hf for hf, ours in HF_BLOCK_KEYS.items() if not hf.endswith(("q_bias", "v_bias"))}
    if rest not in inverse:
        raise KeyError(f"no Hugging Face name for block key {rest!r}")
    out[prefix + inverse[rest]] = v


def to_hf(model: VideoMAEPretrain) -> StateDict:
    """Our weights as a Hugging Face ``VideoMAEForPreTraining`` state dict."""
    sd = _conv_patch(model, {k: v.detach().clone() for k, v in model.state_dict().items()})
    de, dd = model.arch.encoder.embed_dim, model.arch.decoder_dim
    out: StateDict = {}
    for k, v in sd.items():
        m = re.match(r"^(encoder|decoder)\.blocks\.(\d+)\.(.+)$", k)
        if m:
            enc = m.group(1) == "encoder"
            prefix = f"videomae.encoder.layer.{m.group(2)}." if enc else f"decoder.decoder_layers.{m.group(2)}."
            _hf_block(prefix, m.group(3), v, de if enc else dd, out)
        elif k.startswith("encoder.patch_embed.proj."):
            out["videomae.embeddings.patch_embeddings.projection." + k.rsplit(".", 1)[1]] = v
        elif k.startswith("encoder.fc_norm."):
            out["videomae.layernorm." + k.rsplit(".", 1)[1]] = v
        elif k.startswith(("decoder.norm.", "decoder.head.")) or k in _SHARED:
            out[k] = v
        else:
            raise KeyError(f"no Hugging Face name for {k!r}")
    return out
