"""RandAugment for clips: timm's ``rand_augment_transform``, the SAME ops and magnitudes on every frame.

timm's RandAugment draws its ops from ``np.random`` and each op's probability / magnitude from
``random``. A clip is augmented by seeding both from the clip's generator, then restoring that
state before every frame, so all frames of a clip see identical draws (VideoMAE applies one
RandAugment per clip the same way). The global generator states are restored afterwards.
Hyper-parameters follow VideoMAE's ``create_random_augment``: translate 0.45 x the crop size,
the recipe's interpolation (bicubic in VideoMAE) for the geometric ops.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch


def parse_rand_aug(spec: str, size: int, interpolation: str = "bicubic") -> Any:
    """timm RandAugment for ``spec`` (e.g. ``rand-m7-n4-mstd0.5-inc1``); ValueError if it is not one."""
    from timm.data.auto_augment import rand_augment_transform  # lazy: timm is heavy, for data.rand_aug only
    from timm.data.transforms import str_to_pil_interp  # lazy: timm is heavy, for data.rand_aug only

    if not spec.startswith("rand-") and spec != "rand":
        raise ValueError("not a RandAugment spec (expected e.g. rand-m7-n4-mstd0.5-inc1)")
    hparams = {"translate_const": int(size * 0.45), "interpolation": str_to_pil_interp(interpolation)}
    try:
        return rand_augment_transform(spec, hparams)
    except (AssertionError, KeyError, ValueError, TypeError) as e:
        raise ValueError(f"timm rejects it ({type(e).__name__}: {e})") from None


class ClipRandAugment:
    """Callable ``(uint8 (T, H, W, C), seed) -> uint8 (T, H, W, C)`` with one draw per clip."""

    def __init__(self, spec: str, size: int, interpolation: str = "bicubic") -> None:
        self.spec = spec
        self.transform = parse_rand_aug(spec, size, interpolation)

    def __call__(self, frames: torch.Tensor, seed: int) -> torch.Tensor:
        from PIL import Image  # lazy: Pillow, needed only when RandAugment runs

        saved = random.getstate(), np.random.get_state()
        try:
            random.seed(seed)
            np.random.seed(seed % 2**32)
            start = random.getstate(), np.random.get_state()
            out = []
            for frame in frames.numpy():
                random.setstate(start[0])
                np.random.set_state(start[1])
                out.append(np.asarray(self.transform(Image.fromarray(frame)), dtype=np.uint8))
        finally:
            random.setstate(saved[0])
            np.random.set_state(saved[1])
        return torch.from_numpy(np.stack(out))
