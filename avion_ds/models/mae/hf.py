"""Our pretraining model -> a Hugging Face ``VideoMAEForPreTraining`` (state dict, config, directory).

The inverse of the ``hf`` layout that :mod:`avion_ds.models.mae.weights` reads: the encoder as
``videomae.*`` (its final token norm, our ``encoder.fc_norm``, is ``videomae.layernorm``: the config has
``use_mean_pooling: false``), the decoder blocks as ``decoder.decoder_layers.N.*`` (the block map of
:mod:`avion_ds.models.vit.hf`), ``decoder.{norm,head}``, ``encoder_to_decoder`` and ``mask_token`` as
they are. What transformers cannot express is refused in one line (learned positions, LayerScale, ...).

Two things transformers fixes that ours sets: its decoder norm uses LayerNorm eps 1e-5 (ours
``decoder_norm_eps``, 1e-6 by default) and it un-normalises the frames for the targets with ImageNet's
mean / std (ours: the recipe's ``data.mean_std``). With ``norm_pix_loss`` (the default) the per-token
normalisation removes the statistics, so only raw-pixel targets (``norm_pix_loss: false``) under other
statistics are refused. :func:`save_hf_pretraining` measures the reconstruction loss of both models on
the same clip and mask and returns the difference.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch

from avion_ds.models.mae.model import IMAGENET_MEAN, IMAGENET_STD, VideoMAEPretrain
from avion_ds.models.vit.hf import check_encoder, encoder_config_kwargs, encoder_tensors, hf_block, import_transformers

StateDict = dict[str, torch.Tensor]
_BLOCK = re.compile(r"^(encoder|decoder)\.blocks\.(\d+)\.(.+)$")


def check_pretraining_exportable(model: VideoMAEPretrain) -> None:
    """Raise ValueError (one line naming the field) when ``VideoMAEForPreTraining`` cannot express ``model``."""
    a = model.arch
    check_encoder(a.encoder)
    if not a.norm_pix_loss and (tuple(a.mean) != tuple(IMAGENET_MEAN) or tuple(a.std) != tuple(IMAGENET_STD)):
        raise ValueError(
            f"norm_pix_loss=false with mean/std {tuple(a.mean)}/{tuple(a.std)}: Hugging Face VideoMAEForPreTraining "
            "un-normalises its raw-pixel targets with ImageNet's statistics only"
        )


def to_hf_pretraining_state_dict(model: VideoMAEPretrain) -> StateDict:
    """transformers ``VideoMAEForPreTraining`` state dict of ``model``."""
    check_pretraining_exportable(model)
    enc = {f"encoder.{k}": v for k, v in encoder_tensors(model.encoder).items()}
    rest = {k: v.detach().clone() for k, v in model.state_dict().items() if not k.startswith("encoder.")}
    widths = {"encoder": model.arch.encoder.embed_dim, "decoder": model.arch.decoder_dim}
    out: StateDict = {}
    for k, v in {**enc, **rest}.items():
        m = _BLOCK.match(k)
        if m:
            prefix = "videomae.encoder.layer." if m.group(1) == "encoder" else "decoder.decoder_layers."
            hf_block(f"{prefix}{m.group(2)}.", m.group(3), v, widths[m.group(1)], out)
        elif k.startswith("encoder.patch_embed.proj."):
            out["videomae.embeddings.patch_embeddings.projection." + k.rsplit(".", 1)[1]] = v
        elif k.startswith("encoder.fc_norm."):
            out["videomae.layernorm." + k.rsplit(".", 1)[1]] = v
        elif k.startswith(("decoder.norm.", "decoder.head.")) or k in ("encoder_to_decoder.weight", "mask_token"):
            out[k] = v
        else:
            raise KeyError(f"no Hugging Face VideoMAEForPreTraining name for {k!r}")
    return out


def hf_pretraining_config_kwargs(model: VideoMAEPretrain) -> dict[str, Any]:
    """``transformers.VideoMAEConfig`` arguments describing the pretraining ``model``."""
    a = model.arch
    return {
        **encoder_config_kwargs(a.encoder),
        "use_mean_pooling": False,  # the encoder's final token norm is videomae.layernorm
        "decoder_hidden_size": a.decoder_dim,
        "decoder_num_hidden_layers": a.decoder_depth,
        "decoder_num_attention_heads": a.decoder_heads,
        "decoder_intermediate_size": a.decoder_arch.mlp_hidden,
        "norm_pix_loss": a.norm_pix_loss,
    }


def probe_mask(batch: int, tokens: int, seed: int = 0) -> torch.Tensor:
    """A bool (batch, tokens) mask hiding half the tokens of each clip (a different half per clip)."""
    g = torch.Generator().manual_seed(seed)
    hide = max(1, tokens // 2)
    mask = torch.zeros(batch, tokens, dtype=torch.bool)
    for i in range(batch):
        mask[i, torch.randperm(tokens, generator=g)[:hide]] = True
    return mask


@torch.no_grad()
def save_hf_pretraining(model: VideoMAEPretrain, out_dir: str | Path) -> float:
    """Write a ``VideoMAEForPreTraining`` directory (config.json + model.safetensors), load it back with
    transformers and return |reconstruction loss difference| to ``model`` on a random clip and mask."""
    transformers = import_transformers()
    sd = to_hf_pretraining_state_dict(model)
    hf = transformers.VideoMAEForPreTraining(transformers.VideoMAEConfig(**hf_pretraining_config_kwargs(model)))
    hf.load_state_dict(sd, strict=True)
    out_dir = Path(out_dir)
    hf.save_pretrained(str(out_dir))
    loaded = transformers.VideoMAEForPreTraining.from_pretrained(str(out_dir)).eval()
    e = model.arch.encoder
    x = torch.randn(2, e.in_chans, e.num_frames, e.img_size, e.img_size, generator=torch.Generator().manual_seed(0))
    mask = probe_mask(2, model.num_tokens)
    was_training = model.training
    model.eval()
    ours = model(x, mask).loss
    model.train(was_training)
    theirs = loaded(pixel_values=x.permute(0, 2, 1, 3, 4), bool_masked_pos=mask).loss
    return float((ours.float() - theirs.float()).abs())
