"""Run-length tokenization (RLT, Choudhury et al., NeurIPS 2024): static patches dropped before the encoder.

The rule is the reference code's (github rccchoudhury/rlt, ``static_token_utils.batched_find_idxs_to_keep``):
a tubelet patch is dropped when the mean absolute difference between the LAST frame of its tubelet and
the FIRST frame of the previous tubelet at the same position, over the patch's pixels and channels of the
normalised clip, is not above ``threshold`` (the paper's default 0.1 on an ImageNet-normalised clip, about
6 grey levels); the first tubelet is always kept. The reference measures the clip the model sees (after
normalisation, flips, erasing and mixing), and so does ``VideoViT`` when its forward is given no mask.
A uint8 clip is scaled to the same units by the normalisation's standard deviation (the mean cancels).
Trailing frames that do not fill a tubelet are ignored, as the patch embedding ignores them (the
reference's slicing fails on such clips).

A dropped patch extends the run of the last kept patch at its position; each kept token carries its run
length in tubelets, which a zero-initialised embedding table adds to the token (the reference's table is
learned from a truncated-normal start and off in its recipes: zero here, so a model that never trained
with RLT gives the same tokens). Kept tokens keep their own position embedding. Clips then hold
different token counts: the blocks run on the kept tokens of all clips packed end to end
(:class:`PackedClips`), attention per clip (``models/attention.py``: ``packed_attention``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

IMAGENET_STD = (0.229, 0.224, 0.225)  # the reference's normalisation


def threshold_problem(value: object) -> str | None:
    """Why ``value`` is not an RLT threshold (a float in [0, 1); 0 is off), or None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "expected a number in [0, 1)"
    if not 0.0 <= float(value) < 1.0:
        return "expected a number in [0, 1) (0 is off)"
    return None


def static_keep_mask(
    frames: torch.Tensor, tubelet: int, patch: int, threshold: float, std: tuple[float, ...] = IMAGENET_STD
) -> torch.Tensor:
    """Which tubelet patches to keep: (B, T', H', W') bool from a clip (B, C, T, H, W).

    ``frames``: the normalised float clip, or uint8 (then divided by 255 and per channel by ``std``,
    which gives the normalised clip's differences). The reference's rule (module doc): keep a patch when
    the mean |last frame of its tubelet - first frame of the previous tubelet| is above ``threshold``.
    """
    b, c, t, h, w = frames.shape
    nt, nh, nw = t // tubelet, h // patch, w // patch
    x = frames[:, :, : nt * tubelet, : nh * patch, : nw * patch].float()
    if frames.dtype == torch.uint8:
        x = x / (255.0 * torch.tensor(std, device=x.device).view(1, c, 1, 1, 1))
    back = x[:, :, 2 * tubelet - 1 :: tubelet]  # the last frame of tubelets 1 .. nt-1
    front = x[:, :, : (nt - 1) * tubelet : tubelet]  # the first frame of tubelets 0 .. nt-2
    diff = F.avg_pool3d((back - front).abs(), (1, patch, patch)).mean(dim=1)  # (B, nt-1, nh, nw)
    keep = torch.ones(b, nt, nh, nw, dtype=torch.bool, device=frames.device)
    keep[:, 1:] = diff > threshold
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

    # zero at start: a checkpoint of the model without RLT loads with this table fresh (RLT without retraining)
    absent_is_fresh = True

    def __init__(self, max_length: int, dim: int) -> None:
        super().__init__()
        # zeros given to the constructor: under ZeRO-3's zero.Init the table is partitioned once built
        self.table = nn.Embedding(max_length + 1, dim, _weight=torch.zeros(max_length + 1, dim))

    def forward(self, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """``tokens`` plus the embedding of ``lengths`` (same leading shape)."""
        return tokens + self.table(lengths.clamp(max=self.table.num_embeddings - 1)).to(tokens.dtype)


@dataclass(frozen=True)
class PackedClips:
    """The layout of clips' kept tokens packed end to end: ``offsets`` (B+1,) int64 start of each clip
    (flash-attn's ``cu_seqlens``), ``clip`` (total,) the clip of each token, ``max_len`` the longest clip,
    ``lengths`` each clip's token count on the host (read once per forward: one device sync, which packing
    the tokens by a boolean mask costs anyway; the blocks then need none)."""

    offsets: torch.Tensor
    clip: torch.Tensor
    max_len: int
    lengths: tuple[int, ...]

    @classmethod
    def from_keep(cls, keep: torch.Tensor) -> PackedClips:
        """The layout of the kept tokens of ``keep`` (B, N) bool, clip after clip."""
        counts = keep.sum(dim=1)
        offsets = torch.zeros(counts.numel() + 1, dtype=torch.long, device=keep.device)
        offsets[1:] = counts.cumsum(0)
        clip = torch.arange(keep.shape[0], device=keep.device).unsqueeze(1).expand_as(keep)[keep]
        lengths = tuple(int(n) for n in counts.tolist())
        return cls(offsets, clip, max(lengths, default=0), lengths)

    @property
    def num_clips(self) -> int:
        return int(self.offsets.numel() - 1)

    def mean(self, x: torch.Tensor) -> torch.Tensor:
        """Mean of packed tokens ``x`` (total, D) per clip -> (B, D), accumulated in float32."""
        sums = torch.zeros(self.num_clips, x.shape[-1], dtype=torch.float32, device=x.device)
        sums.index_add_(0, self.clip, x.float())
        counts = (self.offsets[1:] - self.offsets[:-1]).clamp(min=1).unsqueeze(1)
        return (sums / counts).to(x.dtype)

    def drop_path(self, x: torch.Tensor, drop_prob: float, scale_by_keep: bool = True) -> torch.Tensor:
        """timm's ``DropPath`` per clip on packed tokens ``x`` (1, total, D): a clip's whole branch is dropped."""
        keep_prob = 1.0 - drop_prob
        mask = x.new_empty(self.num_clips).bernoulli_(keep_prob)
        if scale_by_keep and keep_prob > 0:
            mask.div_(keep_prob)
        return x * mask[self.clip].view(1, -1, 1)
