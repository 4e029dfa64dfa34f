"""Shared tiny-video fixtures for the data tests (generated once per session, a few seconds)."""

from __future__ import annotations

import shutil
from dataclasses import replace
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pytest
import torch

from avion_ds.config import DataConfig
from avion_ds.data.prep.chunking import chunk_videos
from avion_ds.data.prep.synthetic import make_synthetic_epic, write_video


def decode_all(path: str | Path) -> torch.Tensor:
    """Reference: PyAV decoding every frame in order, uint8 (N, H, W, C)."""
    with av.open(str(path)) as c:
        return torch.from_numpy(np.stack([f.to_ndarray(format="rgb24") for f in c.decode(video=0)]))


@pytest.fixture(name="decode_all", scope="session")
def decode_all_fixture():
    """The PyAV every-frame reference decoder, as a fixture (tests/ has no packages to import from)."""
    return decode_all


@pytest.fixture(scope="session")
def data_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("avion_data")


@pytest.fixture(scope="session")
def index_video(data_root) -> Path:
    """96x72, 30 fps, 150 frames whose pixels carry their frame index (read_frame_index)."""
    return write_video(data_root / "src" / "idx.mp4", 150, 96, 72, fps=30, gop=10)


@pytest.fixture(scope="session")
def index_chunks(data_root, index_video) -> Path:
    """index_video cut into 1 s chunks of 30 frames (idx/0.mp4, idx/1.mp4, ...)."""
    dst = data_root / "idx_chunks"
    summary = chunk_videos(index_video, dst, chunk_seconds=1.0, short_side=320, fps=30, gop=8, progress=False)
    assert not summary.failed, summary
    return dst


@pytest.fixture(scope="session")
def epic_raw(data_root) -> dict:
    """A small learnable EPIC-style set: 2 videos x 6 segments x 2 s at 15 fps, 64x48."""
    return make_synthetic_epic(
        data_root / "epic",
        num_videos=2,
        segments_per_video=6,
        segment_seconds=2.0,
        width=64,
        height=48,
        fps=15,
        seed=1,
        val_fraction=0.34,
    )


@pytest.fixture(scope="session")
def epic_chunks(data_root, epic_raw) -> Path:
    """epic_raw chunked at 3 s (45 frames), so 2 s segments regularly cross a chunk boundary."""
    dst = data_root / "epic_chunks"
    summary = chunk_videos(epic_raw["videos"], dst, chunk_seconds=3.0, short_side=320, fps=15, gop=8, progress=False)
    assert not summary.failed, summary
    return dst


@pytest.fixture()
def epic_cfg(epic_raw, epic_chunks) -> DataConfig:
    return DataConfig(
        dataset="epic",
        root=str(epic_chunks),
        train_csv=str(epic_raw["train_csv"]),
        val_csv=str(epic_raw["val_csv"]),
        num_frames=4,
        size=32,
        decoder="decord",
        decode_timeout_s=0.0,
        mixup=0.0,
        cutmix=0.0,
    )


@pytest.fixture()
def epic_copy(tmp_path, epic_chunks, epic_cfg):
    """A private copy of the EPIC chunks (tests that damage files) and a config pointing at it."""
    dst = tmp_path / "chunks"
    shutil.copytree(epic_chunks, dst)
    return dst, replace(epic_cfg, root=str(dst))


def transcode(
    src: str | Path,
    dst: str | Path,
    codec: str = "libvpx-vp9",
    fmt: str = "webm",
    fps: int | None = None,
    options: dict | None = None,
) -> Path:
    """Re-encode ``src`` into another container/codec (webm VP8/VP9, mkv, ...), frames unchanged.

    ``options``: muxer options, e.g. ``{"movflags": "faststart"}`` for a streamable mp4.
    """
    dst = Path(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    with av.open(str(src)) as inp, av.open(str(dst), mode="w", format=fmt, options=options or {}) as out:
        s_in = inp.streams.video[0]
        rate = fps or int(round(float(s_in.average_rate)))
        s = out.add_stream(codec, rate=rate)
        s.width, s.height, s.pix_fmt = s_in.codec_context.width, s_in.codec_context.height, "yuv420p"
        if codec.startswith("libvpx"):
            s.options = {"crf": "10", "b": "0", "deadline": "realtime", "cpu-used": "8"}
        for n, frame in enumerate(inp.decode(s_in)):
            vf = av.VideoFrame.from_ndarray(frame.to_ndarray(format="rgb24"), format="rgb24")
            vf.pts, vf.time_base = n, Fraction(1, rate)
            for p in s.encode(vf):
                out.mux(p)
        for p in s.encode(None):
            out.mux(p)
    return dst


@pytest.fixture(name="transcode", scope="session")
def transcode_fixture():
    """:func:`transcode` as a fixture."""
    return transcode
