"""VideoMAE-style video Vision Transformer with joint space-time attention.

Parameter names follow the official VideoMAE / VideoMAEv2 fine-tuning code (``patch_embed.proj``,
``blocks.N.attn.{qkv,q_bias,v_bias,proj}``, ``blocks.N.mlp.fc{1,2}``, ``fc_norm``, ``head``) so
their checkpoints load by name; multi-head models use ``heads.<name>``.
"""

from __future__ import annotations

import torch
from timm.layers import DropPath, LayerScale, trunc_normal_
from torch import nn

from avion_ds.models.arch import ViTArch
from avion_ds.models.attention import Attention
from avion_ds.models.mlp import Mlp
from avion_ds.models.partition import full_ndim, gathered, param_count
from avion_ds.models.patch_embed import PatchEmbed


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

    def __init__(self, arch: ViTArch, drop_path: float) -> None:
        super().__init__()
        dim = arch.embed_dim
        self.norm1 = nn.LayerNorm(dim, eps=arch.norm_eps)
        self.attn = Attention(dim, arch.num_heads, qkv_bias=arch.qkv_bias, backend=arch.attn_backend)
        self.ls1 = LayerScale(dim, arch.layer_scale) if arch.layer_scale else nn.Identity()
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.norm2 = nn.LayerNorm(dim, eps=arch.norm_eps)
        self.mlp = Mlp(dim, arch.mlp_hidden)
        self.ls2 = LayerScale(dim, arch.layer_scale) if arch.layer_scale else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop_path(self.ls1(self.attn(self.norm1(x))))
        return x + self.drop_path(self.ls2(self.mlp(self.norm2(x))))


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
        )
        n = self.patch_embed.num_patches
        self.cls_token = nn.Parameter(torch.zeros(1, 1, arch.embed_dim)) if arch.pool == "cls" else None
        if arch.pos_embed == "learned":
            self.pos_embed = nn.Parameter(torch.zeros(1, n, arch.embed_dim))
        else:
            self.register_buffer("pos_embed", sincos_table(n, arch.embed_dim), persistent=False)
        rates = [arch.drop_path_rate * i / max(arch.depth - 1, 1) for i in range(arch.depth)]
        self.blocks = nn.ModuleList([Block(arch, r) for r in rates])
        # VideoMAE: final norm on tokens for cls pooling; norm after mean pooling (fc_norm) otherwise.
        self.norm = nn.LayerNorm(arch.embed_dim, eps=arch.norm_eps) if arch.pool == "cls" else nn.Identity()
        self.fc_norm = nn.LayerNorm(arch.embed_dim, eps=arch.norm_eps) if arch.pool == "mean" else nn.Identity()
        self.head_drop = nn.Dropout(arch.head_drop_rate)
        if self.heads_spec:
            self.head = None
            self.heads = nn.ModuleDict({k: nn.Linear(arch.embed_dim, v) for k, v in self.heads_spec.items()})
        else:
            self.head = nn.Linear(arch.embed_dim, arch.num_classes) if arch.num_classes > 0 else nn.Identity()
            self.heads = None
        self._init_weights()

    # ------------------------------------------------------------------------------------------
    def _init_weights(self) -> None:
        """VideoMAE init: trunc-normal(0.02) linears, unit LayerNorms, classifier scaled down.

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
        with torch.no_grad():
            for head in self._head_modules():
                with gathered(head.parameters(recurse=False)):
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

    def forward_tokens(self, x: torch.Tensor) -> torch.Tensor:
        """Embedded, position-encoded tokens (B, N[+1], D) before the blocks."""
        x = self.patch_embed(x)
        x = x + self.pos_embed.to(dtype=x.dtype)
        if self.cls_token is not None:
            x = torch.cat((self.cls_token.to(x.dtype).expand(x.shape[0], -1, -1), x), dim=1)
        return x

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """Pooled features (B, D): mean over tokens + fc_norm, or the normed class token."""
        self.check_input(x)
        x = self.forward_tokens(x)
        for blk in self.blocks:
            x = blk(x)
        if self.cls_token is not None:
            return self.norm(x[:, 0])
        return self.fc_norm(x.mean(dim=1))

    def forward_head(self, feats: torch.Tensor) -> torch.Tensor | dict[str, torch.Tensor]:
        feats = self.head_drop(feats)
        if self.heads is not None:
            return {k: h(feats) for k, h in self.heads.items()}
        return self.head(feats)

    def forward(self, x: torch.Tensor) -> torch.Tensor | dict[str, torch.Tensor]:
        return self.forward_head(self.forward_features(x))

    # ------------------------------------------------------------------------------------------
    def no_weight_decay(self) -> set[str]:
        """Names of parameters to exclude from weight decay: biases, norms, q/v bias, LayerScale,
        position embedding and class token (every parameter with fewer than 2 dims, plus tokens)."""
        skip = {"pos_embed", "cls_token"}
        return {n for n, p in self.named_parameters() if full_ndim(p) <= 1 or n in skip or n.endswith(".bias")}

    def layer_id(self, param_name: str) -> int:
        """Layer index for layer-wise lr decay: 0 embeddings, i+1 for blocks.i, depth+1 otherwise."""
        name = param_name.removeprefix("module.")
        if name.startswith(("patch_embed", "pos_embed", "cls_token")):
            return 0
        if name.startswith("blocks."):
            return int(name.split(".")[1]) + 1
        return self.depth + 1

    def extra_repr(self) -> str:
        a = self.arch
        return (
            f"name={a.name}, grid={a.grid}, attn={a.attn_backend}, patch_embed={a.patch_embed}, "
            f"pool={a.pool}, pos_embed={a.pos_embed}"
        )


def count_params(model: nn.Module) -> int:
    """Number of parameters (works on the meta device and on ZeRO-3 partitioned models)."""
    return param_count(model)
