"""CLIP-style video-text dual encoder (AVION / LaViLa): a ``VideoViT`` in the CLIP layout as the
video tower, CLIP's causal text transformer, and a learned temperature.

``forward(frames, tokens)`` returns L2-normalised float32 video and text embeddings and the logit scale
``exp(t)`` of the temperature parameter ``t`` (init ln(1 / 0.07)). As AVION (``main_lavila_pretrain.py``:
``logit_scale.data.clamp_(0, 4.6052)`` after each step), ``t`` itself is clamped to [0, ln 100] after
every optimizer step (``ContrastiveTask.after_step``, on the fp32 master weight too:
``distributed.master_weights``), never in the forward: a ``t`` the step pushed past ln 100 keeps its gradient
and comes back by the clamp, instead of sitting at a flat clamp that no gradient leaves.

Registered sizes use AVION's training choices: exact-erf GELU in both towers (AVION's
``use_quick_gelu`` never reaches its towers), LayerNorm eps 1e-6 (video) / 1e-5 (text), a 256-wide
projection, 4 frames. ``act="quick_gelu", norm_eps=1e-5, proj_dim=512`` (768 for L/14) is
OpenAI's CLIP exactly.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from avion_ds.models.arch import ViTArch
from avion_ds.models.clip.text_tower import TextArch, TextTransformer
from avion_ds.models.clip.weights import prepare_clip_state_dict
from avion_ds.models.flops import arch_flops, block_flops
from avion_ds.models.vit.model import VideoViT
from avion_ds.models.weights.report import LoadReport

LOGIT_SCALE_INIT = math.log(1 / 0.07)
LOGIT_SCALE_MAX = 4.6052  # AVION's clamp bound (main_lavila_pretrain.py): ln 100 = 4.60517 rounded up
PROJECTION_MODES = ("auto", "fresh")


@dataclass
class ClipArch:
    """The two towers' architectures and the temperature settings of a dual encoder.

    ``replace`` routes overrides: ``text_<field>`` to the text tower, ``proj_dim``, ``act`` and
    ``attn_backend`` to both towers, the temperature fields here, every other key to the video
    tower's ``ViTArch`` (which names unknown keys)."""

    name: str
    vision: ViTArch
    text: TextArch
    freeze_logit_scale: bool = False
    logit_scale_init: float = LOGIT_SCALE_INIT

    @property
    def video_transformer(self) -> ViTArch:
        """The video transformer this architecture runs: the video tower."""
        return self.vision

    # what generic code (planner, preflight, listing) reads of a registered arch: the video tower's
    @property
    def patch_size(self) -> int:
        return self.vision.patch_size

    @property
    def tubelet_size(self) -> int:
        return self.vision.tubelet_size

    @property
    def num_frames(self) -> int:
        return self.vision.num_frames

    @property
    def img_size(self) -> int:
        return self.vision.img_size

    @property
    def head_dim(self) -> int:
        return self.vision.head_dim

    @property
    def proj_dim(self) -> int | None:
        return self.vision.proj_dim

    def forward_flops(self) -> int:
        """Forward FLOPs of one clip and one caption of the full context: both towers and projections."""
        t = self.text
        text = t.depth * block_flops(t.context_length, t.embed_dim, t.mlp_hidden) + 2 * t.embed_dim * (t.proj_dim or 0)
        return arch_flops(self.vision) + text

    def validate(self) -> ClipArch:
        self.vision.validate()
        self.text.validate()
        if self.vision.proj_dim != self.text.proj_dim:
            raise ValueError(
                f"{self.name}: the towers' proj_dim differ (video {self.vision.proj_dim}, text {self.text.proj_dim})"
            )
        if self.vision.pool != "cls" or self.vision.num_classes or self.vision.heads:
            raise ValueError(f"{self.name}: the video tower expected pool='cls' and no classifier")
        return self

    def replace(self, **overrides: Any) -> ClipArch:
        """A copy with ``overrides`` applied (see the class docstring), validated."""
        text = {k.removeprefix("text_"): overrides.pop(k) for k in list(overrides) if k.startswith("text_")}
        for key in ("proj_dim", "act", "attn_backend"):
            if key in overrides:
                text.setdefault(key, overrides[key])
        own = {k: overrides.pop(k) for k in ("freeze_logit_scale", "logit_scale_init") if k in overrides}
        for key in ("num_classes", "heads"):
            if overrides.get(key) not in (None, 0):
                raise ValueError(f"{self.name}: a dual encoder has no classifier; got {key}={overrides[key]!r}")
            overrides.pop(key, None)
        return dataclasses.replace(
            self, vision=self.vision.replace(**overrides), text=self.text.replace(**text), **own
        ).validate()


def at_least_fp32(x: torch.Tensor) -> torch.Tensor:
    """``x`` in float32 when it is a 16-bit float (similarities and losses are not built in 16 bits)."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


class DualEncoderOutput(NamedTuple):
    """Normalised embeddings (B, E) of both towers and the logit scale (a 0-d tensor)."""

    video: torch.Tensor
    text: torch.Tensor
    logit_scale: torch.Tensor


class VideoTextDualEncoder(nn.Module):
    """``visual`` (a ``VideoViT`` in the CLIP layout), ``textual`` (``TextTransformer``), ``logit_scale``."""

    def __init__(self, arch: ClipArch, projection: str = "auto") -> None:
        super().__init__()
        arch.validate()
        if projection not in PROJECTION_MODES:
            raise ValueError(
                f"{arch.name}: projection expected one of {', '.join(PROJECTION_MODES)}, got {projection!r}"
            )
        self.arch = arch
        self.projection = projection  # how pretrained projections load (see clip.weights)
        self.visual = VideoViT(arch.vision)
        self.textual = TextTransformer(arch.text)
        # shape (1,), not CLIP's 0-d: ZeRO-3 cannot partition a 0-d parameter (loading reshapes)
        self.logit_scale = nn.Parameter(torch.full((1,), float(arch.logit_scale_init)))
        if arch.freeze_logit_scale:
            self.logit_scale.requires_grad_(False)
        self.depth = max(arch.vision.depth, arch.text.depth)
        self.num_frames, self.img_size = arch.vision.num_frames, arch.vision.img_size

    # -- towers ----------------------------------------------------------------------------------
    def encode_video(self, frames: torch.Tensor, keep: torch.Tensor | None = None) -> torch.Tensor:
        """(B, C, T, H, W) normalised frames -> (B, E) video embeddings (not normalised); ``keep``: the
        video tower's run-length tokenization mask (``VideoViT.forward_features``)."""
        return self.visual(frames, keep)

    def encode_text(self, tokens: torch.Tensor) -> torch.Tensor:
        """(B, 77) token ids (``avion_ds.data.tokenizer.tokenize``) -> (B, E) text embeddings (not normalised)."""
        return self.textual(tokens)

    def scale(self) -> torch.Tensor:
        """``exp`` of the temperature (the multiplier of the cosine logits); the parameter is kept in
        [0, ln 100] by the clamp after each optimizer step (module doc)."""
        return self.logit_scale.float().exp().squeeze(0)

    def forward(
        self, frames: torch.Tensor, tokens: torch.Tensor, keep: torch.Tensor | None = None
    ) -> DualEncoderOutput:
        # normalised in float32: bf16 unit vectors would quantise every similarity built from them
        video = F.normalize(at_least_fp32(self.encode_video(frames, keep)), dim=-1)
        text = F.normalize(at_least_fp32(self.encode_text(tokens)), dim=-1)
        return DualEncoderOutput(video, text, self.scale())

    # -- hooks used by activation checkpointing, optimizer groups and weight loading ---------------
    @property
    def blocks(self) -> nn.ModuleList:
        """Video blocks then text blocks (what the generic block walkers see)."""
        return nn.ModuleList([*self.visual.blocks, *self.textual.blocks])

    def block_lists(self) -> list[nn.ModuleList]:
        """Each tower's blocks: activation checkpointing selects within each (every k-th, first n)."""
        return [self.visual.blocks, self.textual.blocks]

    def no_weight_decay(self) -> set[str]:
        out = {f"visual.{n}" for n in self.visual.no_weight_decay()}
        return out | {f"textual.{n}" for n in self.textual.no_weight_decay()} | {"logit_scale"}

    def layer_id(self, param_name: str) -> int:
        name = param_name.removeprefix("module.")
        if name.startswith("visual."):
            return self.visual.layer_id(name.removeprefix("visual."))
        if name.startswith("textual."):
            return self.textual.layer_id(name.removeprefix("textual."))
        return self.depth + 1

    def prepare_checkpoint(
        self, source: str | Path | dict[str, Any], trust: bool = False, *, kinetics_head: bool = False
    ) -> tuple[dict[str, torch.Tensor], LoadReport]:
        """``source`` (OpenAI CLIP, OpenCLIP, AVION / LaViLa, ours) mapped to this model's names
        (``kinetics_head`` is a classifier's option: a dual encoder has none, so it is not used)."""
        return prepare_clip_state_dict(self, source, trust)

    def extra_repr(self) -> str:
        return f"name={self.arch.name}, projection={self.projection}, freeze_logit_scale={self.arch.freeze_logit_scale}"
