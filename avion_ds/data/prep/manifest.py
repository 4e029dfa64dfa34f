"""The chunk manifest (``DST/manifest.jsonl``) and whole-video probing.

One JSON line per chunk::

    {"video_id": "P01_01", "path": "P01_01/15.mp4", "start": 15.0, "start_frame": 450,
     "frames": 449, "fps": 30.0, "width": 320, "height": 240, "bytes": 812345,
     "source": "/data/P01_01.MP4", "source_size": 123, "source_mtime_ns": 456, "params": {...}}

``frames`` is the number of frames that actually decode (counted by the chunker), which can be
less than ``fps * chunk_seconds`` (seen in AVION's released chunks: 449 of 450). ``start_frame`` is the chunk's
first frame on the video's constant-rate time line, so a missing tail frame leaves a one-frame
gap that the sampler clamps instead of shifting every later chunk. A manifest may hold several
lines for the same (video_id, start_frame) when a run was interrupted and resumed; the last
one wins. Whole (unchunked) videos are described by the same :class:`VideoEntry` with a single
chunk, probed from the container header.
"""

from __future__ import annotations

import json
import logging
import os
import stat
from bisect import bisect_right
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

MANIFEST_NAME = "manifest.jsonl"
VIDEO_EXTENSIONS = (".mp4", ".mkv", ".avi", ".mov", ".webm", ".m4v", ".mpg", ".mpeg", ".flv", ".ts")

FAILURES_NAME = "chunk_failures.tsv"  # sources / chunks a chunking or indexing run could not read


@dataclass(frozen=True)
class Chunk:
    """One decodable file: global frames [start_frame, start_frame + frames) of its video."""

    path: str
    start_frame: int
    frames: int
    fps: float
    width: int
    height: int
    bytes: int = -1  # file size and mtime when chunked (-1: not recorded); see check_chunk_file
    mtime_ns: int = -1


def check_chunk_file(chunk: Chunk) -> str | None:
    """Why ``chunk``'s file no longer matches its manifest row (replaced, truncated, rewritten), else None.

    A re-chunk with other settings killed midway could otherwise leave rows describing files
    that were already replaced: the reader would take frames from the wrong times. A missing or
    unreadable file is named here, the same under every decoder (a bad sample, never a decoder's crash).
    """
    try:
        st = os.stat(chunk.path)
    except FileNotFoundError:
        return f"{chunk.path}: file not found (listed in its manifest.jsonl)"
    except OSError as e:
        return f"{chunk.path}: cannot be read ({e.strerror or type(e).__name__})"
    if not stat.S_ISREG(st.st_mode) or not os.access(chunk.path, os.R_OK):
        return f"{chunk.path}: cannot be read ({'not a regular file' if not stat.S_ISREG(st.st_mode) else 'permission denied'})"
    if chunk.bytes < 0:
        return None
    if st.st_size == 0 and chunk.bytes:
        return f"{chunk.path}: zero-byte file (its manifest row says {chunk.bytes} bytes)"
    if st.st_size != chunk.bytes or (chunk.mtime_ns >= 0 and st.st_mtime_ns != chunk.mtime_ns):
        what = (
            f"size {st.st_size} vs {chunk.bytes} bytes"
            if st.st_size != chunk.bytes
            else f"mtime_ns {st.st_mtime_ns} vs {chunk.mtime_ns}"
        )
        return (
            f"{chunk.path}: file does not match its manifest row ({what}); re-run `avion-ds chunk` on this "
            f"video (copies must keep timestamps: cp -a / rsync -a)"
        )
    return None


@dataclass
class VideoEntry:
    """All chunks of one video, sorted by ``start_frame``."""

    video_id: str
    chunks: list[Chunk] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.chunks.sort(key=lambda c: c.start_frame)
        self._starts = [c.start_frame for c in self.chunks]

    @property
    def fps(self) -> float:
        return self.chunks[0].fps

    @property
    def num_frames(self) -> int:
        """Length of the time line: one past the last decodable frame of the last chunk."""
        last = self.chunks[-1]
        return last.start_frame + last.frames

    @property
    def width(self) -> int:
        return self.chunks[0].width

    @property
    def height(self) -> int:
        return self.chunks[0].height

    def chunk_at(self, frame: float) -> int:
        """Number of the chunk whose start is the last at or before ``frame`` (0 before the first)."""
        return max(0, bisect_right(self._starts, frame) - 1)

    def chunk_last_frame(self, k: int) -> int:
        """The last decodable frame of chunk ``k`` on the video's time line."""
        chunk = self.chunks[k]
        return chunk.start_frame + chunk.frames - 1

    def locate(self, frame: int) -> tuple[int, int]:
        """Global frame -> (chunk number, local index), clamped to the nearest earlier decodable frame."""
        frame = min(max(int(frame), 0), self.num_frames - 1)
        k = self.chunk_at(frame)
        chunk = self.chunks[k]
        return k, min(frame - chunk.start_frame, chunk.frames - 1)


def is_video_file(path: Path) -> bool:
    return path.is_file() and path.suffix.lower() in VIDEO_EXTENSIONS and not path.name.startswith(".")


def video_named_dirs(src: str | Path) -> list[Path]:
    """Directories under ``src`` named like videos (``x.mp4/``): not videos, listed so they are not lost."""
    src = Path(src)
    if not src.is_dir():
        return []
    return sorted(p for p in src.rglob("*") if p.is_dir() and p.suffix.lower() in VIDEO_EXTENSIONS)


def find_videos(src: str | Path) -> list[Path]:
    """Video files under ``src`` (recursive, sorted), or ``[src]`` when it is a file."""
    src = Path(src)
    if src.is_file():
        return [src]
    return sorted(p for p in src.rglob("*") if is_video_file(p))


def iter_manifest_records(path: str | Path, problems: list[str] | None = None) -> Iterator[Any]:
    """Each readable manifest line's JSON value, one at a time; a torn line (interrupted write) is skipped
    with a warning (appended to ``problems`` instead of logged when given)."""
    path = Path(path)
    if path.is_dir():
        path = path / MANIFEST_NAME
    with path.open() as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                if problems is None:
                    log.warning("%s:%d: ignoring unreadable manifest line", path, n)
                else:
                    problems.append(f"{path}:{n}: ignoring unreadable manifest line")
                continue
            yield record


def read_manifest_records(path: str | Path, problems: list[str] | None = None) -> list[dict]:
    """Raw manifest lines (:func:`iter_manifest_records`, all held)."""
    return list(iter_manifest_records(path, problems))


def write_manifest(path: str | Path, records: Iterable[dict]) -> None:
    """Atomically (temp file + rename) write ``records`` as JSON lines."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w") as f:
        for r in records:
            f.write(json.dumps(r, sort_keys=True) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def dedupe_records(records: Iterable[dict]) -> list[dict]:
    """Keep only each video's newest chunking job, and the last record per (video_id, start_frame).

    An interrupted re-run can leave the old and the new job's lines for one video in the file;
    every record carries the ``job`` (start time in ns) that wrote it.
    """
    records = list(records)
    newest: dict[str, int] = {}
    for r in records:
        newest[r["video_id"]] = max(newest.get(r["video_id"], 0), int(r.get("job", 0)))
    last: dict[tuple[str, int], dict] = {}
    for r in records:
        if int(r.get("job", 0)) == newest[r["video_id"]]:
            last[(r["video_id"], int(r["start_frame"]))] = r
    return list(last.values())


def probe_video(path: str | Path, video_id: str | None = None) -> VideoEntry:
    """Describe a whole video as a one-chunk entry from its header (frame count may over-report).

    Raises ``OSError``/``ValueError`` naming the file when it cannot be opened or has no video.
    """
    import av  # lazy: PyAV is heavy to import, loaded when a video is decoded or written

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: file not found")
    if path.stat().st_size == 0:
        raise ValueError(f"{path}: zero-byte file")
    try:
        with av.open(str(path)) as c:
            if not c.streams.video:
                raise ValueError(f"{path}: no video stream")
            s = c.streams.video[0]
            fps = float(s.average_rate or s.guessed_rate or 0) or 30.0
            frames = int(s.frames or 0)
            if frames <= 0:
                dur = float(s.duration * s.time_base) if s.duration else (c.duration or 0) / 1e6
                frames = int(round(dur * fps))
            width, height = s.codec_context.width, s.codec_context.height
    except av.FFmpegError as e:
        raise ValueError(f"{path}: not a readable video ({e.__class__.__name__}: {e})") from None
    if frames <= 0 or width <= 0:
        raise ValueError(f"{path}: no decodable frames in header")
    return VideoEntry(video_id or path.stem, [Chunk(str(path), 0, frames, fps, width, height)])
