"""Tubelet (t x p x p) patch embedding: Conv3d with kernel == stride, or the same map as a Linear.

The linear path (AVION's "fast conv1") cuts the clip into non-overlapping tubelets with a
reshape/permute and applies one ``nn.Linear``; its weight is the Conv3d weight flattened in
(C, t, p, p) order, so either layout loads into either path exactly (see ``_load_from_state_dict``).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from avion_ds.models.partition import full_shape

MODES = ("linear", "conv")


class PatchEmbed(nn.Module):
    """(B, C, T, H, W) -> (B, N, D) tokens, N = (T/t) * (H/p) * (W/p), ordered (t, h, w)."""

    def __init__(
        self,
        img_size: int,
        patch_size: int,
        tubelet_size: int,
        num_frames: int,
        in_chans: int,
        embed_dim: int,
        mode: str = "linear",
        bias: bool = True,
    ) -> None:
        super().__init__()
        if mode not in MODES:
            raise ValueError(f"patch_embed: expected one of {', '.join(MODES)}, got {mode!r}")
        if img_size % patch_size != 0:
            raise ValueError(f"patch_embed: expected img_size divisible by patch_size {patch_size}, got {img_size}")
        if num_frames % tubelet_size != 0:
            raise ValueError(
                f"patch_embed: expected num_frames divisible by tubelet_size {tubelet_size}, got {num_frames}"
            )
        self.mode = mode
        self.patch_size = patch_size
        self.tubelet_size = tubelet_size
        self.in_chans = in_chans
        self.embed_dim = embed_dim
        self.grid = (num_frames // tubelet_size, img_size // patch_size, img_size // patch_size)
        self.num_patches = self.grid[0] * self.grid[1] * self.grid[2]
        kernel = (tubelet_size, patch_size, patch_size)
        if mode == "linear":
            # nn.Linear's default init has the same fan-in (C*t*p*p) as Conv3d's: same distribution.
            self.proj: nn.Module = nn.Linear(in_chans * tubelet_size * patch_size * patch_size, embed_dim, bias=bias)
        else:
            self.proj = nn.Conv3d(in_chans, embed_dim, kernel_size=kernel, stride=kernel, bias=bias)

    @property
    def conv_weight_shape(self) -> tuple[int, int, int, int, int]:
        return (self.embed_dim, self.in_chans, self.tubelet_size, self.patch_size, self.patch_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.mode == "conv":
            return self.proj(x).flatten(2).transpose(1, 2)
        return self.proj(self.patchify(x))

    def patchify(self, x: torch.Tensor) -> torch.Tensor:
        """(B, C, T, H, W) -> (B, N, C*t*p*p) tubelets in token order, values in (C, t, p, p) order."""
        B, C, T, H, W = x.shape
        t, p = self.tubelet_size, self.patch_size
        x = x.reshape(B, C, T // t, t, H // p, p, W // p, p)
        return x.permute(0, 2, 4, 6, 1, 3, 5, 7).reshape(B, (T // t) * (H // p) * (W // p), C * t * p * p)

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, *args: Any, **kwargs: Any) -> None:
        """Accept the weight in either layout (5-D Conv3d or 2-D Linear) when element counts agree."""
        key = prefix + "proj.weight"
        w = state_dict.get(key)
        shape = full_shape(self.proj.weight)  # ZeRO-3 partitioned: the data is empty, ds_shape is not
        if isinstance(w, torch.Tensor) and w.numel() == math.prod(shape) and w.shape != shape:
            state_dict[key] = w.reshape(shape)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
