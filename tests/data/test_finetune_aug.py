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
from avion_ds.data.manifest import load_manifest
from avion_ds.data.randaug import ClipRandAugment, parse_rand_aug
from avion_ds.data.sampling import map_to_chunks, stride_indices

SPEC = "rand-m7-n4-mstd0.5-inc1"


def _image(seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    base = torch.randint(0, 256, (1, 8, 8, 3), generator=g, dtype=torch.uint8).float()
    return torch.nn.functional.interpolate(base.permute(0, 3, 1, 2), size=(48, 48), mode="bilinear")[0].permute(
        1, 2, 0).round().to(torch.uint8)  # smooth, so geometric ops change it visibly


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
    from avion_ds.config import ConfigError, load_recipe

    with pytest.raises(ConfigError, match=r"data.rand_aug='autoaug': not a RandAugment spec"):
        load_recipe(None, ["data.dataset=kinetics", "data.rand_aug=autoaug"])
    with pytest.raises(ConfigError, match=r"data.reprob=1.5 must be in \[0, 1\]"):
        load_recipe(None, ["data.dataset=kinetics", "data.reprob=1.5"])


def test_random_erasing_train_only_per_frame_rectangles() -> None:
    cfg = DataConfig(size=32, hflip=0.0, mixup=0.0, cutmix=0.0, reprob=1.0)
    frames = torch.full((2, 4, 32, 32, 3), 128, dtype=torch.uint8)
    labels = torch.zeros(2, dtype=torch.long)
    clean, _ = DeviceAugment(replace(cfg, reprob=0.0), 5, train=True)(frames, labels)
    x, _ = DeviceAugment(cfg, 5, train=True)(frames, labels)
    ev, _ = DeviceAugment(cfg, 5, train=False)(frames, labels)
    assert torch.equal(ev, clean)
    boxes = set()
    for b in range(2):
        for t in range(4):
            diff = (x[b, :, t] != clean[b, :, t]).any(0)
            assert diff.any()  # every frame erased (probability 1)
            rows, cols = diff.any(1).nonzero().flatten(), diff.any(0).nonzero().flatten()
            r0, r1, c0, c1 = int(rows.min()), int(rows.max()), int(cols.min()), int(cols.max())
            assert diff[r0:r1 + 1, c0:c1 + 1].float().mean() > 0.99  # one rectangle
            boxes.add((r0, r1, c0, c1))
    assert len(boxes) > 1  # drawn per frame, as VideoMAE's erasing of a (T, C, H, W) clip


def test_repeated_augmentation_decodes_once_and_gives_views(index_chunks, tmp_path, monkeypatch, decode_all) -> None:
    lst = tmp_path / "l.txt"
    lst.write_text("idx.mp4 1\n")
    cfg = DataConfig(dataset="kinetics", root=str(index_chunks), train_csv=str(lst), val_csv=str(lst), num_frames=4,
                     sampling="stride", stride=2, size=32, decode_timeout_s=0.0, num_sample=3,
                     interpolation="bicubic")
    ds = build_dataset(cfg, "train", seed=5)
    calls = []
    real = type(ds.decoder).decode
    monkeypatch.setattr(type(ds.decoder), "decode",
                        lambda self, p, ind, crop=None: calls.append(crop) or real(self, p, ind, crop))
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
        want = TF.resize(ref[:, box.top:box.top + box.height, box.left:box.left + box.width].permute(0, 3, 1, 2),
                         [32, 32], interpolation=TF.InterpolationMode.BICUBIC, antialias=True).permute(0, 2, 3, 1)
        assert (item["frames"][s].float() - want.float()).abs().mean() < 4.0, s
    # the device side repeats labels per view
    x, y = DeviceAugment(cfg, 2, train=True)(item["frames"][None], torch.tensor([1]))
    assert x.shape == (3, 3, 4, 32, 32) and y.tolist() == [1, 1, 1]


def test_bicubic_crop_resize_matches_torchvision() -> None:
    f = _image().expand(2, -1, -1, -1).contiguous()
    got = crop_resize(f, None, (20, 20), "bicubic")
    want = TF.resize(f.permute(0, 3, 1, 2), [20, 20], interpolation=TF.InterpolationMode.BICUBIC,
                     antialias=True).permute(0, 2, 3, 1)
    assert torch.equal(got, want)
    assert not torch.equal(crop_resize(f, None, (20, 20)), got)
