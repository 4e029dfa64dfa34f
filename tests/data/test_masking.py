"""Pretraining masks (tube / random / V2 running cell) on VideoMAE's (8, 14, 14) window, the
multi-scale crop, and the unlabelled ``videos`` dataset."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch

from avion_ds.data.crop import clip_rng, multi_scale_crop
from avion_ds.data.datasets.registry import dataset_config
from avion_ds.data.masking import MaskSpec, random_mask, running_cell_mask, tube_mask

GRID = (8, 14, 14)


def test_tube_mask_hides_the_same_patches_in_every_slice() -> None:
    rng = np.random.default_rng(0)
    masks = [tube_mask(GRID, 0.9, rng).reshape(8, 196) for _ in range(200)]
    for m in masks:
        assert m.dtype == bool and (m == m[0]).all()  # one spatial mask repeated over time
        assert m[0].sum() == int(0.9 * 196) == 176  # 157 of 1568 tokens stay visible
    freq = np.mean([m[0] for m in masks], axis=0)  # every position equally likely hidden
    assert abs(freq.mean() - 176 / 196) < 1e-9 and freq.min() > 0.75 and freq.max() < 1.0
    assert len({m.tobytes() for m in masks}) == 200


def test_random_mask_count_and_spread() -> None:
    rng = np.random.default_rng(1)
    masks = np.stack([random_mask(GRID, 0.9, rng) for _ in range(100)])
    assert (masks.sum(1) == int(0.9 * 1568)).all()
    per_slice = masks.reshape(100, 8, 196)
    assert not all((m == m[0]).all() for m in per_slice)  # not tubes


def test_running_cell_mask_statistics() -> None:
    rng = np.random.default_rng(2)
    draws = [running_cell_mask(GRID, 0.5, rng).reshape(8, 14, 14) for _ in range(400)]
    for m in draws:
        cells = m.reshape(8, 7, 2, 7, 2).transpose(0, 1, 3, 2, 4).reshape(8, 49, 4)
        assert (cells.sum(-1) == 2).all()  # 2 of every 2x2 cell hidden: exactly 50% of each slice
        assert (cells == cells[:, :1]).all()  # the same cell pattern tiled over space
        # the cell "runs": slice t+1 reads the 4-cycle queue (row-major cell order) one step further
        for t in range(7):
            assert (np.roll(cells[t, 0], -1) == cells[t + 1, 0]).all()
    starts = Counter(m[0, :2, :2].tobytes() for m in draws)
    assert len(starts) == 4 and min(starts.values()) > 60  # 4 start offsets, drawn uniformly
    with pytest.raises(ValueError, match="ratio"):
        running_cell_mask(GRID, 0.1, rng)


def test_mask_spec_is_a_function_of_the_clip_key() -> None:
    spec = MaskSpec(GRID, "tube", 0.9, "running_cell", 0.5).validate()
    a, b = spec.draw(clip_rng(0, 3, 17, 7919)), spec.draw(clip_rng(0, 3, 17, 7919))
    c = spec.draw(clip_rng(0, 3, 18, 7919))
    assert set(a) == {"mask", "decode_mask"}
    assert all((a[k] == b[k]).all() for k in a)
    assert not (a["mask"] == c["mask"]).all()
    with pytest.raises(ValueError, match="mask type 'block'"):
        MaskSpec(GRID, "block").validate()


def test_multi_scale_crop_sizes_and_offsets() -> None:
    rng = np.random.default_rng(3)
    sides = {int(320 * s) for s in (1, 0.875, 0.75, 0.66)}  # none within 3 px of 224: no snapping
    seen = set()
    for _ in range(500):
        box = multi_scale_crop(320, 426, 224, [1, 0.875, 0.75, 0.66], rng)
        assert box.height in sides and box.width in sides
        i, j = sorted(sides, reverse=True).index(box.height), sorted(sides, reverse=True).index(box.width)
        assert abs(i - j) <= 1  # max_distort 1
        assert 0 <= box.top <= 320 - box.height and 0 <= box.left <= 426 - box.width
        seen.add((box.height, box.width))
    assert len(seen) == 10  # 4 scales x (self + neighbours) pairs


def test_videos_dataset_items(epic_raw, epic_chunks) -> None:
    from avion_ds.data.datasets.videos import VideosDataset

    cfg = dataset_config(
        "videos",
        root=str(epic_chunks),
        num_frames=4,
        size=32,
        decoder="decord",
        sampling="stride",
        stride=2,
        clips_per_video=3,
        workers=0,
    )
    ds = VideosDataset(cfg, "train", seed=0)
    ds.masks = MaskSpec((2, 2, 2), "tube", 0.5).validate()
    assert len(ds) == 2 * 3
    a, b = ds[4], ds[4]
    assert a["frames"].shape == (4, 32, 32, 3) and a["frames"].dtype == torch.uint8
    assert a["label"]["mask"].dtype == torch.bool and int(a["label"]["mask"].sum()) == 4
    assert torch.equal(a["frames"], b["frames"]) and torch.equal(a["label"]["mask"], b["label"]["mask"])
    before = [ds[i]["label"]["mask"] for i in range(len(ds))]
    ds.set_epoch(1)  # training draws new masks every epoch
    assert any(not torch.equal(ds[i]["label"]["mask"], m) for i, m in enumerate(before))
    val = VideosDataset(cfg, "val", seed=0)
    val.masks = ds.masks
    v0 = val[1]
    val.set_epoch(5)  # validation clips and masks do not change with the epoch
    v5 = val[1]
    assert torch.equal(v0["frames"], v5["frames"]) and torch.equal(v0["label"]["mask"], v5["label"]["mask"])
    clips = [val[i]["frames"] for i in range(3)]  # one video's val clips: evenly spaced, all different
    assert not any(torch.equal(clips[a], clips[b]) for a, b in ((0, 1), (1, 2), (0, 2)))
