"""Run-length tokenization (RLT, Choudhury et al., NeurIPS 2024): static patches dropped before the encoder.

A tubelet patch whose pixels barely change from the same patch in the previous tubelet (mean absolute
difference on the [0, 1] scale below ``threshold``; the paper's default is 0.1) repeats what the
encoder already saw, so it is dropped; the first tubelet's patches are always kept. A dropped patch
extends the run of the last kept patch at its position, and each kept token carries its run length
(in tubelets), which a zero-initialised embedding table adds to the token: a model that never trained
with RLT gives the same token for a run of length 1. Kept tokens keep their own position embedding.
Clips then hold different token counts, so attention runs on packed (jagged) sequences without padding.

The keep mask is computed from the decoded uint8 clip, before normalisation, so the threshold means
the same thing whatever the normalisation is. Trailing frames that do not fill a tubelet are ignored,
as the patch embedding's strided convolution ignores them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def threshold_problem(value: object) -> str | None:
    """Why ``value`` is not an RLT threshold (a float in [0, 1); 0 is off), or None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "expected a number in [0, 1)"
    if not 0.0 <= float(value) < 1.0:
        return "expected a number in [0, 1) (0 is off)"
    return None


def static_keep_mask(frames: torch.Tensor, tubelet: int, patch: int, threshold: float) -> torch.Tensor:
    """Which tubelet patches to keep: (B, T', H', W') bool from uint8 ``frames`` (B, C, T, H, W).

    A patch is dropped when the mean absolute difference of its pixels (scaled to [0, 1]) from the same
    patch of the previous tubelet is below ``threshold``; the first tubelet is always kept.
    """
    b, c, t, h, w = frames.shape
    nt, nh, nw = t // tubelet, h // patch, w // patch
    x = frames[:, :, : nt * tubelet, : nh * patch, : nw * patch].float() / 255.0
    x = x.reshape(b, c, nt, tubelet, nh, patch, nw, patch)
    diff = (x[:, :, 1:] - x[:, :, :-1]).abs().mean(dim=(1, 3, 5, 7))  # (B, T'-1, H', W')
    keep = torch.ones(b, nt, nh, nw, dtype=torch.bool, device=frames.device)
    keep[:, 1:] = diff >= threshold
    return keep


def run_lengths(keep: torch.Tensor) -> torch.Tensor:
    """The run length (in tubelets) of each kept patch of ``keep`` (B, T', ...); 0 where dropped.

    A kept patch's run is itself plus the dropped patches that follow it at the same position.
    """
    lengths = torch.zeros(keep.shape, dtype=torch.long, device=keep.device)
    pending = torch.zeros_like(lengths[:, 0])
    for i in range(keep.shape[1] - 1, -1, -1):
        pending = pending + 1
        lengths[:, i] = torch.where(keep[:, i], pending, torch.zeros_like(pending))
        pending = torch.where(keep[:, i], torch.zeros_like(pending), pending)
    return lengths


class RunLengthEmbedding(nn.Module):
    """A learned embedding of run length added to each kept token; zero at start, so runs of 1 are a no-op."""

    def __init__(self, max_length: int, dim: int) -> None:
        super().__init__()
        self.table = nn.Embedding(max_length + 1, dim)
        nn.init.zeros_(self.table.weight)

    def forward(self, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """``tokens`` plus the embedding of ``lengths`` (same leading shape)."""
        return tokens + self.table(lengths.clamp(max=self.table.num_embeddings - 1))


def pack_kept(tokens: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """The kept tokens of ``tokens`` (B, N, D) under ``keep`` (B, N) as a jagged nested tensor (B, j, D)."""
    counts = keep.sum(dim=1)
    offsets = torch.zeros(counts.numel() + 1, dtype=torch.long, device=tokens.device)
    offsets[1:] = counts.cumsum(0)
    return torch.nested.nested_tensor_from_jagged(tokens[keep], offsets)


def packed_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Attention over jagged sequences, each clip attending only to its own tokens.

    ``q``, ``k``, ``v``: nested (B, heads, j, head_dim) built by ``transpose(1, 2)`` of (B, j, heads,
    head_dim). Uses flash-attn's varlen kernel when the tensors are on CUDA and it is installed,
    SDPA on nested jagged tensors otherwise.
    """
    if q.is_cuda and _flash_varlen() is not None:
        return _flash_packed(q, k, v)
    return F.scaled_dot_product_attention(q, k, v)


def _flash_varlen() -> object | None:
    """flash-attn's varlen kernel, or None where flash-attn is not installed."""
    try:
        from flash_attn import flash_attn_varlen_func  # lazy: optional (the [gpu] extra)
    except ImportError:
        return None
    return flash_attn_varlen_func


def _flash_packed(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """flash-attn varlen on the values of jagged (B, heads, j, head_dim) tensors (not tested here)."""
    fn = _flash_varlen()
    assert callable(fn)
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))  # (B, j, heads, hd), ragged dim 1
    offsets = qt.offsets().to(torch.int32)
    longest = int((offsets[1:] - offsets[:-1]).max())
    out = fn(qt.values(), kt.values(), vt.values(), offsets, offsets, longest, longest)
    return torch.nested.nested_tensor_from_jagged(out, qt.offsets()).transpose(1, 2)
