"""Load the weights users actually have into a ``VideoViT``: one checkpoint filter per format.

Formats (detected from the keys):

* ``avion_ds``  our own state dict (plain, DeepSpeed ``module`` wrapper, or the fp32 safetensors
  written by ``avion-ds export``);
* ``videomae``  official VideoMAE / VideoMAEv2 (``model`` / ``module`` wrappers, ``encoder.``
  prefix of pre-training checkpoints, ``q_bias`` / ``v_bias``, Conv3d ``patch_embed.proj``,
  ``gamma_1`` / ``gamma_2`` LayerScale);
* ``hf``        Hugging Face transformers VideoMAE (``videomae.encoder.layer.N...``; .bin or
  .safetensors, or a directory holding one);
* ``timm``      timm image ViTs (2-D patch weight inflated over the tubelet, position embedding
  tiled in time, qkv bias split into q / v bias; the k bias is softmax-invariant and dropped);
* ``dual_encoder``  the video tower of a video-text dual encoder (ours, AVION / LaViLa, OpenAI CLIP /
  OpenCLIP, also OpenAI's TorchScript archives) into a CLIP-layout classifier (``vit_clip_*``); its
  filter is registered by :mod:`~avion_ds.models.clip.tower_weights`.

Each filter maps keys to our names; ``_adapt`` then resizes what differs from the model (patch
weight layout / tubelet depth / patch size, learned position embedding in time and space) and
drops classifier weights whose class count differs, except a Kinetics-710 head loaded for Kinetics-400 /
600 / 700 (``kinetics_head``): its rows are picked by VideoMAE V2's label maps (``label_maps/``). The
result is a ``LoadReport``. Reading files and the final load are generic
(:mod:`avion_ds.models.weights.checkpoint`, :mod:`avion_ds.models.weights.loading`); this module never imports the model class, so the model can
import it (``VideoViT.prepare_checkpoint``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from timm.layers import resample_patch_embed
from torch import nn

from avion_ds.models.partition import state_shapes
from avion_ds.models.vit.kinetics710 import remap_k710
from avion_ds.models.weights.checkpoint import StateDict, checkpoint_state_dict, read_checkpoint
from avion_ds.models.weights.hf_config import layer_norm_eps_note
from avion_ds.models.weights.report import LoadReport
from avion_ds.storage.torchscript import read_torchscript_state_dict, torchscript_root

DUAL_ENCODER = "dual_encoder"


# ----------------------------------------------------------------------------------------------
# detection and filters
# ----------------------------------------------------------------------------------------------
def detect_format(sd: StateDict) -> str:
    """Name the checkpoint format or raise naming the first keys seen."""
    keys = list(sd)
    if any(k.startswith(("visual.blocks.", "visual.transformer.resblocks.")) for k in keys):
        return DUAL_ENCODER  # ours, AVION / LaViLa, OpenAI CLIP / OpenCLIP: the video tower loads
    if any(
        ".encoder.layer." in f".{k}"
        or k.startswith("embeddings.patch_embeddings")
        or ".embeddings.patch_embeddings." in k
        for k in keys
    ):
        return "hf"
    stripped = [k.removeprefix("encoder.") for k in keys]
    if "blocks.0.attn.qkv.weight" in stripped:
        patch = sd.get("patch_embed.proj.weight", sd.get("encoder.patch_embed.proj.weight"))
        if "blocks.0.attn.qkv.bias" in stripped and patch is not None and patch.dim() in (2, 5):
            return "avion_ds"  # ours in the CLIP layout (fused q/k/v bias); timm's patch weight is 4-D
        if "blocks.0.attn.qkv.bias" in stripped or (patch is not None and patch.dim() == 4):
            return "timm"
        if (patch is not None and patch.dim() == 2) or any(k.startswith(("heads.", "blocks.0.ls1.")) for k in keys):
            return "avion_ds"
        return "videomae"
    raise ValueError(
        "unrecognised checkpoint format (not avion_ds / VideoMAE / HF VideoMAE / timm ViT / dual encoder); "
        f"first keys: {keys[:8]}"
    )


def _filter_avion(sd: StateDict, model: nn.Module, report: LoadReport) -> StateDict:
    """Our layout as is; of our pretraining model the encoder, whose final token norm (run as the
    encoder ViT's ``fc_norm``) becomes ``norm``, as in the VideoMAE and HF layouts: a mean-pooling
    model leaves it unused and its ``fc_norm`` starts fresh (see _filter_videomae)."""
    if "encoder_to_decoder.weight" not in sd:
        return dict(sd)
    out = {}
    for k, v in sd.items():
        k = k.removeprefix("encoder.")
        out[f"norm.{k.removeprefix('fc_norm.')}" if k.startswith("fc_norm.") else k] = v
    return out


def _filter_videomae(sd: StateDict, model: nn.Module, report: LoadReport) -> StateDict:
    """Official VideoMAE / VideoMAEv2: keep the encoder (drop the pre-training decoder)."""
    if any(k.startswith("encoder.") for k in sd):  # pre-training: encoder.*, decoder.* (unexpected)
        sd = {k.removeprefix("encoder."): v for k, v in sd.items()}
    out = {}
    for k, v in sd.items():
        k = re.sub(r"^blocks\.(\d+)\.gamma_1$", r"blocks.\1.ls1.gamma", k)
        k = re.sub(r"^blocks\.(\d+)\.gamma_2$", r"blocks.\1.ls2.gamma", k)
        out[k] = v
    # No ``norm -> fc_norm`` remap: VideoMAE's run_class_finetuning.py only strips ``encoder.``, so a
    # pre-training encoder's ``norm`` is unused by a mean-pooling model (its norm is Identity) and
    # ``fc_norm`` starts fresh (LayerNorm init); we do the same (``norm.*`` reported unexpected).
    return out


_HF_BLOCK = {
    "attention.attention.q_bias": "attn.q_bias",
    "attention.attention.v_bias": "attn.v_bias",
    "attention.attention.query.bias": "attn.q_bias",
    "attention.attention.value.bias": "attn.v_bias",
    "attention.output.dense.weight": "attn.proj.weight",
    "attention.output.dense.bias": "attn.proj.bias",
    "intermediate.dense.weight": "mlp.fc1.weight",
    "intermediate.dense.bias": "mlp.fc1.bias",
    "output.dense.weight": "mlp.fc2.weight",
    "output.dense.bias": "mlp.fc2.bias",
    "layernorm_before.weight": "norm1.weight",
    "layernorm_before.bias": "norm1.bias",
    "layernorm_after.weight": "norm2.weight",
    "layernorm_after.bias": "norm2.bias",
}
HF_BLOCK_KEYS = _HF_BLOCK  # public: Hugging Face layer key suffix -> our block key suffix
_HF_TOP = {
    "embeddings.patch_embeddings.projection.weight": "patch_embed.proj.weight",
    "embeddings.patch_embeddings.projection.bias": "patch_embed.proj.bias",
    "layernorm.weight": "norm.weight",
    "layernorm.bias": "norm.bias",
    "fc_norm.weight": "fc_norm.weight",
    "fc_norm.bias": "fc_norm.bias",
    "classifier.weight": "head.weight",
    "classifier.bias": "head.bias",
}


def _zero_key_bias(key: str, v: torch.Tensor, report: LoadReport) -> None:
    """VideoMAE's key projection has no bias; some transformers versions store a zero one. Zero: skipped (the
    same function), stated in the report; non-zero: refused in one line (our blocks have no key bias)."""
    if bool(v.count_nonzero()):
        raise ValueError(f"HF checkpoint: {key} is not zero; VideoMAE (and this model) has no key bias")
    report.skipped.append(key)
    note = "zero key biases (transformers stores them; VideoMAE has none) skipped"
    if note not in report.notes:
        report.notes.append(note)


def _filter_hf(sd: StateDict, model: nn.Module, report: LoadReport) -> StateDict:
    """transformers VideoMAE(ForVideoClassification / ForPreTraining / Model) -> our names."""
    out: StateDict = {}
    qkv: dict[int, dict[str, torch.Tensor]] = {}
    for key, v in sd.items():
        k = key.removeprefix("videomae.")
        m = re.match(r"^encoder\.layer\.(\d+)\.(.+)$", k)
        if m:
            i, rest = int(m.group(1)), m.group(2)
            part = re.match(r"^attention\.attention\.(query|key|value)\.weight$", rest)
            if part:
                qkv.setdefault(i, {})[part.group(1)] = v
            elif rest == "attention.attention.key.bias":
                _zero_key_bias(key, v, report)
            elif rest in _HF_BLOCK:
                out[f"blocks.{i}.{_HF_BLOCK[rest]}"] = v
            else:
                out[key] = v  # reported as unexpected
        elif k in _HF_TOP:
            out[_HF_TOP[k]] = v
        else:
            out[key] = v
    for i, parts in qkv.items():
        if set(parts) != {"query", "key", "value"}:
            raise ValueError(f"HF checkpoint: layer {i} lacks {sorted({'query', 'key', 'value'} - set(parts))} weights")
        out[f"blocks.{i}.attn.qkv.weight"] = torch.cat([parts["query"], parts["key"], parts["value"]], dim=0)
    return out  # ``norm`` never becomes ``fc_norm`` (see _filter_videomae)


def _filter_timm(sd: StateDict, model: nn.Module, report: LoadReport) -> StateDict:
    """timm image ViT -> our names: split qkv bias, inflate patch weight, tile pos embed in time."""
    out: StateDict = {}
    d = model.embed_dim
    for k, v in sd.items():
        m = re.match(r"^blocks\.(\d+)\.attn\.qkv\.bias$", k)
        if m:
            out[f"blocks.{m.group(1)}.attn.q_bias"] = v[:d]
            out[f"blocks.{m.group(1)}.attn.v_bias"] = v[2 * d :]
            continue
        out[k] = v
    w = out.get("patch_embed.proj.weight")
    if w is not None and w.dim() == 4:  # (D, C, p, p) -> (D, C, t, p, p), averaged over time (I3D)
        t = model.tubelet_size
        out["patch_embed.proj.weight"] = w.unsqueeze(2).repeat(1, 1, t, 1, 1) / t
        report.resized.append("patch_embed.proj.weight")
    pos = out.pop("pos_embed", None)
    if pos is not None and model.arch.pos_embed != "learned":
        out["pos_embed"] = pos  # the model's table is fixed: reported unexpected (warned below)
    elif pos is not None:
        n = pos.shape[1]
        side = math.isqrt(n)
        while side > 0 and n - side * side > 16:  # up to 16 prefix (cls / register) tokens
            side -= 1
        prefix = n - side * side
        if model.cls_token is not None and prefix >= 1 and "cls_token" in out:
            out["cls_token"] = out["cls_token"] + pos[:, :1]  # fold the cls position into the token
        _, gh, gw = model.patch_embed.grid
        grid = pos[:, prefix:].reshape(1, side, side, -1).permute(0, 3, 1, 2)
        if (side, side) != (gh, gw):
            grid = F.interpolate(grid.float(), size=(gh, gw), mode="bicubic", align_corners=False).to(pos.dtype)
        grid = grid.permute(0, 2, 3, 1).reshape(1, 1, gh * gw, -1)
        report.resized.append("pos_embed")
        out["pos_embed"] = grid.expand(1, model.patch_embed.grid[0], gh * gw, grid.shape[-1]).reshape(
            1, -1, grid.shape[-1]
        )
    return out  # ``norm`` never becomes ``fc_norm`` (see _filter_videomae)


# the normalisation each format's weights were trained with (a data.mean_std value; None: the format does
# not say: our own files follow their run's recipe, timm's image ViTs vary by release); a dual encoder's
# is its layout's (set by its filter)
FORMAT_MEAN_STD: dict[str, str | None] = {"avion_ds": None, "videomae": "imagenet", "hf": "imagenet", "timm": None}

# DUAL_ENCODER is added by avion_ds.models.clip.tower_weights (imported with avion_ds.models)
FILTERS: dict[str, Callable[[StateDict, nn.Module, LoadReport], StateDict]] = {
    "avion_ds": _filter_avion,
    "videomae": _filter_videomae,
    "hf": _filter_hf,
    "timm": _filter_timm,
}


# ----------------------------------------------------------------------------------------------
# resizing to the model
# ----------------------------------------------------------------------------------------------
def resize_patch_weight(w: torch.Tensor, shape: tuple[int, int, int, int, int]) -> torch.Tensor:
    """Conv3d patch weight (D, C, t0, p0, p0) -> (D, C, t, p, p): time resampled and rescaled so a
    constant-in-time clip gives the same response; space via timm's pseudo-inverse resampling."""
    D, C, t, p, _ = shape
    if w.shape[3:] != (p, p):
        w = torch.stack([resample_patch_embed(w[:, :, i], [p, p]) for i in range(w.shape[2])], dim=2)
    t0 = w.shape[2]
    if t0 != t:
        flat = w.permute(0, 1, 3, 4, 2).reshape(-1, 1, t0).float()
        flat = F.interpolate(flat, size=t, mode="linear", align_corners=False) * (t0 / t)
        w = flat.reshape(D, C, p, p, t).permute(0, 1, 4, 2, 3).to(w.dtype)
    return w.contiguous()


def guess_grid(n: int, target: tuple[int, int, int]) -> tuple[int, int, int]:
    """Token grid (t, h, w) of a flattened position table with n entries.

    Among the factorisations t x h x w = n whose h : w equals the target's, the one whose t : h
    ratio is closest (in log scale) to the target's: 1568 tokens for an (8, 14, 14) or (16, 16, 16)
    target are (8, 14, 14), never (2, 28, 28) or (32, 7, 7). Ties go to the smaller t.
    """
    t1, h1, w1 = target
    g = math.gcd(h1, w1)
    rh, rw = h1 // g, w1 // g  # spatial aspect of the target grid
    best: tuple[float, tuple[int, int, int]] | None = None
    for s in range(1, math.isqrt(n // (rh * rw)) + 1 if n >= rh * rw else 1):
        h, w = rh * s, rw * s
        if n % (h * w):
            continue
        t = n // (h * w)
        score = abs(math.log(t / h) - math.log(t1 / h1))
        if best is None or score < best[0] - 1e-12 or (abs(score - best[0]) <= 1e-12 and t < best[1][0]):
            best = (score, (t, h, w))
    if best is None:
        raise ValueError(f"pos_embed: cannot infer a (t, h, w) grid with h:w = {h1}:{w1} for {n} tokens")
    return best[1]


def resize_pos_embed(pos: torch.Tensor, grid: tuple[int, int, int]) -> torch.Tensor:
    """Learned position table (1, N0, D) -> (1, t*h*w, D), trilinear in time and space."""
    t0, h0, w0 = guess_grid(pos.shape[1], grid)
    x = pos.reshape(1, t0, h0, w0, -1).permute(0, 4, 1, 2, 3).float()
    x = F.interpolate(x, size=grid, mode="trilinear", align_corners=False)
    return x.permute(0, 2, 3, 4, 1).reshape(1, -1, pos.shape[-1]).to(pos.dtype)


def _as_conv_weight(key: str, w: torch.Tensor, conv_shape: tuple[int, int, int, int, int]) -> torch.Tensor:
    """A 2-D (linear-path) patch weight back to 5-D, assuming the model's channels and patch size."""
    D, C, _, p, _ = conv_shape
    t0, rem = divmod(w.shape[1], C * p * p)
    if w.shape[0] != D or rem or t0 < 1:
        raise ValueError(
            f"checkpoint key {key}: linear patch weight {tuple(w.shape)} does not fit (D, C, t, p, p) = {conv_shape}"
        )
    return w.reshape(D, C, t0, p, p)


def _adapt(sd: StateDict, model: nn.Module, report: LoadReport, kinetics_head: bool = False) -> StateDict:
    target = state_shapes(model)  # logical shapes, also of ZeRO-3 partitioned parameters
    out: StateDict = {}
    for k, v in sd.items():
        if k not in target:
            out[k] = v  # becomes "unexpected"
            continue
        want = target[k]
        mapped = remap_k710(k, v, want, report) if kinetics_head and k in ("head.weight", "head.bias") else None
        if mapped is not None:
            out[k] = mapped
        elif v.shape == want:
            out[k] = v
        elif k == "patch_embed.proj.weight":
            conv_shape = model.patch_embed.conv_weight_shape
            w = _as_conv_weight(k, v, conv_shape) if v.dim() == 2 else v
            if w.shape[:2] != conv_shape[:2]:
                raise ValueError(f"checkpoint key {k}: expected (D, C) = {conv_shape[:2]}, got {tuple(w.shape)}")
            if tuple(w.shape) != conv_shape:
                w = resize_patch_weight(w, conv_shape)
                report.resized.append(k)
            out[k] = w.reshape(want)
        elif k == "pos_embed" and v.dim() == 3 and v.shape[-1] == want[-1]:
            out[k] = resize_pos_embed(v, model.patch_embed.grid)
            report.resized.append(k)
        elif k.startswith(("head.", "heads.")):
            report.dropped.append(k)  # class count differs: keep the fresh head
        else:
            raise ValueError(f"checkpoint key {k}: shape {tuple(v.shape)} does not fit the model's {tuple(want)}")
    return out


def prepare_vit_state_dict(
    model: nn.Module, source: str | Path | dict, trust: bool = False, *, kinetics_head: bool = False
) -> tuple[StateDict, LoadReport]:
    """Read ``source`` (any format above; a pretraining checkpoint gives its encoder) and map / resize it
    to the video ViT ``model``'s names and shapes; nothing is loaded yet (``VideoViT.prepare_checkpoint``).
    ``kinetics_head``: a 710-row head becomes the model's Kinetics-400 / 600 / 700 rows by the label map."""
    if not isinstance(source, dict) and Path(source).is_file() and torchscript_root(source) is not None:
        sd = read_torchscript_state_dict(source)  # OpenAI's CLIP releases: tensors read, nothing run
    else:
        sd = checkpoint_state_dict(read_checkpoint(source, trust))
    fmt = detect_format(sd)
    report = LoadReport(format=fmt, mean_std=FORMAT_MEAN_STD.get(fmt))
    note = layer_norm_eps_note(source, model.arch.norm_eps) if not isinstance(source, dict) else None
    report.notes += [note] if note else []
    return _adapt(FILTERS[fmt](sd, model, report), model, report, kinetics_head), report
