"""CLIP's causal text transformer on the video ViT's blocks (``vit.Block``, the attention switch,
the activation-recompute MLP), so activation checkpointing, ZeRO-3 construction and the memory
planner treat it like the video tower.

Tokens (B, 77) -> token embedding + learned positions -> causal blocks -> the feature of the
end-of-text token (the largest id of each row: CLIP's tokenizer gives it the top id) -> LayerNorm
(CLIP's ``ln_final``; per token, so norming only the pooled token is the same) -> projection.
"""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from avion_ds.models.attention import BACKENDS
from avion_ds.models.mlp import ACTIVATIONS
from avion_ds.models.partition import full_ndim, gathered
from avion_ds.models.vit.model import Block


@dataclass
class TextArch:
    """CLIP text transformer sizes; field names match ``ViTArch``'s so ``vit.Block`` builds from it."""

    name: str = "text"
    embed_dim: int = 512
    depth: int = 12
    num_heads: int = 8
    mlp_ratio: float = 4.0
    context_length: int = 77
    vocab_size: int = 49408
    proj_dim: int | None = 512
    norm_eps: float = 1e-5
    act: str = "gelu"
    attn_backend: str = "auto"
    causal: bool = True
    qkv_bias: bool = True
    k_bias: bool = True
    layer_scale: float | None = None

    @property
    def head_dim(self) -> int:
        return self.embed_dim // self.num_heads

    @property
    def mlp_hidden(self) -> int:
        return int(self.embed_dim * self.mlp_ratio)

    def validate(self) -> TextArch:
        """Raise a one-line ValueError naming the bad field; return self."""
        if self.act not in ACTIVATIONS:
            raise ValueError(f"{self.name}: act expected one of {', '.join(ACTIVATIONS)}, got {self.act!r}")
        if self.attn_backend not in BACKENDS:
            raise ValueError(
                f"{self.name}: attn_backend expected one of {', '.join(BACKENDS)}, got {self.attn_backend!r}"
            )
        for key in ("embed_dim", "depth", "num_heads", "context_length", "vocab_size"):
            if int(getattr(self, key)) <= 0:
                raise ValueError(f"{self.name}: {key} expected a positive integer, got {getattr(self, key)!r}")
        if self.embed_dim % self.num_heads:
            raise ValueError(
                f"{self.name}: expected embed_dim divisible by num_heads, got {self.embed_dim}/{self.num_heads}"
            )
        if self.proj_dim is not None and int(self.proj_dim) <= 0:
            raise ValueError(f"{self.name}: proj_dim expected a positive integer or None, got {self.proj_dim!r}")
        return self

    def replace(self, **overrides: Any) -> TextArch:
        """A copy with ``overrides`` applied; unknown keys raise naming close matches."""
        names = [f.name for f in dataclasses.fields(self)]
        for key in overrides:
            if key not in names:
                close = difflib.get_close_matches(key, names, n=3)
                hint = f"; did you mean {', '.join(close)}?" if close else f"; known: {', '.join(names)}"
                raise TypeError(f"{self.name}: unknown text option {key!r}{hint}")
        return dataclasses.replace(self, **overrides).validate()


class TextTransformer(nn.Module):
    """CLIP text tower: (B, L) int64 token ids -> (B, proj_dim) (or (B, width) without projection)."""

    def __init__(self, arch: TextArch) -> None:
        super().__init__()
        arch.validate()
        self.arch = arch
        self.embed_dim = arch.embed_dim
        self.depth = arch.depth
        self.num_heads = arch.num_heads
        self.context_length = arch.context_length
        self.token_embedding = nn.Embedding(arch.vocab_size, arch.embed_dim)
        self.pos_embed = nn.Parameter(torch.zeros(arch.context_length, arch.embed_dim))
        self.blocks = nn.ModuleList([Block(arch, 0.0, causal=arch.causal) for _ in range(arch.depth)])
        self.norm = nn.LayerNorm(arch.embed_dim, eps=arch.norm_eps)
        self.proj = nn.Parameter(torch.zeros(arch.embed_dim, arch.proj_dim)) if arch.proj_dim else None
        self._init_weights()

    def _init_weights(self) -> None:
        """CLIP's text init: token embedding N(0, 0.02), positions N(0, 0.01), q/k/v N(0, w^-1/2),
        output and fc2 N(0, w^-1/2 (2 L)^-1/2), fc1 N(0, (2 w)^-1/2), zero biases, projection
        N(0, w^-1/2). Children are gathered under ZeRO-3 construction (see ``partition``)."""
        w = self.embed_dim
        proj_std = w**-0.5 * (2 * self.depth) ** -0.5
        stds = {"attn.qkv": w**-0.5, "attn.proj": proj_std, "mlp.fc1": (2 * w) ** -0.5, "mlp.fc2": proj_std}
        with gathered(self.token_embedding.parameters()):
            nn.init.normal_(self.token_embedding.weight, std=0.02)
        nn.init.normal_(self.pos_embed, std=0.01)
        for name, m in self.blocks.named_modules():
            if not isinstance(m, (nn.Linear, nn.LayerNorm)):
                continue
            with gathered(m.parameters(recurse=False)):
                if isinstance(m, nn.LayerNorm):
                    nn.init.ones_(m.weight)
                    nn.init.zeros_(m.bias)
                    continue
                nn.init.normal_(m.weight, std=stds[name.split(".", 1)[1]])
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
        for m in self.blocks.modules():
            if getattr(m, "q_bias", None) is not None:
                with gathered([m.q_bias, m.v_bias]):
                    nn.init.zeros_(m.q_bias)
                    nn.init.zeros_(m.v_bias)
        with gathered(self.norm.parameters()):
            nn.init.ones_(self.norm.weight)
            nn.init.zeros_(self.norm.bias)
        if self.proj is not None:
            nn.init.normal_(self.proj, std=w**-0.5)

    def check_input(self, tokens: torch.Tensor) -> None:
        """One-line ValueError unless ``tokens`` is an integer (B, context_length) tensor."""
        if not isinstance(tokens, torch.Tensor) or tokens.dim() != 2 or tokens.is_floating_point():
            got = tuple(tokens.shape) if isinstance(tokens, torch.Tensor) else type(tokens).__name__
            raise ValueError(f"{self.arch.name}: expected integer token ids (B, {self.context_length}), got {got}")
        if tokens.shape[1] > self.context_length:
            raise ValueError(
                f"{self.arch.name}: expected at most {self.context_length} tokens per text, got {tokens.shape[1]}"
            )

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        self.check_input(tokens)
        n = tokens.shape[1]
        x = self.token_embedding(tokens) + self.pos_embed[:n]
        for blk in self.blocks:
            x = blk(x)
        pooled = x[torch.arange(x.shape[0], device=x.device), tokens.argmax(dim=-1)]
        pooled = self.norm(pooled)
        return pooled @ self.proj.to(pooled.dtype) if self.proj is not None else pooled

    def no_weight_decay(self) -> set[str]:
        """Biases, norms, the position and token embeddings (AVION's exclusions)."""
        skip = {"pos_embed", "token_embedding.weight"}
        return {n for n, p in self.named_parameters() if full_ndim(p) <= 1 or n in skip}

    def layer_id(self, param_name: str) -> int:
        """0 embeddings, i + 1 for blocks.i, depth + 1 otherwise (as ``VideoViT.layer_id``)."""
        name = param_name.removeprefix("module.")
        if name.startswith(("token_embedding", "pos_embed")):
            return 0
        if name.startswith("blocks."):
            return int(name.split(".")[1]) + 1
        return self.depth + 1

    def extra_repr(self) -> str:
        a = self.arch
        return f"name={a.name}, context={a.context_length}, vocab={a.vocab_size}, act={a.act}, causal={a.causal}"
