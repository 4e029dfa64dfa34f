"""Our VideoViT -> a Hugging Face ``VideoMAEForVideoClassification`` (state dict, config, directory).

What transformers' VideoMAE can express: fixed sin-cos positions, mean pooling + ``fc_norm``, no
LayerScale, separate q / v biases (no k bias, no ``ln_pre``), ONE classifier. A multi-head model (EPIC
verb + noun) is exported one head at a time (``head=``); anything else is refused with one line naming
the field. transformers' ``fc_norm`` always uses LayerNorm eps 1e-5 (not configurable) where ours uses
``arch.norm_eps`` (1e-6), so the logits agree to ~1e-5, not bit for bit; :func:`save_hf` measures and
returns the difference. ``labels`` names the classes (``id2label`` / ``label2id`` of config.json);
without them they are ``<head>_<i>``. The block map (:func:`hf_block`) is shared with the pretraining
export (:mod:`avion_ds.models.mae.hf`).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch

from avion_ds.models.arch import ViTArch
from avion_ds.models.vit.model import VideoViT

_BLOCK = {
    "attn.q_bias": "attention.attention.query.bias",  # transformers 5 names (4.x: q_bias / v_bias)
    "attn.v_bias": "attention.attention.value.bias",
    "attn.proj.weight": "attention.output.dense.weight",
    "attn.proj.bias": "attention.output.dense.bias",
    "mlp.fc1.weight": "intermediate.dense.weight",
    "mlp.fc1.bias": "intermediate.dense.bias",
    "mlp.fc2.weight": "output.dense.weight",
    "mlp.fc2.bias": "output.dense.bias",
    "norm1.weight": "layernorm_before.weight",
    "norm1.bias": "layernorm_before.bias",
    "norm2.weight": "layernorm_after.weight",
    "norm2.bias": "layernorm_after.bias",
}
HF_ACTS = ("gelu", "quick_gelu")  # our activations transformers' ACT2FN runs under the same name


def check_encoder(a: ViTArch) -> None:
    """Raise ValueError (one line naming the field) when transformers' VideoMAE cannot express the
    video transformer ``a`` (the classifier's, or a pretraining model's encoder)."""
    if a.pos_embed != "sincos":
        raise ValueError(f"pos_embed={a.pos_embed!r}: Hugging Face VideoMAE has fixed sin-cos positions only")
    if a.pool != "mean":
        raise ValueError(f"pool={a.pool!r}: Hugging Face VideoMAE has no class token (mean pooling only)")
    if a.layer_scale is not None:
        raise ValueError("layer_scale: Hugging Face VideoMAE has no LayerScale")
    if a.k_bias or a.ln_pre or a.proj_dim:
        field = "k_bias" if a.k_bias else "ln_pre" if a.ln_pre else "proj_dim"
        raise ValueError(f"{field}={getattr(a, field)!r}: Hugging Face VideoMAE has no such part (CLIP layout)")
    if a.act not in HF_ACTS:
        raise ValueError(f"act={a.act!r}: Hugging Face VideoMAE runs {' or '.join(HF_ACTS)} here")
    if getattr(a, "rlt", False):
        raise ValueError(
            f"rlt_threshold={a.rlt_threshold!r}: Hugging Face VideoMAE has no run-length tokenization (its "
            "run-length embedding would be lost); export --format safetensors"
        )


def check_exportable(model: VideoViT, head: str | None = None) -> str | None:
    """Raise ValueError (one line) when transformers' VideoMAE cannot express ``model``; the head to export."""
    a = model.arch
    check_encoder(a)
    if a.heads is None:
        if head is not None:
            raise ValueError(f"--head {head}: the model has a single classifier, drop --head")
        return None
    if head is None:
        raise ValueError(
            f"the model has {len(a.heads)} heads ({', '.join(a.heads)}) and Hugging Face "
            "VideoMAEForVideoClassification has one classifier: export one head per directory "
            f"with --head {next(iter(a.heads))}"
        )
    if head not in a.heads:
        raise ValueError(f"--head {head}: not a head of the model (heads: {', '.join(a.heads)})")
    return head


def hf_block(prefix: str, rest: str, v: torch.Tensor, dim: int, out: dict[str, torch.Tensor]) -> None:
    """Our block tensor ``rest`` (``attn.qkv.weight``, ``norm1.bias``, ...) of width ``dim`` into ``out``
    under transformers' names below ``prefix`` (``videomae.encoder.layer.N.``; fused q/k/v split)."""
    if rest == "attn.qkv.weight":
        for i, part in enumerate(("query", "key", "value")):
            out[f"{prefix}attention.attention.{part}.weight"] = v[i * dim : (i + 1) * dim]
    elif rest in _BLOCK:
        out[prefix + _BLOCK[rest]] = v
    else:
        raise KeyError(f"no Hugging Face VideoMAE name for block key {rest!r}")


def encoder_tensors(model: VideoViT) -> dict[str, torch.Tensor]:
    """``model``'s state dict (copies) with the patch weight in Conv3d shape and a zero patch bias where
    the model has none (transformers' patch projection always has one)."""
    sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
    sd["patch_embed.proj.weight"] = sd["patch_embed.proj.weight"].reshape(model.patch_embed.conv_weight_shape)
    sd.setdefault("patch_embed.proj.bias", torch.zeros(model.embed_dim))
    return sd


def to_hf_state_dict(model: VideoViT, head: str | None = None) -> dict[str, torch.Tensor]:
    """transformers ``VideoMAEForVideoClassification`` state dict of ``model`` (``head`` for multi-head)."""
    head = check_exportable(model, head)
    prefix = f"heads.{head}." if head is not None else "head."
    out: dict[str, torch.Tensor] = {}
    for k, v in encoder_tensors(model).items():
        m = re.match(r"^blocks\.(\d+)\.(.+)$", k)
        if m:
            hf_block(f"videomae.encoder.layer.{m.group(1)}.", m.group(2), v, model.embed_dim, out)
        elif k.startswith("patch_embed.proj."):
            out["videomae.embeddings.patch_embeddings.projection." + k.split(".")[-1]] = v
        elif k.startswith("fc_norm."):
            out[k] = v
        elif k.startswith(prefix):
            out["classifier." + k.split(".")[-1]] = v
        elif not k.startswith(("head.", "heads.")):
            raise KeyError(f"no Hugging Face VideoMAE name for {k!r}")
    return out


def encoder_config_kwargs(a: ViTArch) -> dict[str, Any]:
    """``transformers.VideoMAEConfig`` arguments describing the video transformer ``a``."""
    return {
        "image_size": a.img_size,
        "patch_size": a.patch_size,
        "num_channels": a.in_chans,
        "num_frames": a.num_frames,
        "tubelet_size": a.tubelet_size,
        "hidden_size": a.embed_dim,
        "num_hidden_layers": a.depth,
        "num_attention_heads": a.num_heads,
        "intermediate_size": a.mlp_hidden,
        "hidden_act": a.act,
        "qkv_bias": a.qkv_bias,
        "use_mean_pooling": True,
        "layer_norm_eps": a.norm_eps,
        "hidden_dropout_prob": 0.0,
        "attention_probs_dropout_prob": 0.0,
    }


def hf_config_kwargs(model: VideoViT, head: str | None = None, labels: list[str] | None = None) -> dict[str, Any]:
    """``transformers.VideoMAEConfig`` arguments describing ``model``: ``labels`` (one name per class of
    the exported head) as ``id2label`` / ``label2id``, else ``<head>_<i>`` names."""
    a = model.arch
    classes = a.heads[head] if head is not None else a.num_classes
    if labels is not None and len(labels) != classes:
        raise ValueError(f"{len(labels)} class names for a classifier of {classes} classes")
    names = labels if labels is not None else [f"{head or 'class'}_{i}" for i in range(classes)]
    return {
        **encoder_config_kwargs(a),
        "id2label": dict(enumerate(names)),
        "label2id": {n: i for i, n in enumerate(names)},
    }


def import_transformers() -> Any:
    """The transformers module, or ValueError (one line) saying how to install it."""
    try:
        import transformers  # lazy: optional and heavy (pip install 'transformers>=5,<6')
    except ImportError as e:
        raise ValueError("--format hf needs transformers (pip install 'transformers>=5,<6')") from e
    return transformers


@torch.no_grad()
def save_hf(model: VideoViT, out_dir: str | Path, head: str | None = None, labels: list[str] | None = None) -> float:
    """Write a ``VideoMAEForVideoClassification`` directory (config.json + model.safetensors).

    Loads it back with transformers and returns the largest |logit difference| to ``model`` on a
    random clip, so the caller can show that the export is faithful.
    """
    transformers = import_transformers()
    sd = to_hf_state_dict(model, head)
    config = transformers.VideoMAEConfig(**hf_config_kwargs(model, head, labels))
    hf = transformers.VideoMAEForVideoClassification(config)
    hf.load_state_dict(sd, strict=True)
    out_dir = Path(out_dir)
    hf.save_pretrained(str(out_dir))
    loaded = transformers.VideoMAEForVideoClassification.from_pretrained(str(out_dir)).eval()
    a = model.arch
    x = torch.randn(2, a.in_chans, a.num_frames, a.img_size, a.img_size, generator=torch.Generator().manual_seed(0))
    was_training = model.training
    model.eval()
    ours = model(x)
    model.train(was_training)
    ours = ours[head] if head is not None else ours
    theirs = loaded(pixel_values=x.permute(0, 2, 1, 3, 4)).logits
    return float((ours - theirs).abs().max())
