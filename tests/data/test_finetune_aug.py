"""VideoMAE fine-tuning augmentation: clip-consistent RandAugment, random erasing, repeated augmentation, bicubic."""

from __future__ import annotations

import random
from dataclasses import replace

import numpy as np
import pytest
import torch
from torchvision.transforms.v2 import functional as TF

from avion_ds.config import DataConfig
from avion_ds.data import build_dataset
from avion_ds.data.augment import DeviceAugment
from avion_ds.data.crop import clip_rng, crop_resize, random_resized_crop
from avion_ds.data.prep.manifest_index import load_manifest
from avion_ds.data.randaug import ClipRandAugment, parse_rand_aug
from avion_ds.data.sampling import map_to_chunks, stride_indices

SPEC = "rand-m7-n4-mstd0.5-inc1"


def _image(seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    base = torch.randint(0, 256, (1, 8, 8, 3), generator=g, dtype=torch.uint8).float()
    return (
        torch.nn.functional.interpolate(base.permute(0, 3, 1, 2), size=(48, 48), mode="bilinear")[0]
        .permute(1, 2, 0)
        .round()
        .to(torch.uint8)
    )  # smooth, so geometric ops change it visibly


def test_randaugment_applies_the_same_ops_to_every_frame() -> None:
    ra = ClipRandAugment(SPEC, 48, "bicubic")
    clip = _image().expand(8, -1, -1, -1).contiguous()
    state = random.getstate(), np.random.get_state()[1].copy()
    changed = 0
    for seed in range(12):
        out = ra(clip, seed)
        assert out.shape == clip.shape and out.dtype == torch.uint8
        assert all(torch.equal(out[0], out[t]) for t in range(1, 8)), seed  # one draw for the whole clip
        changed += not torch.equal(out, clip)
        assert torch.equal(ra(clip, seed), out)  # the clip's seed decides
    assert changed >= 10
    outs = {ra(clip, s)[0].numpy().tobytes() for s in range(12)}
    assert len(outs) >= 8  # different clips get different draws
    assert random.getstate() == state[0] and np.array_equal(np.random.get_state()[1], state[1])  # globals kept


def test_randaugment_per_frame_reference_differs() -> None:
    """The naive per-frame application (timm's transform called per frame) would NOT be consistent."""
    from PIL import Image

    t = parse_rand_aug(SPEC, 48, "bicubic")
    img = Image.fromarray(_image().numpy())
    random.seed(0)
    np.random.seed(0)
    frames = [np.asarray(t(img)) for _ in range(8)]
    assert any(not np.array_equal(frames[0], f) for f in frames[1:])


def test_bad_rand_aug_spec_is_one_line() -> None:
    from avion_ds.config import ConfigError
    from avion_ds.tasks import load_recipe

    with pytest.raises(ConfigError, match=r"data.rand_aug='autoaug': not a RandAugment spec"):
        load_recipe(None, ["data.dataset=kinetics", "data.rand_aug=autoaug"])
    with pytest.raises(ConfigError, match=r"data.reprob=1.5 must be in \[0, 1\]"):
        load_recipe(None, ["data.dataset=kinetics", "data.reprob=1.5"])


def _videomae_cube_boxes(clips: torch.Tensor, prob: float) -> list[tuple[int, int, int, int] | None]:
    """Reference: VideoMAE's RandomErasing(cube=True, mode='pixel', count 1) on each clip (T, C, H, W) in
    turn, written from its procedure (random.random() > prob skips the clip; up to 100 attempts of
    area uniform(0.02, 1/3) * H * W, aspect exp(uniform(log 0.3, log 1/0.3)), h = round(sqrt(area *
    aspect)), w = round(sqrt(area / aspect)), accepted when w < W and h < H, then top = randint(0,
    H - h), left = randint(0, W - w)); the box, or None when the clip is left alone."""
    import math

    out = []
    for clip in clips:
        _, _, hh, ww = clip.shape
        if random.random() > prob:
            out.append(None)
            continue
        box = None
        for _ in range(100):
            area = random.uniform(0.02, 1 / 3) * hh * ww
            aspect = math.exp(random.uniform(math.log(0.3), math.log(1 / 0.3)))
            h, w = int(round(math.sqrt(area * aspect))), int(round(math.sqrt(area / aspect)))
            if w < ww and h < hh:
                box = (random.randint(0, hh - h), random.randint(0, ww - w), h, w)
                break
        out.append(box)
    return out


def _erased_boxes(x: torch.Tensor, clean: torch.Tensor) -> list[list[tuple[int, int, int, int] | None]]:
    """Per clip and frame: the bounding box (top, left, h, w) of the changed pixels, or None."""
    out = []
    for b in range(x.shape[0]):
        frames = []
        for t in range(x.shape[2]):
            diff = (x[b, :, t] != clean[b, :, t]).any(0)
            if not diff.any():
                frames.append(None)
                continue
            rows, cols = diff.any(1).nonzero().flatten(), diff.any(0).nonzero().flatten()
            r0, r1, c0, c1 = int(rows.min()), int(rows.max()), int(cols.min()), int(cols.max())
            assert diff[r0 : r1 + 1, c0 : c1 + 1].float().mean() > 0.99  # one filled rectangle
            frames.append((r0, c0, r1 - r0 + 1, c1 - c0 + 1))
        out.append(frames)
    return out


def test_random_erasing_is_one_box_per_clip_as_videomae() -> None:
    """VideoMAE erases ONE box per clip (its cube mode) on every frame, with fresh noise per frame."""
    cfg = DataConfig(size=32, hflip=0.0, mixup=0.0, cutmix=0.0, reprob=0.5)
    g = torch.Generator().manual_seed(0)
    frames = torch.randint(0, 256, (40, 4, 32, 32, 3), generator=g, dtype=torch.uint8)
    labels = torch.zeros(40, dtype=torch.long)
    clean, _ = DeviceAugment(replace(cfg, reprob=0.0), 5, train=True)(frames, labels)
    ev, _ = DeviceAugment(cfg, 5, train=False)(frames, labels)
    assert torch.equal(ev, clean)  # training only
    saved = random.getstate()
    random.seed(11)
    x, _ = DeviceAugment(cfg, 5, train=True)(frames, labels)
    random.seed(11)
    want = _videomae_cube_boxes(clean.transpose(1, 2), 0.5)  # the reference's (T, C, H, W) clips
    random.setstate(saved)
    got = _erased_boxes(x, clean)
    for b, frame_boxes in enumerate(got):
        assert all(f == frame_boxes[0] for f in frame_boxes), (b, frame_boxes)  # the same box on every frame
        assert frame_boxes[0] == want[b], (b, frame_boxes[0], want[b])  # seeded: the reference's boxes
        if want[b] is not None:
            top, left, h, w = want[b]
            region = x[b, :, :, top : top + h, left : left + w]
            assert not torch.equal(region[:, 0], region[:, 1])  # fresh noise per frame
            assert abs(float(region.mean())) < 0.5 and 0.6 < float(region.std()) < 1.4  # normal noise
            assert torch.equal(x[b, :, :, :top], clean[b, :, :, :top])  # nothing outside the box
    assert 8 <= sum(w is not None for w in want) <= 32


def test_random_erasing_rate_and_box_sizes() -> None:
    """Fraction of erased clips ~ reprob (0.25, VideoMAE's default); boxes cover 2%..33% of the frame."""
    from avion_ds.data.erasing import ClipErasing

    n, hw = 4000, 32
    erase = ClipErasing(probability=0.25)
    clips = torch.zeros(n, 1, 3, hw, hw)
    saved = random.getstate()
    random.seed(3)
    erase(clips)
    random.setstate(saved)
    per_frame = clips.ne(0).any(1).flatten(2).any(2)  # (n, T): frame erased
    assert torch.equal(per_frame.all(1), per_frame.any(1))  # a clip is erased on all its frames or none
    rate = float(per_frame[:, 0].float().mean())
    assert abs(rate - 0.25) < 4 * (0.25 * 0.75 / n) ** 0.5, rate
    area = clips[:, 0, 0].ne(0).flatten(1).float().mean(1)[per_frame[:, 0]]  # share of the frame erased
    assert float(area.min()) > 0.015 and float(area.max()) < 0.36


def test_repeated_augmentation_decodes_once_and_gives_views(index_chunks, tmp_path, monkeypatch, decode_all) -> None:
    lst = tmp_path / "l.txt"
    lst.write_text("idx.mp4 1\n")
    cfg = DataConfig(
        dataset="kinetics",
        root=str(index_chunks),
        train_csv=str(lst),
        val_csv=str(lst),
        num_frames=4,
        sampling="stride",
        stride=2,
        size=32,
        decode_timeout_s=0.0,
        num_sample=3,
        interpolation="bicubic",
    )
    ds = build_dataset(cfg, "train", seed=5)
    calls = []
    real = type(ds.decoder).decode
    monkeypatch.setattr(
        type(ds.decoder), "decode", lambda self, p, ind, crop=None: calls.append(crop) or real(self, p, ind, crop)
    )
    item = ds[0]
    assert item["frames"].shape == (3, 4, 32, 32, 3)
    assert all(c.box is None and c.size is None for c in calls)  # whole frames decoded once, cropped 3 times
    assert not torch.equal(item["frames"][0], item["frames"][1])
    # independent reference: PyAV frames of the same indices, cropped with the same boxes, bicubic
    rng = clip_rng(5, 0, 0, 0)
    entry = load_manifest(index_chunks)["idx"]
    idx = stride_indices(0, entry.num_frames, 4, 2, train=True, rng=rng)
    ref = decode_all(index_chunks.parent / "src" / "idx.mp4")[idx]
    assert len(calls) == len(map_to_chunks(idx, entry))  # one read per chunk, not one per view
    for s in range(3):
        box = random_resized_crop(72, 96, (0.5, 1.0), (0.75, 1.3333333), rng)
        want = TF.resize(
            ref[:, box.top : box.top + box.height, box.left : box.left + box.width].permute(0, 3, 1, 2),
            [32, 32],
            interpolation=TF.InterpolationMode.BICUBIC,
            antialias=True,
        ).permute(0, 2, 3, 1)
        assert (item["frames"][s].float() - want.float()).abs().mean() < 4.0, s
    # the device side repeats labels per view
    x, y = DeviceAugment(cfg, 2, train=True)(item["frames"][None], torch.tensor([1]))
    assert x.shape == (3, 3, 4, 32, 32) and y.tolist() == [1, 1, 1]


def test_bicubic_crop_resize_matches_torchvision() -> None:
    f = _image().expand(2, -1, -1, -1).contiguous()
    got = crop_resize(f, None, (20, 20), "bicubic")
    want = TF.resize(
        f.permute(0, 3, 1, 2), [20, 20], interpolation=TF.InterpolationMode.BICUBIC, antialias=True
    ).permute(0, 2, 3, 1)
    assert torch.equal(got, want)
    assert not torch.equal(crop_resize(f, None, (20, 20)), got)
