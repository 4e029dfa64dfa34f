"""What timm 0.6.12's ``Mixup`` does with AVION's 5-D clips (B, C, T, H, W): the CutMix box is drawn for
(H, W) (``img_shape[-2:]``) but pasted with ``x[:, :, yl:yh, xl:xh]``, i.e. onto (T, H). Re-implements
timm 0.6.12 ``rand_bbox`` / ``cutmix_bbox_and_lam`` (Apache-2.0) and counts, over many draws, how often the
paste is empty and how far the label weight is from the pasted fraction; ours cuts the (H, W) box on
every frame, so its pasted fraction is the label weight. Numpy only, deterministic (seed 0).

    python bench/cutmix_5d.py [--frames 16] [--size 224] [--draws 200000]
"""

from __future__ import annotations

import argparse

import numpy as np


def timm_0612_bbox(rng: np.random.Generator, h: int, w: int, lam: float) -> tuple[int, int, int, int, float]:
    """timm 0.6.12 rand_bbox (margin 0) + cutmix_bbox_and_lam(correct_lam=True): (yl, yh, xl, xh, lam)."""
    ratio = np.sqrt(1 - lam)
    cut_h, cut_w = int(h * ratio), int(w * ratio)
    cy, cx = rng.integers(0, h), rng.integers(0, w)
    yl, yh = np.clip(cy - cut_h // 2, 0, h), np.clip(cy + cut_h // 2, 0, h)
    xl, xh = np.clip(cx - cut_w // 2, 0, w), np.clip(cx + cut_w // 2, 0, w)
    return int(yl), int(yh), int(xl), int(xh), 1.0 - (yh - yl) * (xh - xl) / float(h * w)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--frames", type=int, default=16)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--draws", type=int, default=200_000)
    a = p.parse_args()
    rng = np.random.default_rng(0)
    t, s = a.frames, a.size
    empty, gap, gap_ours, label = 0, [], [], []
    for _ in range(a.draws):
        lam = rng.beta(1.0, 1.0)  # cutmix_alpha 1.0 (AVION CLS)
        yl, yh, xl, xh, lam_c = timm_0612_bbox(rng, s, s, lam)
        # AVION: x[:, :, yl:yh, xl:xh] on (B, C, T, H, W) -> frames [yl, yh) ∩ [0, T), rows [xl, xh)
        pasted = max(0, min(yh, t) - min(yl, t)) * (xh - xl) / float(t * s)
        empty += pasted == 0.0
        gap.append(abs((1.0 - lam_c) - pasted))
        gap_ours.append(0.0)  # ours: the (H, W) box on every frame, pasted area fraction = 1 - lam_c exactly
        label.append(1.0 - lam_c)
    print(
        f"clips {t}x{s}x{s}, {a.draws} CutMix draws (timm 0.6.12 rule on 5-D input): "
        f"paste nothing {empty / a.draws:.1%}; mean label weight of the pasted clip {np.mean(label):.3f}, "
        f"mean |label weight - pasted fraction| {np.mean(gap):.3f} (ours {np.mean(gap_ours):.3f})"
    )


if __name__ == "__main__":
    main()
