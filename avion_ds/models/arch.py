"""The architecture description of a video ViT: one dataclass, validated once.

Kept apart from weights: a registered size is just a ``ViTArch``; pretrained loading (each family's
``weights`` module) never changes the architecture.
"""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass
from typing import Any

from avion_ds.models.attention import BACKENDS
from avion_ds.models.mlp import ACTIVATIONS
from avion_ds.models.patch_embed import MODES as PATCH_EMBED_MODES
from avion_ds.models.rlt import threshold_problem
from avion_ds.models.token_merge import merge_schedule, schedule_problem

POOLS = ("mean", "cls")
# sincos / learned: one entry per token; clip: a spatial table whose first entry is the class
# token's, plus a temporal table added per frame (CLIP / AVION layout)
POS_EMBEDS = ("sincos", "learned", "clip")
# classifier init: VideoMAE's fine-tuning (trunc-normal 0.02 scaled by head_init_scale) or AVION's
# VideoClassifier (``fc_cls``: normal(0, 0.01) weights, zero bias; avion/models/model_clip.py)
HEAD_INITS = ("videomae", "avion")
# per-block stochastic depth: timm / VideoMAE's linear rise, or AVION's one rate for every block
# (avion/models/transformer.py: Transformer hands its drop_path to each ResidualAttentionBlock)
DROP_PATH_SCHEDULES = ("linear", "uniform")


def drop_path_rates(rate: float, depth: int, schedule: str) -> list[float]:
    """The drop-path rate of each of ``depth`` blocks under ``schedule`` (``DROP_PATH_SCHEDULES``)."""
    if schedule == "uniform":
        return [rate] * depth
    return [rate * i / max(depth - 1, 1) for i in range(depth)]


@dataclass
class ViTArch:
    """Everything needed to build a ``VideoViT`` (sizes, input geometry, heads, regularisation)."""

    name: str = "custom"
    embed_dim: int = 768
    depth: int = 12
    num_heads: int = 12
    mlp_ratio: float = 4.0
    patch_size: int = 16
    tubelet_size: int = 2
    num_frames: int = 16
    img_size: int = 224
    in_chans: int = 3
    qkv_bias: bool = True  # VideoMAE q_bias + v_bias
    layer_scale: float | None = None  # init value of per-block LayerScale (None: no LayerScale)
    num_classes: int = 400  # single head; 0 = no head (forward returns pooled features)
    heads: dict[str, int] | None = None  # multi-head, e.g. {"verb": 97, "noun": 300}
    drop_path_rate: float = 0.0  # stochastic depth rate (see drop_path_schedule)
    # linear: 0 -> drop_path_rate over depth (timm / VideoMAE) | uniform: drop_path_rate in every block (AVION)
    drop_path_schedule: str = "linear"
    head_drop_rate: float = 0.0
    attn_backend: str = "auto"  # auto | flash | sdpa | eager
    patch_embed: str = "linear"  # linear | conv
    pool: str = "mean"  # mean (+ fc_norm) | cls
    pos_embed: str = "sincos"  # sincos (fixed, VideoMAE) | learned
    norm_eps: float = 1e-6
    head_init_scale: float = 0.001  # VideoMAE fine-tune init_scale for the classifier
    head_init: str = "videomae"  # videomae: trunc-normal(0.02) x head_init_scale | avion: N(0, 0.01), zero bias
    # CLIP layout options (all off for VideoMAE)
    k_bias: bool = False  # with qkv_bias: one fused q/k/v bias (CLIP's in_proj_bias)
    act: str = "gelu"  # gelu | quick_gelu (OpenAI / OpenCLIP weights)
    patch_embed_bias: bool = True  # CLIP's conv1 has none
    ln_pre: bool = False  # LayerNorm on the tokens before the blocks
    proj_dim: int | None = None  # bias-free projection of the pooled feature (CLIP's visual.proj)
    patch_dropout: float = 0.0  # FLIP: fraction of patch tokens dropped in training (never the class token)
    # ToMe: tokens merged after each block's attention, one r for every block or a list of r per block; 0 = off
    token_merge: int | list[int] = 0
    # run-length tokenization (models/rlt.py): static patches under this threshold dropped, in training and
    # evaluation; 0 = off (the model exactly as without it)
    rlt_threshold: float = 0.0

    @property
    def head_dim(self) -> int:
        return self.embed_dim // self.num_heads

    @property
    def mlp_hidden(self) -> int:
        return int(self.embed_dim * self.mlp_ratio)

    @property
    def video_transformer(self) -> ViTArch:
        """The video transformer this architecture runs: itself (a dual encoder answers with its video
        tower, a pretraining model with its encoder)."""
        return self

    @property
    def grid(self) -> tuple[int, int, int]:
        """Token grid (T/t, H/p, W/p)."""
        s = self.img_size // self.patch_size
        return (self.num_frames // self.tubelet_size, s, s)

    @property
    def num_patches(self) -> int:
        t, h, w = self.grid
        return t * h * w

    @property
    def feature_dim(self) -> int:
        """Width of ``forward_features``: the projection's when there is one."""
        return int(self.proj_dim) if self.proj_dim else self.embed_dim

    @property
    def kept_patches(self) -> int:
        """Patch tokens the blocks see in training (after patch dropout)."""
        n = self.num_patches
        return max(1, int(n * (1 - self.patch_dropout))) if self.patch_dropout > 0 else n

    @property
    def merge_schedule(self) -> list[int]:
        """Tokens merged after each block (``token_merge`` per block)."""
        return merge_schedule(self.token_merge, self.depth)

    @property
    def merges(self) -> bool:
        """True when some block merges tokens (attention then takes a bias: sdpa or eager)."""
        return any(r > 0 for r in self.merge_schedule)

    @property
    def rlt(self) -> bool:
        """True when the model drops static patches (run-length tokenization): packed blocks."""
        return self.rlt_threshold > 0

    def rlt_problem(self) -> str | None:
        """What is wrong with ``rlt_threshold`` here, or None: a number in [0, 1), and with it on a backend
        that takes clips of different lengths and neither token merging nor patch dropout."""
        problem = threshold_problem(self.rlt_threshold)
        if problem is not None or not self.rlt:
            return problem
        if self.attn_backend == "eager":
            return "attn_backend='eager' has no packed form for clips of different lengths; use auto, sdpa or flash"
        if self.token_merge != 0:
            return "token merging needs the same token count in every clip; use one of rlt_threshold, token_merge"
        if self.patch_dropout > 0:
            return "patch dropout and run-length tokenization both drop patches; use one of the two"
        return None

    def token_merge_problem(self) -> str | None:
        """What is wrong with ``token_merge`` here, or None: r >= 0, one per block, never more than a
        block's tokens allow (the fewer of training, after patch dropout); flash-attn takes no bias."""
        if self.token_merge == 0:
            return None
        cls = self.pool == "cls"
        problem = schedule_problem(self.token_merge, self.depth, self.kept_patches + int(cls), cls)
        if problem is None and self.merges and self.attn_backend == "flash":
            problem = "attn_backend='flash': token merging needs a bias; flash-attn takes none; use auto, sdpa or eager"
        return problem

    def validate(self) -> ViTArch:
        """Raise a one-line ValueError naming the bad field; return self."""
        choices = {
            "attn_backend": BACKENDS,
            "patch_embed": PATCH_EMBED_MODES,
            "pool": POOLS,
            "pos_embed": POS_EMBEDS,
            "act": ACTIVATIONS,
            "head_init": HEAD_INITS,
        }
        for key, allowed in choices.items():
            if getattr(self, key) not in allowed:
                raise ValueError(f"{self.name}: {key} expected one of {', '.join(allowed)}, got {getattr(self, key)!r}")
        for key in (
            "embed_dim",
            "depth",
            "num_heads",
            "patch_size",
            "tubelet_size",
            "num_frames",
            "img_size",
            "in_chans",
        ):
            if int(getattr(self, key)) <= 0:
                raise ValueError(f"{self.name}: {key} expected a positive integer, got {getattr(self, key)!r}")
        if self.embed_dim % self.num_heads:
            raise ValueError(
                f"{self.name}: expected embed_dim divisible by num_heads, got {self.embed_dim}/{self.num_heads}"
            )
        if self.img_size % self.patch_size:
            raise ValueError(
                f"{self.name}: expected img_size divisible by patch_size={self.patch_size}, got {self.img_size}"
            )
        if self.num_frames % self.tubelet_size:
            raise ValueError(
                f"{self.name}: expected num_frames divisible by tubelet_size={self.tubelet_size}, got {self.num_frames}"
            )
        if self.num_classes < 0:
            raise ValueError(f"{self.name}: num_classes expected >= 0, got {self.num_classes}")
        if self.heads is not None:
            if not isinstance(self.heads, dict) or not self.heads:
                raise ValueError(f"{self.name}: heads expected a non-empty dict name->classes, got {self.heads!r}")
            for head, n in self.heads.items():
                if not isinstance(head, str) or not head.isidentifier() or int(n) <= 0:
                    raise ValueError(f"{self.name}: heads expected identifier -> positive int, got {head!r}: {n!r}")
        if self.pos_embed == "clip" and self.pool != "cls":
            raise ValueError(f"{self.name}: pos_embed='clip' expected pool='cls' (its table has a class entry)")
        if self.proj_dim is not None and int(self.proj_dim) <= 0:
            raise ValueError(f"{self.name}: proj_dim expected a positive integer or None, got {self.proj_dim!r}")
        if self.drop_path_schedule not in DROP_PATH_SCHEDULES:
            raise ValueError(
                f"{self.name}: drop_path_schedule expected one of {', '.join(DROP_PATH_SCHEDULES)}, "
                f"got {self.drop_path_schedule!r}"
            )
        for key in ("drop_path_rate", "head_drop_rate", "patch_dropout"):
            if not 0.0 <= float(getattr(self, key)) < 1.0:
                raise ValueError(f"{self.name}: {key} expected in [0, 1), got {getattr(self, key)!r}")
        problem = self.token_merge_problem()
        if problem is not None:
            raise ValueError(f"{self.name}: token_merge={self.token_merge!r}: {problem}")
        problem = self.rlt_problem()
        if problem is not None:
            raise ValueError(f"{self.name}: rlt_threshold={self.rlt_threshold!r}: {problem}")
        return self

    def replace(self, **overrides: Any) -> ViTArch:
        """A copy with ``overrides`` applied; unknown keys raise naming close matches."""
        names = [f.name for f in dataclasses.fields(self)]
        for key in overrides:
            if key not in names:
                close = difflib.get_close_matches(key, names, n=3)
                hint = f"; did you mean {', '.join(close)}?" if close else f"; known: {', '.join(names)}"
                raise TypeError(f"{self.name}: unknown model option {key!r}{hint}")
        if overrides.get("heads") is not None:
            overrides["heads"] = dict(overrides["heads"])
        if isinstance(overrides.get("token_merge"), tuple):
            overrides["token_merge"] = list(overrides["token_merge"])
        return dataclasses.replace(self, **overrides).validate()
