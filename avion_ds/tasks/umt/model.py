"""The UMT student: our video ViT run on the visible tokens, with one CLIP-space decoder per distilled layer.

``UMTStudent`` IS a ``VideoViT`` (mean pooling, so its final token norm is ``fc_norm``, as the masked
autoencoder's encoder) plus ``clip_decoder.{i}`` (Linear(width -> teacher's projection width) -> LayerNorm ->
l2 normalisation, the reference's ``Linear_Decoder``) and the fixed sin-cos table the reference adds to the
returned tokens before the decoders (``clip_pos_embed``). Its parameter names are the classifier's, so a
run's weights (or their ``avion-ds export``) start ``task: finetune`` with the whole backbone matched; the
decoders are reported unexpected there. ``forward(frames, mask)`` returns the decoded features of the
blocks ``depth - int(i * interval) - 1`` (i < ``layers``), each through ``fc_norm``: (K, B, N_vis, C).

The frozen teacher rides along outside the module tree (:meth:`attach_teacher`; rule in ``teacher``).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from avion_ds.models.arch import ViTArch
from avion_ds.models.partition import gathered
from avion_ds.models.vit.model import VideoViT, sincos_table
from avion_ds.tasks.umt.teacher import ClipTeacher, return_index

DECODER_EPS = 1e-6  # the reference's norm_layer: partial(nn.LayerNorm, eps=1e-6)


class ClipDecoder(nn.Module):
    """Linear -> LayerNorm -> l2 normalisation (the reference's ``Linear_Decoder`` with ``clip_norm_type='l2'``)."""

    def __init__(self, dim: int, out_dim: int) -> None:
        super().__init__()
        self.head = nn.Linear(dim, out_dim)
        self.norm = nn.LayerNorm(out_dim, eps=DECODER_EPS)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.normalize(self.norm(self.head(x)).float(), dim=-1)


class UMTStudent(VideoViT):
    """Video ViT + CLIP decoders (module doc). ``arch``: a mean-pooling ``ViTArch`` without classifier."""

    def __init__(self, arch: ViTArch, out_dim: int, layers: int, interval: float) -> None:
        super().__init__(arch)
        self.return_index = return_index(arch.depth, layers, interval)
        if min(self.return_index) < 0:
            raise ValueError(f"returning {layers} layers every {interval} needs more than {arch.depth} blocks")
        self.clip_decoder = nn.ModuleList([ClipDecoder(arch.embed_dim, out_dim) for _ in range(layers)])
        self.register_buffer("clip_pos_embed", sincos_table(self.patch_embed.num_patches, arch.embed_dim), False)
        self._init_umt()

    def _init_umt(self) -> None:
        """The reference's init (``_init_weights`` of its encoder and decoders): xavier-uniform linears,
        zero biases, unit norms; the patch embedding keeps PyTorch's default."""
        for name, m in self.named_modules():
            if name.startswith("patch_embed") or not isinstance(m, (nn.Linear, nn.LayerNorm)):
                continue
            with gathered(m.parameters(recurse=False)):
                if isinstance(m, nn.Linear):
                    nn.init.xavier_uniform_(m.weight)
                    if m.bias is not None:
                        nn.init.zeros_(m.bias)
                else:
                    nn.init.ones_(m.weight)
                    nn.init.zeros_(m.bias)

    def attach_teacher(self, teacher: ClipTeacher) -> None:
        """Hold ``teacher`` outside the module tree: in no state dict, optimizer or partition."""
        self.__dict__["teacher"] = teacher

    @property
    def frozen_teacher(self) -> ClipTeacher:
        teacher = self.__dict__.get("teacher")
        if teacher is None:
            raise RuntimeError("UMTStudent: no teacher attached (attach_teacher)")
        return teacher

    def visible_features(self, frames: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """``fc_norm`` of the returned blocks' visible tokens (K, B, N_vis, D); only visible tubelets embed."""
        B = frames.shape[0]
        pos = self.pos_embed.to(frames.dtype).expand(B, -1, -1)[~mask].reshape(B, -1, self.embed_dim)
        pe = self.patch_embed
        if pe.mode == "linear":
            tubelets = pe.patchify(frames)
            x = pe.proj(tubelets[~mask].reshape(B, -1, tubelets.shape[-1]))
        else:
            x = pe(frames)
            x = x[~mask].reshape(B, -1, x.shape[-1])
        x = x + pos
        kept = []
        for i, blk in enumerate(self.blocks):
            x = blk(x)
            if i in self.return_index:
                kept.append(x)
        return self.fc_norm(torch.stack(kept))

    def forward(self, frames: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        """Decoded, l2-normalised float32 features (K, B, N_vis, C) of the visible tokens (``mask`` True = hidden)."""
        self.check_input(frames)
        frames = frames.to(self.patch_embed.proj.weight.dtype)
        feats = self.visible_features(frames, mask)
        B, D = frames.shape[0], feats.shape[-1]
        feats = feats + self.clip_pos_embed.to(feats.dtype).expand(B, -1, -1)[~mask].reshape(B, -1, D)
        return torch.stack([dec(f) for dec, f in zip(self.clip_decoder, feats)])

    def extra_repr(self) -> str:
        return super().extra_repr() + f", umt return={self.return_index}, decoders={len(self.clip_decoder)}"


def student_arch(name: str, overrides: dict[str, Any]) -> ViTArch:
    """The mean-pooling, classifier-free ``ViTArch`` of registered video ViT ``name`` with ``overrides``."""
    from avion_ds.models import registered_arch  # lazy: heavy (timm, torchvision)

    arch = registered_arch(name, **{**overrides, "num_classes": 0})
    if not isinstance(arch, ViTArch):
        raise TypeError(f"{name} is not a video ViT classifier (a vit_* name)")
    if arch.pool != "mean":
        raise ValueError(f"{name}: pool expected 'mean' (the student's final norm is fc_norm), got {arch.pool!r}")
    return arch
