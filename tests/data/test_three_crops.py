"""Eval's 3 spatial crops come from ONE decode of the clip: bit-identical to a decode per crop."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from avion_ds.config import DataConfig
from avion_ds.data import build_dataset
from avion_ds.data.crop import clip_rng
from avion_ds.data.decode.select import available_backends
from avion_ds.data.prep.chunking import chunk_videos
from avion_ds.data.prep.synthetic import write_video


@pytest.fixture(scope="module")
def noise_cfg(tmp_path_factory) -> DataConfig:
    """102x60 random pixels (a box one pixel off is far away), 3 crops at left 0, 21 (odd), 42."""
    d = tmp_path_factory.mktemp("three")
    write_video(d / "src" / "v.mp4", 40, 102, 60, fps=15, pattern="noise", gop=8)
    assert not chunk_videos(d / "src", d / "chunks", chunk_seconds=2.0, fps=15, progress=False).failed
    lst = d / "list.txt"
    lst.write_text("v.mp4 0\n")
    return DataConfig(
        dataset="kinetics",
        root=str(d / "chunks"),
        train_csv=str(lst),
        val_csv=str(lst),
        num_frames=6,
        sampling="stride",
        stride=4,
        size=32,
        decode_timeout_s=0.0,
    )


@pytest.mark.parametrize("interpolation", ["bilinear", "bicubic"])
@pytest.mark.parametrize("name", available_backends())
def test_three_crops_decode_once_bit_identical(name, interpolation, noise_cfg, monkeypatch) -> None:
    ds = build_dataset(
        replace(noise_cfg, decoder=name, interpolation=interpolation), "val", temporal_views=2, spatial_views=3
    )
    calls = []
    decode = ds.decoder.decode
    monkeypatch.setattr(ds.decoder, "decode", lambda *a, **k: calls.append(a[0]) or decode(*a, **k))
    frames = ds[0]["frames"]
    once = len(calls)
    entry, start, end, _ = ds.sample_span(0)
    expected = []
    for t in range(2):  # the per-crop path: one fused decode (crop + resize) per box
        rng = clip_rng(ds.seed, ds.epoch, 0, t)
        indices = ds.clip_indices(start, end, rng, t)
        boxes = ds.crop_boxes(entry.height, entry.width, rng)
        assert [b.left for b in boxes] == [0, 21, 42]
        expected += [ds.read_clip(entry, indices, box) for box in boxes]
    assert frames.shape == (6, 6, 32, 32, 3)
    assert torch.equal(frames, torch.stack(expected))
    assert once >= 2 and len(calls) - once == 3 * once  # one decode per temporal view (and chunk), not per crop
