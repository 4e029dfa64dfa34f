"""Per-clip crop boxes (sampled ONCE per clip, in Python, from a seeded generator) and the
post-decode fallback crop+resize on uint8 frames.

A clip that spans two chunks uses the same box in both (AVION sampled one per chunk). The
generator is keyed by (seed, epoch, index, view), so any worker produces the same crop.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class CropBox:
    """Pixel box in the source frame."""

    top: int
    left: int
    height: int
    width: int

    def scaled(self, sy: float, sx: float, max_h: int, max_w: int) -> CropBox:
        """The same box on a frame resized by (sy, sx), kept inside (max_h, max_w)."""
        h = max(1, min(max_h, int(round(self.height * sy))))
        w = max(1, min(max_w, int(round(self.width * sx))))
        top = min(max(0, int(round(self.top * sy))), max_h - h)
        left = min(max(0, int(round(self.left * sx))), max_w - w)
        return CropBox(top, left, h, w)


@dataclass(frozen=True)
class CropSpec:
    """What a decoder should return: ``box`` of the (``frame_h``, ``frame_w``) frame resized to ``size``.

    ``box=None`` keeps the whole frame; ``size=None`` keeps the box's size.
    """

    box: CropBox | None
    size: tuple[int, int] | None
    frame_h: int
    frame_w: int

    def for_frame(self, h: int, w: int) -> CropBox:
        """The box on a frame of (h, w) (a chunk may differ from the manifest's size)."""
        box = self.box or CropBox(0, 0, self.frame_h, self.frame_w)
        if (h, w) == (self.frame_h, self.frame_w):
            return box
        return box.scaled(h / self.frame_h, w / self.frame_w, h, w)

    def out_size(self, h: int, w: int) -> tuple[int, int]:
        box = self.for_frame(h, w)
        return self.size or (box.height, box.width)


def clip_rng(seed: int, epoch: int, index: int, view: int = 0) -> np.random.Generator:
    """The generator for one clip: same (seed, epoch, index, view) -> same draws, in any process."""
    return np.random.default_rng([int(seed) & 0xFFFFFFFF, int(epoch), int(index), int(view)])


def random_resized_crop(
    height: int, width: int, scale: tuple[float, float], ratio: tuple[float, float], rng: np.random.Generator
) -> CropBox:
    """RandomResizedCrop box (torchvision's algorithm: 10 tries, then a central fallback)."""
    area = height * width
    log_r = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target = area * rng.uniform(scale[0], scale[1])
        ar = math.exp(rng.uniform(*log_r))
        w = int(round(math.sqrt(target * ar)))
        h = int(round(math.sqrt(target / ar)))
        if 0 < w <= width and 0 < h <= height:
            return CropBox(int(rng.integers(0, height - h + 1)), int(rng.integers(0, width - w + 1)), h, w)
    in_ratio = width / height
    if in_ratio < ratio[0]:
        w, h = width, int(round(width / ratio[0]))
    elif in_ratio > ratio[1]:
        h, w = height, int(round(height * ratio[1]))
    else:
        w, h = width, height
    return CropBox((height - h) // 2, (width - w) // 2, h, w)


def center_crop(height: int, width: int) -> CropBox:
    """Largest centred square (= resize short side to S, centre crop S x S)."""
    s = min(height, width)
    return CropBox((height - s) // 2, (width - s) // 2, s, s)


def three_crops(height: int, width: int) -> list[CropBox]:
    """Three squares of the short side along the long side: start, centre, end (VideoMAE 3-crop)."""
    s = min(height, width)
    if width >= height:
        return [CropBox(0, left, s, s) for left in (0, (width - s) // 2, width - s)]
    return [CropBox(top, 0, s, s) for top in (0, (height - s) // 2, height - s)]


def crop_resize(
    frames: torch.Tensor,
    box: CropBox | None,
    size: tuple[int, int] | None,
    interpolation: str = "bilinear",
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """uint8 (T, H, W, C) -> crop ``box`` -> antialiased resize (bilinear | bicubic) to ``size`` -> uint8 (T, h, w, C).

    ``out``: a contiguous (T, h, w, C) tensor to write the result into (the timeout helper passes one
    over its shared mapping, so the frames are written once, in place); else a new tensor.
    """
    import torch  # lazy: torch is heavy; the decoders and crops load without it (`avion-ds chunk`/`check` workers, probing)

    if box is not None:
        frames = frames[:, box.top : box.top + box.height, box.left : box.left + box.width]
    if size is None or tuple(frames.shape[1:3]) == tuple(size):
        return frames.contiguous() if out is None else out.copy_(frames)
    x = frames.permute(0, 3, 1, 2)  # a channels-last view: torch's fast uint8 antialias kernel, no copy
    if frames.dtype != torch.uint8 or frames.device.type != "cpu":  # e.g. NVDEC frames: torchvision's own path
        from torchvision.transforms.v2 import functional as F  # lazy: torchvision is heavy, for non-CPU frames only

        mode = F.InterpolationMode.BICUBIC if interpolation == "bicubic" else F.InterpolationMode.BILINEAR
        y = F.resize(x, list(size), interpolation=mode, antialias=True).permute(0, 2, 3, 1)
        return y.contiguous() if out is None else out.copy_(y)
    # the op torchvision's resize runs for uint8 CPU images (same kernel, same bits), with an output argument
    op = torch.ops.aten._upsample_bicubic2d_aa if interpolation == "bicubic" else torch.ops.aten._upsample_bilinear2d_aa
    if out is None:
        out = frames.new_empty((frames.shape[0], *size, frames.shape[3]))
    op.out(x, list(size), False, None, None, out=out.permute(0, 3, 1, 2))
    return out


def even_superset(box: CropBox, height: int, width: int) -> tuple[CropBox, CropBox]:
    """(box with even top/left/bottom/right inside the frame, ``box`` relative to it).

    A crop of a 4:2:0 frame at even offsets keeps every pixel's own chroma sample, so converting
    just that region to RGB gives exactly the pixels a full-frame conversion would.
    """
    top, left = box.top - box.top % 2, box.left - box.left % 2
    bottom = min(height, box.top + box.height + (box.top + box.height) % 2)
    right = min(width, box.left + box.width + (box.left + box.width) % 2)
    return (
        CropBox(top, left, bottom - top, right - left),
        CropBox(box.top - top, box.left - left, box.height, box.width),
    )


def multi_scale_crop(
    height: int,
    width: int,
    size: int,
    scales: tuple[float, ...] | list[float],
    rng: np.random.Generator,
    max_distort: int = 1,
) -> CropBox:
    """VideoMAE's GroupMultiScaleCrop box (fix_crop, more_fix_crop): side lengths ``int(short * s)``
    for s in ``scales`` (snapped to ``size`` within 3 px), height and width at most ``max_distort``
    scale steps apart, placed at one of 13 fixed offsets (corners, centre, edge centres, quarters)."""
    base = min(height, width)
    sides = [int(base * s) for s in scales]
    sides = [size if abs(x - size) < 3 else x for x in sides]
    pairs = [(w, h) for i, h in enumerate(sides) for j, w in enumerate(sides) if abs(i - j) <= max_distort]
    crop_w, crop_h = pairs[int(rng.integers(len(pairs)))]
    crop_w, crop_h = min(crop_w, width), min(crop_h, height)
    ws, hs = (width - crop_w) // 4, (height - crop_h) // 4
    offsets = [
        (0, 0),
        (4 * ws, 0),
        (0, 4 * hs),
        (4 * ws, 4 * hs),
        (2 * ws, 2 * hs),
        (0, 2 * hs),
        (4 * ws, 2 * hs),
        (2 * ws, 4 * hs),
        (2 * ws, 0),
        (ws, hs),
        (3 * ws, hs),
        (ws, 3 * hs),
        (3 * ws, 3 * hs),
    ]
    left, top = offsets[int(rng.integers(len(offsets)))]
    return CropBox(top, left, crop_h, crop_w)
