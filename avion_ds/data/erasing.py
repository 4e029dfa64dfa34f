"""Random erasing of whole clips: one box per clip, erased on every frame (VideoMAE's ``cube`` mode).

VideoMAE fine-tuning erases after normalisation with its ``RandomErasing(cube=True)``: per clip ONE
probability draw and ONE box (up to 100 placement attempts; area a uniform share of the frame in
[min_area, max_area] divided by the box count, aspect ratio log-uniform in [min_aspect,
1 / min_aspect]), and the same box on every frame. In ``pixel`` mode each frame gets its own
normal noise inside the shared box; ``rand`` gives one normal colour per channel and frame,
``const`` zeros. The decisions come from Python's ``random`` in the reference's order (probability,
count, then per attempt area, aspect, top, left), so a seeded run places the same boxes; the noise
comes from torch's generator on the clip's device.
"""

from __future__ import annotations

import math
import random

import torch

MODES = ("pixel", "rand", "const")


class ClipErasing:
    """Callable erasing a batch of clips (B, C, T, H, W) in place, one box per clip on every frame."""

    def __init__(
        self,
        probability: float = 0.25,
        mode: str = "pixel",
        min_area: float = 0.02,
        max_area: float = 1 / 3,
        min_aspect: float = 0.3,
        max_aspect: float | None = None,
        min_count: int = 1,
        max_count: int | None = None,
        attempts: int = 100,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"random erasing mode {mode!r} is not one of {', '.join(MODES)}")
        if not 0.0 <= probability <= 1.0:
            raise ValueError(f"random erasing probability {probability} must be in [0, 1]")
        self.probability, self.mode, self.attempts = probability, mode, attempts
        self.area = (min_area, max_area)
        self.log_aspect = (math.log(min_aspect), math.log(max_aspect or 1 / min_aspect))
        self.count = (min_count, max_count or min_count)

    def boxes(self, height: int, width: int) -> list[tuple[int, int, int, int]]:
        """The (top, left, h, w) boxes of one clip (none when the probability draw says so)."""
        if random.random() > self.probability:
            return []
        lo, hi = self.count
        count = lo if lo == hi else random.randint(lo, hi)
        out = []
        for _ in range(count):
            for _ in range(self.attempts):
                target = random.uniform(*self.area) * height * width / count
                aspect = math.exp(random.uniform(*self.log_aspect))
                h, w = int(round(math.sqrt(target * aspect))), int(round(math.sqrt(target / aspect)))
                if w < width and h < height:
                    out.append((random.randint(0, height - h), random.randint(0, width - w), h, w))
                    break
        return out

    def erase_clip(self, clip: torch.Tensor) -> torch.Tensor:
        """Erase one clip (C, T, H, W) in place: its boxes on every frame; returns it."""
        c, t, height, width = clip.shape
        for top, left, h, w in self.boxes(height, width):
            region = clip[:, :, top : top + h, left : left + w]
            if self.mode == "pixel":  # fresh noise per frame (and pixel) inside the shared box
                region.copy_(torch.empty((c, t, h, w), dtype=clip.dtype, device=clip.device).normal_())
            elif self.mode == "rand":  # one colour per channel and frame
                region.copy_(
                    torch.empty((c, t, 1, 1), dtype=clip.dtype, device=clip.device).normal_().expand(c, t, h, w)
                )
            else:
                region.zero_()
        return clip

    def __call__(self, clips: torch.Tensor) -> torch.Tensor:
        if clips.dim() != 5:
            raise ValueError(f"ClipErasing expects clips (B, C, T, H, W), got {tuple(clips.shape)}")
        for clip in clips:
            self.erase_clip(clip)
        return clips
