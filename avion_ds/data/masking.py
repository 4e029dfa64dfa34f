"""Token masks for masked-video pretraining, drawn per clip from the seeded clip generator.

Generators follow VideoMAE / VideoMAE V2's ``masking_generator.py`` exactly, with numpy's global RNG
replaced by the clip's ``np.random.Generator`` (so any DataLoader worker draws the same mask):

* ``tube``: one spatial mask of ``int(ratio * H * W)`` hidden patches, repeated over all T slices;
* ``random``: ``int(ratio * T * H * W)`` hidden tokens anywhere;
* ``running_cell`` (V2 decoder mask): a 2x2 cell holding ``int(4 * ratio)`` ones, tiled over
  space; its pattern shifts by one position per time slice ("running"); one of the
  ``cell size`` start offsets is drawn per clip.

All return bool (T*H*W,) arrays in token order (t, h, w), True = masked. The encoder hides its
mask's True tokens; the V2 decoder reconstructs the tokens where the running-cell mask is False.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

ENCODER_MASKS = ("tube", "random")
DECODER_MASKS = ("none", "running_cell")
Grid = tuple[int, int, int]


def tube_mask(grid: Grid, ratio: float, rng: np.random.Generator) -> np.ndarray:
    """VideoMAE tube masking: the same ``int(ratio * H * W)`` patches hidden in every time slice."""
    t, h, w = grid
    per_frame = h * w
    n = int(ratio * per_frame)
    frame = np.hstack([np.zeros(per_frame - n), np.ones(n)])
    rng.shuffle(frame)
    return np.tile(frame, (t, 1)).reshape(-1).astype(bool)


def random_mask(grid: Grid, ratio: float, rng: np.random.Generator) -> np.ndarray:
    """Uniform random masking of ``int(ratio * N)`` tokens."""
    total = grid[0] * grid[1] * grid[2]
    n = int(ratio * total)
    mask = np.hstack([np.zeros(total - n), np.ones(n)])
    rng.shuffle(mask)
    return mask.astype(bool)


@functools.lru_cache(maxsize=16)
def running_cell_maps(grid: Grid, ratio: float) -> np.ndarray:
    """All ``cell size`` running-cell masks (S, T, H*W) as VideoMAE V2 precomputes them (cached, read-only)."""
    t, h, w = grid
    masked = int(4 * ratio)
    if not 0 < masked < 4:
        raise ValueError(f"running_cell: ratio {ratio} gives {masked} of 4 cell positions masked; need 1..3")
    if h % 2 or w % 2:
        raise ValueError(f"running_cell: the token grid's height and width must be even, got {h}x{w}")
    queue = np.hstack([np.ones(masked), np.zeros(4 - masked)])
    size = 4
    maps = []
    for start in range(size):
        ptr, frames = start, []
        for _ in range(t):
            ptr += 1  # run_cell
            cell = queue[(np.arange(size) + ptr) % size].reshape(2, 2)
            frames.append(np.tile(cell, [h // 2, w // 2]).reshape(-1))
        maps.append(np.stack(frames))
    out = np.stack(maps).astype(bool)
    out.flags.writeable = False
    return out


def running_cell_mask(grid: Grid, ratio: float, rng: np.random.Generator) -> np.ndarray:
    """VideoMAE V2 running-cell mask: one of the precomputed start offsets, drawn from ``rng``."""
    maps = running_cell_maps(grid, ratio)
    return maps[int(rng.integers(len(maps)))].reshape(-1).copy()


@dataclass(frozen=True)
class MaskSpec:
    """How to mask one clip: encoder mask type/ratio, optional V2 decoder mask type/ratio."""

    grid: Grid
    kind: str = "tube"
    ratio: float = 0.9
    decoder: str = "none"
    decoder_ratio: float = 0.5

    def validate(self) -> MaskSpec:
        if self.kind not in ENCODER_MASKS:
            raise ValueError(f"mask type {self.kind!r} is not one of {', '.join(ENCODER_MASKS)}")
        if self.decoder not in DECODER_MASKS:
            raise ValueError(f"decoder mask type {self.decoder!r} is not one of {', '.join(DECODER_MASKS)}")
        if not 0.0 < self.ratio < 1.0:
            raise ValueError(f"mask ratio {self.ratio} must be in (0, 1)")
        if self.decoder != "none":
            running_cell_maps(self.grid, self.decoder_ratio)  # raises on a bad ratio / odd grid
        return self

    def draw(self, rng: np.random.Generator) -> dict[str, np.ndarray]:
        """{"mask": bool (N,)} plus {"decode_mask": bool (N,)} under dual masking."""
        fn = tube_mask if self.kind == "tube" else random_mask
        out = {"mask": fn(self.grid, self.ratio, rng)}
        if self.decoder == "running_cell":
            out["decode_mask"] = running_cell_mask(self.grid, self.decoder_ratio, rng)
        return out
