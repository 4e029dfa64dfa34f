"""UMT's masks: ``tube`` / ``random`` drawn loader-side (``avion_ds.data.masking``), ``attention`` drawn on the
device from the teacher's class attention after its forward, as the reference's engine does: per frame,
``torch.multinomial(attn, N)`` orders the N patches (without replacement, by attention), the first
``N - int(N * mask_ratio)`` stay visible."""

from __future__ import annotations

import numpy as np
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


def seeded_attention_mask(attn: torch.Tensor, seeds: list[int], ratio: float) -> torch.Tensor:
    """:func:`attention_mask` clip by clip, each clip's frames drawn from a generator seeded by its own seed
    (``seeds``, one per clip, from the loader's per-clip stream): the mask a clip gets depends on the clip, the
    epoch and the recipe's seed alone, not on which rank or batch it lands in, so an elastic resume on another
    world size draws what the uninterrupted run drew."""
    frames = attn.shape[0] // len(seeds)
    gen = torch.Generator(device=attn.device)
    masks = []
    for b, seed in enumerate(seeds):
        gen.manual_seed(int(seed))
        masks.append(attention_mask(attn[b * frames : (b + 1) * frames], 1, ratio, gen))
    return torch.cat(masks)


class DeviceDrawnMask(MaskSpec):
    """The loader's stand-in for a mask drawn on the device (``attention``): an all-visible bool (N,) per
    clip (the loss replaces it), so the batch keeps the ``mask`` entry the collate expects, and ``mask_seed``:
    the clip's seed for that draw, from the clip's own random stream (:func:`seeded_attention_mask`)."""

    def draw(self, rng: np.random.Generator) -> dict[str, np.ndarray]:
        return {
            "mask": np.zeros(self.grid[0] * self.grid[1] * self.grid[2], dtype=bool),
            "mask_seed": np.asarray(rng.integers(0, 2**62), dtype=np.int64),
        }


def loader_masks(grid: tuple[int, int, int], kind: str, ratio: float) -> MaskSpec:
    """The masks the dataset draws per clip: the recipe's tube / random; for ``attention`` none
    (:class:`DeviceDrawnMask`: the loss draws it on the device from the teacher's class attention)."""
    if kind == "attention":
        return DeviceDrawnMask(grid, "tube", ratio).validate()
    return MaskSpec(grid, kind, ratio).validate()
