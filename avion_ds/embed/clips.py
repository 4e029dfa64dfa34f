"""Fixed-length clips of a video source, decoded with the project's decoders.

A source is a chunk tree (a directory with ``manifest.jsonl``), a folder of videos (whole files, found
recursively, named by their path under the folder), or a dataset CSV (a ``video_id`` column, optional
``start_timestamp`` / ``stop_timestamp`` as in EPIC's CSVs, videos under ``--root``: a chunk tree or a
folder whose file stems are the ids). Each video (or each CSV row's segment, with ``segments``) is cut
into clips of ``clip_seconds`` every ``stride_seconds``; the last clip ends at the video's (segment's)
end. A clip's frames are ``data.num_frames`` segment midpoints, centre crop, ``data.size`` pixels.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Any

from avion_ds.config import ConfigError, DataConfig
from avion_ds.data.datasets.csv_rows import open_csv
from avion_ds.data.datasets.video_clips import VideoClipDataset
from avion_ds.data.datasets.video_index import VideoIndex
from avion_ds.data.errors import DataError
from avion_ds.data.prep.manifest import MANIFEST_NAME, VideoEntry, find_videos
from avion_ds.data.sampling import parse_timestamp, seconds_to_frames

Clip = tuple[str, float, float]  # (video, start seconds, end seconds)


def windows(start: float, end: float, clip_seconds: float, stride_seconds: float) -> list[tuple[float, float]]:
    """Clips of ``clip_seconds`` every ``stride_seconds`` over [start, end); the last one ends at ``end``."""
    out, t = [], start
    while t < end - 1e-6:
        out.append((t, min(t + clip_seconds, end)))
        t += stride_seconds
    return out or [(start, end)]


Span = tuple[str, float | None, float | None, str]  # (video, start, end or None: whole video, caption)
TEXT_COLUMNS = ("narration", "text", "caption", "sentence")  # the caption a --segments row carries, first found


def _segment(path: Path, line: int, r: dict[str, str], bad: list[str]) -> Span | None:
    """The row's segment, or None (named in ``bad``) when its times are not a forward span."""
    if not (r.get("start_timestamp") and r.get("stop_timestamp")):
        raise ValueError(f"{path}:{line}: --segments needs start_timestamp and stop_timestamp columns")
    start, stop = parse_timestamp(r["start_timestamp"]), parse_timestamp(r["stop_timestamp"])
    if not (math.isfinite(start) and math.isfinite(stop)) or start < 0 or stop <= start:
        bad.append(f"{path}:{line}: start {r['start_timestamp']} is not before stop {r['stop_timestamp']}")
        return None
    text = next((r[c] for c in TEXT_COLUMNS if r.get(c)), "")
    return (r["video_id"], start, stop, text)


def _csv_spans(path: Path, index: VideoIndex, segments: bool) -> list[Span]:
    _, rows = open_csv(path, ("video_id",))
    if not rows:
        raise ValueError(f"{path}: no rows")
    spans: list[Span] = []
    seen: set[str] = set()
    bad: list[str] = []
    for line, r in rows:
        if not index.exists(r["video_id"]):
            raise ValueError(f"{path}:{line}: video_id {r['video_id']!r} not found under {index.root}")
        if segments:
            span = _segment(path, line, r, bad)
            spans += [span] if span is not None else []
        elif r["video_id"] not in seen:
            seen.add(r["video_id"])
            spans.append((r["video_id"], None, None, ""))
    if bad:
        print(f"{len(bad)} segment row(s) left out (empty or backwards time span); first: {bad[0]}", flush=True)
    if not spans:
        raise ValueError(f"{path}: no usable rows")
    return spans


def list_clips(
    source: str | Path, root: str | None, segments: bool, clip_seconds: float, stride_seconds: float
) -> tuple[Path, bool, list[Clip], list[str]]:
    """(video root, chunked, clips, each clip's caption) of ``source``; ConfigError (one line) for a source
    of another kind. A whole video that cannot be probed, or a segment row whose span is empty or
    backwards, is named once, counted and left out."""
    src = Path(source)
    if src.is_file() and src.suffix.lower() == ".csv":
        if not root:
            raise ConfigError(f"{src}: a dataset CSV needs --root (the chunk tree or folder holding its videos)")
        video_root = Path(root)
        if not video_root.is_dir():
            raise ConfigError(f"--root: directory not found: {video_root}")
        chunked = (video_root / MANIFEST_NAME).is_file()
        index = VideoIndex(video_root, chunked)
        try:
            spans = _csv_spans(src, index, segments)
        except (ValueError, FileNotFoundError) as e:
            raise ConfigError(str(e)) from None
    elif src.is_dir():
        video_root, chunked = src, (src / MANIFEST_NAME).is_file()
        index = VideoIndex(video_root, chunked)
        keys = sorted(index.videos) if chunked else [p.relative_to(src).as_posix() for p in find_videos(src)]
        spans = [(k, None, None, "") for k in keys]
    else:
        raise ConfigError(
            f"{src}: not a video source (a chunk tree with {MANIFEST_NAME}, a folder of videos, or a dataset CSV)"
        )
    clips: list[Clip] = []
    texts: list[str] = []
    bad: list[str] = []
    for key, start, end, text in spans:
        try:
            entry = video_entry(index, key, chunked)
        except DataError as e:
            bad.append(f"{key}: {e}")
            continue
        duration = entry.num_frames / entry.fps
        lo, hi = (0.0, duration) if start is None else (start, min(end, duration))
        if hi <= lo:
            bad.append(f"{key}: segment [{lo:.2f}, {end:.2f}] s starts after the video's end ({duration:.2f} s)")
            continue
        cut = [(key, a, b) for a, b in windows(lo, hi, clip_seconds, stride_seconds)]
        clips += cut
        texts += [text] * len(cut)
    if bad:
        print(f"{len(bad)} video(s) or segment(s) left out: {'; '.join(bad[:3])}", flush=True)
    if not clips:
        raise ConfigError(f"{src}: no decodable video found")
    return video_root, chunked, clips, texts


def video_entry(index: VideoIndex, key: str, chunked: bool) -> VideoEntry:
    """The video ``key`` names: a manifest id / file stem, or (a folder of videos) its path under the root."""
    return index.by_id(key) if chunked or "/" not in key and index.exists(key) else index.by_path(key)


class WindowDataset(VideoClipDataset):
    """The clips of an index, as evaluation clips (label ``{"row": i}``)."""

    def __init__(self, cfg: DataConfig, root: Path, chunked: bool, clips: list[Clip]) -> None:
        cfg = replace(cfg, root=str(root), val_root="", chunked=chunked, quarantine="none", on_error="skip")
        super().__init__(cfg, "val")
        self.clips = clips

    def __len__(self) -> int:
        return len(self.clips)

    def row_name(self, i: int) -> str:
        video, start, end = self.clips[i]
        return f"{video} [{start:.2f}, {end:.2f}] s"

    def entry(self, i: int) -> VideoEntry:
        return video_entry(self.index, self.clips[i][0], self.cfg.chunked)

    def frame_span(self, i: int) -> tuple[VideoEntry, int, int]:
        entry = self.entry(i)
        _, start_s, end_s = self.clips[i]
        start, end = seconds_to_frames(start_s, end_s, entry.fps)
        end = min(end, entry.num_frames)
        return entry, min(start, end - 1), end

    def sample_span(self, i: int) -> tuple[VideoEntry, int, int, Any]:
        entry, start, end = self.frame_span(i)
        return entry, start, end, {"row": i}
