"""VideoMAE-style video Vision Transformer with joint space-time attention.

Parameter names follow the official VideoMAE / VideoMAEv2 fine-tuning code (``patch_embed.proj``,
``blocks.N.attn.{qkv,q_bias,v_bias,proj}``, ``blocks.N.mlp.fc{1,2}``, ``fc_norm``, ``head``) so
their checkpoints load by name; multi-head models use ``heads.<name>``.

The same transformer is CLIP's / AVION's video tower with the CLIP layout options of ``ViTArch``:
per-frame patches (tubelet 1), ``pos_embed="clip"`` (a spatial table whose entry 0 is the class
token's, plus ``temporal_embed`` added per frame, time-major tokens), fused q/k/v bias
(``k_bias``), ``ln_pre``, ``norm`` on the class token (CLIP's ``ln_post``), ``proj`` and FLIP
patch dropout (after the position embedding, before ``ln_pre``, class token kept).

Token merging (``arch.token_merge``, ``models/token_merge.py``): a block that merges runs attention with
the log-size bias, merges its ``r`` tokens on that attention's keys, then its MLP; mean pooling weighs
each token by its size. With no merging the blocks and pooling run exactly as without the option.

Run-length tokenization (``arch.rlt_threshold``, ``models/rlt.py``): ``forward(x, keep=None)`` drops the
static patches (``keep`` (B, T', H', W') bool, or computed from ``x`` by the reference's rule), adds the
run-length embedding to the kept tokens (after their position embedding), packs the kept tokens of all
clips end to end (the class token always kept) and runs the blocks on them, attention per clip; mean
pooling averages each clip's kept tokens (unweighted, as the reference), cls pooling takes the class token.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from timm.layers import DropPath, LayerScale, trunc_normal_
from torch import nn

from avion_ds.models.arch import ViTArch, drop_path_rates
from avion_ds.models.attention import Attention
from avion_ds.models.mlp import Mlp
from avion_ds.models.partition import full_ndim, gathered, param_count
from avion_ds.models.patch_embed import PatchEmbed
from avion_ds.models.rlt import PackedClips, RunLengthEmbedding, run_lengths, static_keep_mask
from avion_ds.models.token_merge import merge_tokens, size_bias, weighted_mean
from avion_ds.models.vit.weights import prepare_vit_state_dict
from avion_ds.models.weights.report import LoadReport


def sincos_table(num_positions: int, dim: int, device: torch.device | str | None = None) -> torch.Tensor:
    """VideoMAE's fixed 1-D sinusoid table over flattened tokens -> (1, num_positions, dim) float32.

    Integer ``arange`` then an explicit cast: under ``zero.Init`` a floating ``arange`` is made in
    the run's dtype (bf16 makes positions 1560..1567 equal).
    """
    pos = torch.arange(num_positions, dtype=torch.int64, device=device).to(torch.float64)[:, None]
    idx = torch.arange(dim, dtype=torch.int64, device=device).to(torch.float64)
    angle = pos / torch.pow(10000.0, 2 * torch.div(idx, 2, rounding_mode="floor") / dim)
    table = torch.empty_like(angle)
    table[:, 0::2] = torch.sin(angle[:, 0::2])
    table[:, 1::2] = torch.cos(angle[:, 1::2])
    return table.float().unsqueeze(0)


class Block(nn.Module):
    """Pre-norm transformer block. Holds no parameters directly (ZeRO-3 + recompute safe)."""

    def __init__(self, arch: ViTArch, drop_path: float, causal: bool = False, token_merge: int | None = None) -> None:
        """``arch``: a ``ViTArch`` or any object with its block fields (the text tower's ``TextArch``).
        ``token_merge``: None when the model does not merge tokens, else the tokens this block merges."""
        super().__init__()
        dim = arch.embed_dim
        self.token_merge = token_merge
        self.class_token = token_merge is not None and arch.pool == "cls"
        self.norm1 = nn.LayerNorm(dim, eps=arch.norm_eps)
        self.attn = Attention(
            dim,
            arch.num_heads,
            qkv_bias=arch.qkv_bias,
            backend=arch.attn_backend,
            k_bias=arch.k_bias,
            causal=causal,
            size_bias=token_merge is not None,
            packed=bool(getattr(arch, "rlt", False)),
        )
        self.ls1 = LayerScale(dim, arch.layer_scale) if arch.layer_scale else nn.Identity()
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.norm2 = nn.LayerNorm(dim, eps=arch.norm_eps)
        self.mlp = Mlp(dim, arch.mlp_hidden, act=arch.act)
        self.ls2 = LayerScale(dim, arch.layer_scale) if arch.layer_scale else nn.Identity()

    def forward(
        self, x: torch.Tensor, size: torch.Tensor | None = None, packed: PackedClips | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor | None]:
        """``x`` (B, N, D) -> (B, N, D); in a model that merges tokens, (tokens, sizes) -> (tokens, sizes);
        with ``packed`` (run-length tokenization), packed tokens (1, total, D) -> (1, total, D)."""
        if packed is not None:
            return self.forward_packed(x, packed)
        if self.token_merge is None:
            x = x + self.drop_path(self.ls1(self.attn(self.norm1(x))))
            return x + self.drop_path(self.ls2(self.mlp(self.norm2(x))))
        return self.forward_merging(x, size)

    def forward_packed(self, x: torch.Tensor, packed: PackedClips) -> torch.Tensor:
        """The block on clips packed end to end (1, total, D): attention per clip, stochastic depth per clip."""
        x = x + self._drop_packed(
            self.ls1(self.attn.forward_packed(self.norm1(x), packed.offsets, packed.max_len, packed.lengths)), packed
        )
        return x + self._drop_packed(self.ls2(self.mlp(self.norm2(x))), packed)

    def _drop_packed(self, y: torch.Tensor, packed: PackedClips) -> torch.Tensor:
        """``DropPath`` of packed tokens: each clip's branch dropped as a whole (timm drops per sample)."""
        p = float(getattr(self.drop_path, "drop_prob", 0.0))
        if not self.training or p <= 0:
            return y
        return packed.drop_path(y, p, bool(getattr(self.drop_path, "scale_by_keep", True)))

    def forward_merging(self, x: torch.Tensor, size: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Attention with the log-size bias (``size`` None: every token is one), merge ``token_merge``
        tokens on its keys, then the MLP -> (tokens, sizes)."""
        bias = None if size is None else size_bias(size, x.dtype)
        out, keys = self.attn.forward_keys(self.norm1(x), bias)
        x = x + self.drop_path(self.ls1(out))
        if self.token_merge:
            x, size = merge_tokens(x, size, keys, self.token_merge, self.class_token)
        return x + self.drop_path(self.ls2(self.mlp(self.norm2(x)))), size


class VideoViT(nn.Module):
    """Video ViT: tubelet embedding -> position embedding -> blocks -> pool -> head(s).

    Input (B, C, T, H, W) float, already normalised. Output (B, K) logits, or a dict of logits
    per head when ``arch.heads`` is set, or pooled features (B, D) when ``num_classes == 0``.
    """

    def __init__(self, arch: ViTArch) -> None:
        super().__init__()
        arch.validate()
        self.arch = arch
        self.embed_dim = arch.embed_dim
        self.depth = arch.depth
        self.num_heads = arch.num_heads
        self.num_frames = arch.num_frames
        self.img_size = arch.img_size
        self.patch_size = arch.patch_size
        self.tubelet_size = arch.tubelet_size
        self.in_chans = arch.in_chans
        self.heads_spec: dict[str, int] | None = dict(arch.heads) if arch.heads else None
        self.num_classes: int | dict[str, int] = self.heads_spec or arch.num_classes

        self.patch_embed = PatchEmbed(
            arch.img_size,
            arch.patch_size,
            arch.tubelet_size,
            arch.num_frames,
            arch.in_chans,
            arch.embed_dim,
            mode=arch.patch_embed,
            bias=arch.patch_embed_bias,
        )
        n = self.patch_embed.num_patches
        frames, side, _ = self.patch_embed.grid
        self.cls_token = nn.Parameter(torch.zeros(1, 1, arch.embed_dim)) if arch.pool == "cls" else None
        self.temporal_embed = None
        if arch.pos_embed == "clip":
            self.pos_embed = nn.Parameter(torch.zeros(1, 1 + side * side, arch.embed_dim))
            if frames > 1:  # zeros at init: a CLIP image model's features are unchanged at first
                self.temporal_embed = nn.Parameter(torch.zeros(1, frames, arch.embed_dim))
        elif arch.pos_embed == "learned":
            self.pos_embed = nn.Parameter(torch.zeros(1, n, arch.embed_dim))
        else:
            self.register_buffer("pos_embed", sincos_table(n, arch.embed_dim), persistent=False)
        self.ln_pre = nn.LayerNorm(arch.embed_dim, eps=arch.norm_eps) if arch.ln_pre else nn.Identity()
        self.rlt_embed = RunLengthEmbedding(frames, arch.embed_dim) if arch.rlt else None
        rates = drop_path_rates(arch.drop_path_rate, arch.depth, arch.drop_path_schedule)
        merge = arch.merge_schedule if arch.merges else [None] * arch.depth
        self.blocks = nn.ModuleList([Block(arch, rate, token_merge=r) for rate, r in zip(rates, merge)])
        # VideoMAE: final norm on tokens for cls pooling; norm after mean pooling (fc_norm) otherwise.
        self.norm = nn.LayerNorm(arch.embed_dim, eps=arch.norm_eps) if arch.pool == "cls" else nn.Identity()
        self.fc_norm = nn.LayerNorm(arch.embed_dim, eps=arch.norm_eps) if arch.pool == "mean" else nn.Identity()
        self.proj = nn.Parameter(torch.zeros(arch.embed_dim, arch.proj_dim)) if arch.proj_dim else None
        self.head_drop = nn.Dropout(arch.head_drop_rate)
        feat = arch.feature_dim
        if self.heads_spec:
            self.head = None
            self.heads = nn.ModuleDict({k: nn.Linear(feat, v) for k, v in self.heads_spec.items()})
        else:
            self.head = nn.Linear(feat, arch.num_classes) if arch.num_classes > 0 else nn.Identity()
            self.heads = None
        self._init_weights()

    # ------------------------------------------------------------------------------------------
    def _init_weights(self) -> None:
        """VideoMAE init: trunc-normal(0.02) linears, unit LayerNorms, classifier scaled down (or AVION's
        classifier init, ``arch.head_init="avion"``: normal(0, 0.01) weights, zero bias).

        Under ``zero.Init`` children are already partitioned here: each one is gathered (all ranks
        draw the same numbers, rank 0's are kept), so the result equals the unpartitioned model.
        """
        for name, m in self.named_modules():
            if name.startswith("patch_embed"):
                continue  # keep PyTorch's default (same for the Conv3d and Linear paths)
            if not isinstance(m, (nn.Linear, nn.LayerNorm)):
                continue
            with gathered(m.parameters(recurse=False)):
                if isinstance(m, nn.Linear):
                    trunc_normal_(m.weight, std=0.02)
                    if m.bias is not None:
                        nn.init.zeros_(m.bias)
                else:
                    nn.init.ones_(m.weight)
                    nn.init.zeros_(m.bias)
        if isinstance(self.pos_embed, nn.Parameter):
            trunc_normal_(self.pos_embed, std=0.02)
        if self.cls_token is not None:
            trunc_normal_(self.cls_token, std=0.02)
        if self.proj is not None:  # CLIP / AVION: normal(0, width^-0.5)
            nn.init.normal_(self.proj, std=self.embed_dim**-0.5)
        with torch.no_grad():
            for head in self._head_modules():
                with gathered(head.parameters(recurse=False)):
                    if self.arch.head_init == "avion":  # AVION's VideoClassifier.fc_cls
                        head.weight.normal_(mean=0.0, std=0.01)
                        head.bias.zero_()
                    else:
                        head.weight.mul_(self.arch.head_init_scale)
                        head.bias.mul_(self.arch.head_init_scale)

    def _head_modules(self) -> list[nn.Linear]:
        if self.heads is not None:
            return list(self.heads.values())
        return [self.head] if isinstance(self.head, nn.Linear) else []

    def check_input(self, x: torch.Tensor) -> None:
        """One-line ValueError unless ``x`` is a float (B, C, T, H, W) clip of this model's shape."""
        expected = (self.in_chans, self.num_frames, self.img_size, self.img_size)
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{self.arch.name}: expected a tensor (B, C, T, H, W), got {type(x).__name__}")
        if x.dim() != 5:
            raise ValueError(
                f"{self.arch.name}: expected a 5-D input (B, C, T, H, W) = (B, {', '.join(map(str, expected))}), "
                f"got shape {tuple(x.shape)}"
            )
        if not x.is_floating_point():
            raise ValueError(f"{self.arch.name}: expected a float (normalised) input, got dtype {x.dtype}")
        if tuple(x.shape[1:]) != expected:
            names = ("channels", "frames", "height", "width")
            bad = [f"{n} {e} got {g}" for n, e, g in zip(names, expected, x.shape[1:]) if e != g]
            raise ValueError(
                f"{self.arch.name}: expected input (B, C, T, H, W) = (B, {', '.join(map(str, expected))}), "
                f"got {tuple(x.shape)} ({'; '.join(bad)})"
            )

    def patch_positions(self) -> torch.Tensor:
        """Position embedding of the patch tokens (1, N, D); CLIP layout: spatial + temporal per frame."""
        if self.arch.pos_embed != "clip":
            return self.pos_embed
        spatial = self.pos_embed[:, 1:]  # (1, h*w, D), entry 0 is the class token's
        if self.temporal_embed is None:
            return spatial
        return (spatial.unsqueeze(1) + self.temporal_embed.unsqueeze(2)).flatten(1, 2)  # time-major

    def drop_patches(self, x: torch.Tensor) -> torch.Tensor:
        """FLIP patch dropout in training: a random ``1 - patch_dropout`` of the patch tokens per clip."""
        p = self.arch.patch_dropout
        if not self.training or p <= 0:
            return x
        B, N, _ = x.shape
        keep = self.arch.kept_patches
        idx = torch.randn(B, N, device=x.device).topk(keep, dim=-1).indices
        rows = torch.arange(B, device=x.device).unsqueeze(1)
        return x[rows, idx]  # indexing saves only the indices for backward (gather would keep all of x)

    def forward_tokens(self, x: torch.Tensor) -> torch.Tensor:
        """Embedded, position-encoded tokens (B, N[+1], D) before the blocks."""
        x = self.patch_embed(x)
        x = self.drop_patches(x + self.patch_positions().to(dtype=x.dtype))
        if self.cls_token is not None:
            cls = self.cls_token
            if self.arch.pos_embed == "clip":
                cls = cls + self.pos_embed[:, :1]
            x = torch.cat((cls.to(x.dtype).expand(x.shape[0], -1, -1), x), dim=1)
        return self.ln_pre(x)

    def forward_features(self, x: torch.Tensor, keep: torch.Tensor | None = None) -> torch.Tensor:
        """Pooled features (B, F): mean over tokens + fc_norm, or the normed class token (CLIP's
        ``ln_post``); projected by ``proj`` when the model has one. ``keep``: run-length tokenization's
        patches to keep (B, T', H', W'); None computes them from ``x`` (a model without RLT takes none)."""
        self.check_input(x)
        if self.rlt_embed is not None:
            return self._rlt_features(x, keep)
        if keep is not None:
            raise ValueError(f"{self.arch.name}: keep= is run-length tokenization's; this model has rlt_threshold=0")
        x = self.forward_tokens(x)
        if self.arch.merges:
            return self._merged_features(x)
        for blk in self.blocks:
            x = blk(x)
        feats = self.norm(x[:, 0]) if self.cls_token is not None else self.fc_norm(x.mean(dim=1))
        return feats @ self.proj.to(feats.dtype) if self.proj is not None else feats

    def rlt_keep(self, x: torch.Tensor) -> torch.Tensor:
        """The patches run-length tokenization keeps of clip ``x`` (B, C, T, H, W): (B, T', H', W') bool,
        by the reference's rule on the normalised float clip (a uint8 clip: scaled by ImageNet's std)."""
        return static_keep_mask(x, self.tubelet_size, self.patch_size, self.arch.rlt_threshold)

    def _rlt_features(self, x: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
        """``forward_features`` with run-length tokenization: the kept tokens of all clips packed end to end."""
        keep = self.rlt_keep(x) if keep is None else keep
        grid = (x.shape[0], *self.patch_embed.grid)
        if tuple(keep.shape) != grid or keep.dtype != torch.bool:
            raise ValueError(f"{self.arch.name}: keep expected bool {grid}, got {keep.dtype} {tuple(keep.shape)}")
        lengths = run_lengths(keep).flatten(1)  # (B, N), 0 where dropped
        keep = keep.flatten(1)
        tokens = self.patch_embed(x)
        tokens = self.rlt_embed(tokens + self.patch_positions().to(dtype=tokens.dtype), lengths)
        if self.cls_token is not None:
            cls = self.cls_token
            if self.arch.pos_embed == "clip":
                cls = cls + self.pos_embed[:, :1]
            tokens = torch.cat((cls.to(tokens.dtype).expand(tokens.shape[0], -1, -1), tokens), dim=1)
            keep = torch.cat((keep.new_ones(keep.shape[0], 1), keep), dim=1)
        tokens = self.ln_pre(tokens)  # per token: the same before or after packing
        packed = PackedClips.from_keep(keep)
        out = tokens[keep].unsqueeze(0)  # (1, total, D): indexing saves only the mask for backward
        for blk in self.blocks:
            out = blk(out, None, packed)
        out = out[0]
        if self.cls_token is not None:
            feats = self.norm(out[packed.offsets[:-1]])
        else:
            feats = self.fc_norm(packed.mean(out))
        return feats @ self.proj.to(feats.dtype) if self.proj is not None else feats

    def _merged_features(self, x: torch.Tensor) -> torch.Tensor:
        """``forward_features`` of a model that merges tokens: sizes through the blocks, mean pooling
        weighted by size (the class token is never merged, so cls pooling is unchanged)."""
        size = None
        for blk in self.blocks:
            x, size = blk(x, size)
        if self.cls_token is not None:
            feats = self.norm(x[:, 0])
        else:
            feats = self.fc_norm(weighted_mean(x, size) if size is not None else x.mean(dim=1))
        return feats @ self.proj.to(feats.dtype) if self.proj is not None else feats

    def forward_head(self, feats: torch.Tensor) -> torch.Tensor | dict[str, torch.Tensor]:
        feats = self.head_drop(feats)
        if self.heads is not None:
            return {k: h(feats) for k, h in self.heads.items()}
        return self.head(feats)

    def forward(self, x: torch.Tensor, keep: torch.Tensor | None = None) -> torch.Tensor | dict[str, torch.Tensor]:
        """Logits (or features) of normalised clips ``x`` (B, C, T, H, W); ``keep``: see ``forward_features``."""
        return self.forward_head(self.forward_features(x, keep))

    # ------------------------------------------------------------------------------------------
    def prepare_checkpoint(
        self, source: str | Path | dict[str, Any], trust: bool = False, *, kinetics_head: bool = False
    ) -> tuple[dict[str, torch.Tensor], LoadReport]:
        """``source`` (our layout, VideoMAE, Hugging Face, timm, a dual encoder's video tower) mapped to
        this model's names and shapes, and a ``LoadReport``: the family's adapter (``vit.weights``)."""
        return prepare_vit_state_dict(self, source, trust, kinetics_head=kinetics_head)

    def no_weight_decay(self) -> set[str]:
        """Names of parameters to exclude from weight decay: biases, norms, q/v bias, LayerScale,
        position embedding and class token (every parameter with fewer than 2 dims, plus tokens)."""
        skip = {"pos_embed", "cls_token", "temporal_embed", "rlt_embed.table.weight"}
        return {n for n, p in self.named_parameters() if full_ndim(p) <= 1 or n in skip or n.endswith(".bias")}

    def layer_id(self, param_name: str) -> int:
        """Layer index for layer-wise lr decay: 0 embeddings, i+1 for blocks.i, depth+1 otherwise."""
        name = param_name.removeprefix("module.")
        if name.startswith(("patch_embed", "pos_embed", "cls_token", "temporal_embed", "ln_pre", "rlt_embed")):
            return 0
        if name.startswith("blocks."):
            return int(name.split(".")[1]) + 1
        return self.depth + 1

    def extra_repr(self) -> str:
        a = self.arch
        return (
            f"name={a.name}, grid={a.grid}, attn={a.attn_backend}, patch_embed={a.patch_embed}, "
            f"pool={a.pool}, pos_embed={a.pos_embed}"
            + (f", token_merge={a.token_merge}" if a.merges else "")
            + (f", rlt_threshold={a.rlt_threshold:g}" if a.rlt else "")
            + (
                f", act={a.act}, proj_dim={a.proj_dim}, patch_dropout={a.patch_dropout}"
                if a.pos_embed == "clip"
                else ""
            )
        )


def count_params(model: nn.Module) -> int:
    """Number of parameters (works on the meta device and on ZeRO-3 partitioned models)."""
    return param_count(model)
