"""Clip samplers: pure functions from a time span to frame indices to per-chunk reads.

Frame indices live on the video's constant-rate time line (frame ``i`` is at ``i / fps``
seconds). :func:`map_to_chunks` turns them into ``[(chunk_path, local_indices)]`` with the
manifest's DECODED frame counts, clamping an index that falls at most ``MAX_CLAMP_FRAMES`` past a
chunk's last decodable frame (AVION issue #17: 449 of 450) or past the end of the video to the
nearest earlier frame; a larger shortfall is a bad sample (:class:`DataError`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

import numpy as np

from .errors import DataError
from .manifest import VideoEntry

MAX_CLAMP_FRAMES = 2  # a missing tail frame or two (AVION issue #17) is clamped; more is a bad sample
_TS = re.compile(r"^\s*(\d+):(\d{1,2}):(\d{1,2}(?:\.\d+)?)\s*$")


def parse_timestamp(text: str) -> float:
    """EPIC ``HH:MM:SS.ff`` (also plain seconds) -> seconds; ValueError naming the text otherwise."""
    m = _TS.match(str(text))
    if m:
        h, mnt, s = m.groups()
        return int(h) * 3600 + int(mnt) * 60 + float(s)
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise ValueError(f"bad timestamp {text!r} (expected HH:MM:SS.ff)") from None
    if not math.isfinite(value):
        raise ValueError(f"bad timestamp {text!r} (expected HH:MM:SS.ff)")
    return value


def seconds_to_frames(start_s: float, end_s: float, fps: float) -> tuple[int, int]:
    """Time span -> frame span [start, end) on the time line; at least one frame long."""
    start = max(0, int(round(start_s * fps)))
    end = int(round(end_s * fps))
    return start, max(end, start + 1)


def _view_offset(train: bool, rng: np.random.Generator | None, view: int, num_views: int) -> float:
    if train:
        if rng is None:
            raise ValueError("training sampling needs an rng")
        return float(rng.random())
    return (view + 0.5) / num_views


def segment_indices(start: int, end: int, num_frames: int, *, train: bool, rng: np.random.Generator | None = None,
                    view: int = 0, num_views: int = 1) -> list[int]:
    """TSN sampling: split [start, end) into ``num_frames`` equal parts, one frame per part.

    Train: a random position in each part (independent jitter). Eval: temporal view ``view`` of
    ``num_views`` takes the same relative position (view + 0.5) / num_views in every part, so one
    view gives the midpoints. Segments shorter than ``num_frames`` repeat frames.
    """
    if num_frames <= 0:
        raise ValueError(f"num_frames must be positive, got {num_frames}")
    end = max(end, start + 1)
    seg = (end - start) / num_frames
    out = []
    for i in range(num_frames):
        off = _view_offset(train, rng, view, num_views)
        out.append(min(end - 1, start + int(math.floor(seg * (i + off)))))
    return out


def stride_indices(start: int, end: int, num_frames: int, stride: int, *, train: bool,
                   rng: np.random.Generator | None = None, view: int = 0, num_views: int = 1) -> list[int]:
    """Fixed-stride sampling (Kinetics / VideoMAE): ``num_frames`` frames ``stride`` apart.

    The clip (``(num_frames - 1) * stride + 1`` frames) starts at a random offset in training and,
    in eval, at ``num_views`` evenly spaced offsets (the centre for one view). A span shorter than
    the clip starts at ``start`` and repeats its last frame.
    """
    if num_frames <= 0 or stride <= 0:
        raise ValueError(f"num_frames and stride must be positive, got {num_frames}, {stride}")
    end = max(end, start + 1)
    span = (num_frames - 1) * stride + 1
    room = end - start - span
    if room <= 0:
        first = start
    elif train:
        if rng is None:
            raise ValueError("training sampling needs an rng")
        first = start + int(rng.integers(0, room + 1))
    elif num_views == 1:
        first = start + room // 2
    else:
        first = start + int(round(room * view / (num_views - 1)))
    return [min(end - 1, first + i * stride) for i in range(num_frames)]


def map_to_chunks(indices: Sequence[int], entry: VideoEntry) -> list[tuple[str, list[int]]]:
    """Global frame indices -> ``[(chunk_path, local_indices)]``, consecutive runs per chunk, order kept.

    An index past a chunk's (or the video's) last decodable frame is clamped by at most
    ``MAX_CLAMP_FRAMES``; a bigger shortfall (a truncated video or chunk) raises DataError instead of
    returning a clip of one frozen frame under a valid label.
    """
    groups: list[tuple[str, list[int]]] = []
    last_k = -1
    for idx in indices:
        k, local = entry.locate(idx)
        chunk = entry.chunks[k]
        short = int(idx) - (chunk.start_frame + local)
        if short > MAX_CLAMP_FRAMES:
            raise DataError(f"{chunk.path}: frame {int(idx)} of video {entry.video_id} is {short} frames past the "
                            f"last decodable frame {chunk.start_frame + local} (video or chunk shorter than the "
                            f"annotation; at most {MAX_CLAMP_FRAMES} frames are clamped)")
        if k != last_k:
            groups.append((entry.chunks[k].path, []))
            last_k = k
        groups[-1][1].append(local)
    return groups
