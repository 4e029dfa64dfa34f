"""Clip samplers: pure functions from a time span to frame indices to per-chunk reads.

Frame indices live on the video's constant-rate time line (frame ``i`` is at ``i / fps``
seconds). :func:`map_to_chunks` turns them into ``[(chunk_path, local_indices)]`` with the
manifest's DECODED frame counts, clamping an index that falls at most ``MAX_CLAMP_FRAMES`` past a
chunk's last decodable frame (seen in AVION's released chunks: 449 of 450) or past the end of the video to the
nearest earlier frame; a larger shortfall is a bad sample (:class:`DataError`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence

import numpy as np

from avion_ds.data.errors import DataError
from avion_ds.data.prep.manifest import VideoEntry

MAX_CLAMP_FRAMES = 2  # a missing tail frame or two (as in AVION's released chunks) is clamped; more is a bad sample
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
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"bad timestamp {text!r} (expected HH:MM:SS.ff, not before the video's start)")
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


def segment_indices(
    start: int,
    end: int,
    num_frames: int,
    *,
    train: bool,
    rng: np.random.Generator | None = None,
    view: int = 0,
    num_views: int = 1,
) -> list[int]:
    """TSN sampling: split [start, end) into ``num_frames`` equal parts, one frame per part.

    Train: a random position in each part (independent jitter). Eval: one view takes the parts'
    midpoints as AVION's ``get_frame_ids(jitter=False)`` computes them (means of neighbouring
    ``linspace(start, end, num_frames + 1)`` values, truncated); temporal view ``view`` of
    ``num_views`` > 1 takes the relative position (view + 0.5) / num_views in every part.
    Segments shorter than ``num_frames`` repeat frames.
    """
    if num_frames <= 0:
        raise ValueError(f"num_frames must be positive, got {num_frames}")
    end = max(end, start + 1)
    if not train and num_views == 1:
        edges = np.linspace(start, end, num_frames + 1)
        return [min(end - 1, int(m)) for m in (edges[:-1] + edges[1:]) / 2]
    seg = (end - start) / num_frames
    out = []
    for i in range(num_frames):
        off = _view_offset(train, rng, view, num_views)
        out.append(min(end - 1, start + int(math.floor(seg * (i + off)))))
    return out


def jittered_midpoints(start: int, end: int, num_frames: int, rng: np.random.Generator) -> list[int]:
    """AVION's ``get_frame_ids(jitter=True)`` (CLIP pretraining and MIR fine-tuning): the midpoints of
    ``num_frames`` equal parts of [start, end), each moved by a uniform shift in +- half of
    ``(end - start - 1) / num_frames``, truncated to int (always inside [start, end - 1]). The draws
    come from ``rng`` (one ``rng.random(num_frames)`` call) instead of numpy's global generator.
    Without jitter the midpoints are :func:`segment_indices`' single eval view."""
    if num_frames <= 0:
        raise ValueError(f"num_frames must be positive, got {num_frames}")
    end = max(end, start + 1)
    edges = np.linspace(start, end, num_frames + 1)
    seg = float(end - start - 1) / num_frames
    ids = (edges[:-1] + edges[1:]) / 2 + (rng.random(num_frames) - 0.5) * seg
    return [int(x) for x in ids]


def stride_indices(
    start: int,
    end: int,
    num_frames: int,
    stride: int,
    *,
    train: bool,
    rng: np.random.Generator | None = None,
    view: int = 0,
    num_views: int = 1,
) -> list[int]:
    """Fixed-stride sampling (Kinetics / VideoMAE): ``num_frames`` frames ``stride`` apart.

    The clip (``(num_frames - 1) * stride + 1`` frames) starts at a random offset in training and,
    for one eval view, at the centre; a span shorter than the clip starts at ``start`` and repeats
    its last frame. ``num_views`` > 1 eval views follow VideoMAE's Kinetics test loader: the span
    is read every ``stride`` frames, that list is padded with its last frame to ``num_frames``,
    and view ``view`` is the ``num_frames`` entries from ``int(view * (len - num_frames) /
    (num_views - 1))``.
    """
    if num_frames <= 0 or stride <= 0:
        raise ValueError(f"num_frames and stride must be positive, got {num_frames}, {stride}")
    end = max(end, start + 1)
    if not train and num_views > 1:
        count = len(range(start, end, stride))
        step = max((max(count, num_frames) - num_frames) / (num_views - 1), 0.0)
        first = int(view * step)
        return [start + stride * min(first + i, count - 1) for i in range(num_frames)]
    span = (num_frames - 1) * stride + 1
    room = end - start - span
    if room <= 0:
        first = start
    elif train:
        if rng is None:
            raise ValueError("training sampling needs an rng")
        first = start + int(rng.integers(0, room + 1))
    else:
        first = start + room // 2
    return [min(end - 1, first + i * stride) for i in range(num_frames)]


def ssv2_test_indices(start: int, end: int, num_frames: int, view: int = 0, num_views: int = 2) -> list[int]:
    """VideoMAE's SSv2 test sampling: view ``view`` of ``num_views`` takes ``int(tick * x + tick * view /
    num_views)`` for x < ``num_frames``, ``tick = (end - start) / num_frames``.

    VideoMAE builds ``int(tick * x)`` and ``int(tick * x + tick / 2)``, sorts the joined list and
    gives view v every second entry from v: as both lists interleave in order, that is view 0 at
    offset 0 and view 1 at offset 1/2 of every segment, floored (one view: the segment starts).
    """
    if num_frames <= 0:
        raise ValueError(f"num_frames must be positive, got {num_frames}")
    end = max(end, start + 1)
    tick = (end - start) / num_frames
    return [start + int(tick * x + tick * view / num_views) for x in range(num_frames)]


def eval_indices(
    segments: Callable[[int, int, int, int, int], list[int]] | None,
    sampling: str,
    start: int,
    end: int,
    num_frames: int,
    stride: int,
    view: int,
    num_views: int,
) -> list[int]:
    """Frame indices of eval temporal view ``view`` of ``num_views`` over [start, end), as the
    dataset's reference code picks them: stride sampling as VideoMAE's Kinetics test loader; segments
    by the dataset's declared ``segments(start, end, num_frames, view, num_views)`` (SSv2: VideoMAE's
    SSv2 test loader, :func:`ssv2_test_indices`), else as AVION (one view) / TSN."""
    if sampling == "stride":
        return stride_indices(start, end, num_frames, stride, train=False, view=view, num_views=num_views)
    if segments is not None:
        return segments(start, end, num_frames, view, num_views)
    return segment_indices(start, end, num_frames, train=False, view=view, num_views=num_views)


def chunk_end_frame(end: int, stop_s: float, entry: VideoEntry) -> int:
    """AVION's cap on a segment's end frame: at most the last decodable frame of the chunk that holds
    the stop time (the last chunk when the stop time lies past the video), so a segment running
    past its chunk's (or the video's) last frame is sampled up to that frame. A stop time more than
    one second past the video (what ``avion-ds check`` tolerates) keeps its end: the clip is then a
    bad sample (a truncated video or a wrong annotation), where AVION would squeeze it silently."""
    if end > entry.num_frames + max(1, int(round(entry.fps))):
        return end
    return min(end, entry.chunk_last_frame(entry.chunk_at(stop_s * entry.fps)))


def segment_span(start_s: float, stop_s: float, entry: VideoEntry, fps: float = 0.0) -> tuple[int, int]:
    """Frame span [start, end) of the time segment [start_s, stop_s] of ``entry`` as AVION's chunked
    ``video_loader`` computes it: ``round(seconds * fps)`` at ``fps`` (> 0; else the video's own
    rate), the end capped by :func:`chunk_end_frame`, at least one frame long. With another ``fps``
    than the video's, frame numbers are still read as indices into the video (AVION reads Ego4D at
    30 fps whatever its chunks hold)."""
    rate = fps if fps > 0 else entry.fps
    start, end = seconds_to_frames(start_s, stop_s, rate)
    end = chunk_end_frame(end, stop_s * rate / entry.fps, entry)
    return start, max(end, start + 1)


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
            raise DataError(
                f"{chunk.path}: frame {int(idx)} of video {entry.video_id} is {short} frames past the "
                f"last decodable frame {chunk.start_frame + local} (video or chunk shorter than the "
                f"annotation; at most {MAX_CLAMP_FRAMES} frames are clamped)"
            )
        if k != last_k:
            groups.append((entry.chunks[k].path, []))
            last_k = k
        groups[-1][1].append(local)
    return groups
