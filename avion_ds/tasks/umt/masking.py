"""UMT's masks: ``tube`` / ``random`` drawn loader-side (``avion_ds.data.masking``), ``attention`` drawn on the
device from the teacher's class attention after its forward, as the reference's engine does: per frame,
``torch.multinomial(attn, N)`` orders the N patches (without replacement, by attention), the first
``N - int(N * mask_ratio)`` stay visible."""

from __future__ import annotations

import torch

from avion_ds.data.masking import MaskSpec


def attention_mask(
    attn: torch.Tensor, batch: int, ratio: float, generator: torch.Generator | None = None
) -> torch.Tensor:
    """bool (B, T*N) mask, True = hidden, from the class attention ``attn`` (B*T, N) of each frame."""
    rows, n = attn.shape
    visible = n - int(n * ratio)
    order = torch.multinomial(attn.float(), n, generator=generator)
    mask = torch.ones(rows, n, dtype=torch.bool, device=attn.device)
    mask.scatter_(1, order[:, :visible], False)
    return mask.view(batch, -1)


def loader_masks(grid: tuple[int, int, int], kind: str, ratio: float) -> MaskSpec:
    """The masks the dataset draws per clip: the recipe's tube / random; for ``attention`` a tube mask of the
    same ratio, which the loss replaces on the device (the loader needs a spec to draw)."""
    return MaskSpec(grid, "tube" if kind == "attention" else kind, ratio).validate()
