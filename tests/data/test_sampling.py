"""Clip sampler: pure functions, no video files."""

from __future__ import annotations

import numpy as np
import pytest

from avion_ds.data.errors import DataError
from avion_ds.data.prep.manifest import Chunk, VideoEntry
from avion_ds.data.sampling import (
    map_to_chunks,
    parse_timestamp,
    seconds_to_frames,
    segment_indices,
    stride_indices,
)


def _entry(frames_per_chunk: list[int], nominal: int = 450) -> VideoEntry:
    chunks = [Chunk(f"v/{i * 15}.mp4", i * nominal, n, 30.0, 320, 240) for i, n in enumerate(frames_per_chunk)]
    return VideoEntry("v", chunks)


def test_parse_timestamp() -> None:
    assert parse_timestamp("00:00:01.50") == pytest.approx(1.5)
    assert parse_timestamp("01:02:03.04") == pytest.approx(3723.04)
    assert parse_timestamp("12.5") == 12.5
    with pytest.raises(ValueError, match="bad timestamp 'xx:yy'"):
        parse_timestamp("xx:yy")
    with pytest.raises(ValueError, match="bad timestamp '-3.5'.*not before the video's start"):
        parse_timestamp("-3.5")  # an EPIC / MIR row before the video's start: a bad sample (epic_seconds)


def test_seconds_to_frames_is_at_least_one_frame() -> None:
    assert seconds_to_frames(1.0, 2.0, 30) == (30, 60)
    assert seconds_to_frames(1.0, 1.0, 30) == (30, 31)


def test_segment_eval_midpoints() -> None:
    assert segment_indices(0, 80, 8, train=False) == [5, 15, 25, 35, 45, 55, 65, 75]
    # three temporal views take different positions inside every segment
    views = [segment_indices(0, 30, 3, train=False, view=v, num_views=3) for v in range(3)]
    assert views == [[1, 11, 21], [5, 15, 25], [8, 18, 28]]


def test_segment_train_jitter_stays_in_segments_and_is_seeded() -> None:
    a = segment_indices(100, 180, 8, train=True, rng=np.random.default_rng(3))
    b = segment_indices(100, 180, 8, train=True, rng=np.random.default_rng(3))
    assert a == b
    for i, x in enumerate(a):
        assert 100 + 10 * i <= x < 100 + 10 * (i + 1)
    c = [segment_indices(100, 180, 8, train=True, rng=np.random.default_rng(s)) for s in range(20)]
    assert len({tuple(x) for x in c}) > 1


def test_segment_shorter_than_clip_repeats_frames() -> None:
    idx = segment_indices(10, 13, 8, train=False)
    assert len(idx) == 8 and min(idx) >= 10 and max(idx) <= 12 and idx == sorted(idx)
    assert segment_indices(5, 5, 4, train=False) == [5, 5, 5, 5]  # empty span -> one frame


def test_stride_sampling() -> None:
    assert stride_indices(0, 100, 4, 4, train=False) == [43, 47, 51, 55]  # centred: 87 frames of room, start 43
    views = [stride_indices(0, 100, 4, 4, train=False, view=v, num_views=3) for v in range(3)]
    assert views == [[0, 4, 8, 12], [40, 44, 48, 52], [84, 88, 92, 96]]  # VideoMAE: starts int(v * 21 / 2) x 4
    t = stride_indices(0, 100, 4, 4, train=True, rng=np.random.default_rng(0))
    assert np.diff(t).tolist() == [4, 4, 4] and 0 <= t[0] <= 87
    assert stride_indices(0, 6, 4, 4, train=True, rng=np.random.default_rng(0)) == [0, 4, 5, 5]  # short video


def test_map_to_chunks_across_a_boundary() -> None:
    e = _entry([450, 450, 450])
    groups = map_to_chunks([440, 445, 452, 460], e)
    assert groups == [("v/0.mp4", [440, 445]), ("v/15.mp4", [2, 10])]


def test_map_to_chunks_clamps_a_frame_missing_at_a_chunk_end() -> None:
    """A chunk that decodes 449 of 450 frames: global frame 449 clamps to its last frame 448."""
    e = _entry([449, 450])
    assert e.num_frames == 900
    assert map_to_chunks([448, 449, 450], e) == [("v/0.mp4", [448, 448]), ("v/15.mp4", [0])]


def test_map_to_chunks_clamps_past_the_end() -> None:
    e = _entry([450, 120])
    assert e.num_frames == 570
    assert map_to_chunks([560, 569, 570, 571], e) == [("v/15.mp4", [110, 119, 119, 119])]


@pytest.mark.parametrize("frames", [[560, 573], [9999]])
def test_map_to_chunks_refuses_frozen_frames_past_the_end(frames: list[int]) -> None:
    """A truncated video: more than 2 frames past its end would repeat one frame -> bad sample."""
    with pytest.raises(DataError, match=r"v/15.mp4: frame \d+ of video v is \d+ frames past the last decodable"):
        map_to_chunks(frames, _entry([450, 120]))


def test_map_to_chunks_refuses_a_short_chunk_mid_video() -> None:
    """A chunk that decodes 100 of its 450 frames: frame 300 would freeze on local frame 99."""
    e = _entry([100, 450])
    assert map_to_chunks([101, 450], e) == [("v/0.mp4", [99]), ("v/15.mp4", [0])]
    with pytest.raises(DataError, match="frame 300 of video v is 201 frames past"):
        map_to_chunks([99, 300], e)


def test_unchunked_video_is_one_chunk() -> None:
    e = VideoEntry("whole", [Chunk("/data/whole.mp4", 0, 300, 25.0, 640, 360)])
    idx = stride_indices(0, e.num_frames, 16, 4, train=False)
    assert map_to_chunks(idx, e) == [("/data/whole.mp4", idx)]
