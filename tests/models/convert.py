"""Test helpers: write our model's weights in other projects' checkpoint layouts."""

from __future__ import annotations

import re

import torch

from avion_ds.models import VideoViT


def _ours(model: VideoViT) -> dict[str, torch.Tensor]:
    sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
    sd["patch_embed.proj.weight"] = sd["patch_embed.proj.weight"].reshape(model.patch_embed.conv_weight_shape)
    return sd


def to_videomae(model: VideoViT) -> dict:
    """Official VideoMAE fine-tuning checkpoint: {"model": ..., "args": ...}, Conv3d patch weight,
    LayerScale as gamma_1 / gamma_2."""
    sd = {}
    for k, v in _ours(model).items():
        k = re.sub(r"\.ls1\.gamma$", ".gamma_1", k)
        k = re.sub(r"\.ls2\.gamma$", ".gamma_2", k)
        sd[k] = v
    return {"model": sd, "epoch": 3}


def to_videomae_pretrain(model: VideoViT) -> dict:
    """Official VideoMAE pre-training checkpoint: encoder.* (norm instead of fc_norm), decoder.*."""
    sd = {}
    for k, v in to_videomae(model)["model"].items():
        if k.startswith("head."):
            continue
        sd["encoder." + k.replace("fc_norm.", "norm.")] = v
    d = model.embed_dim
    sd["decoder.blocks.0.norm1.weight"] = torch.ones(d)
    sd["encoder_to_decoder.weight"] = torch.zeros(d, d)
    sd["mask_token"] = torch.zeros(1, 1, d)
    return {"module": sd}


def to_hf(model: VideoViT) -> dict[str, torch.Tensor]:
    """transformers VideoMAEForVideoClassification state dict (the package's export conversion)."""
    from avion_ds.models.vit.hf import to_hf_state_dict

    return to_hf_state_dict(model)
