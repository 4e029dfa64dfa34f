"""The chunk manifest as flat arrays, cached beside ``manifest.jsonl`` (:mod:`avion_ds.data.index_cache`).

``manifest.jsonl`` of a large dataset (Ego4D: 865k chunks) held as one ``Chunk`` object per row
costs ~2.5 KiB a chunk in every process. Here each chunk is one row of an int64 table
``(start_frame, frames, width, height, bytes, mtime_ns)``, an fps column and its path (relative to
the manifest, in one string buffer); videos are ranges of rows, sorted by ``start_frame``, with their
length and frame size in a per-video table. The
:class:`FlatManifest` mapping hands out :class:`FlatVideoEntry` objects that read those rows on
access and behave as the :class:`~avion_ds.data.prep.manifest.VideoEntry` ``load_manifest`` used
to build: same chunks (same paths, numbers and order), same videos in the same order, the same
torn-line warnings (kept in the index and logged again on each load).
"""

from __future__ import annotations

import logging
import re
from array import array
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from avion_ds.data.index_cache import MappedIndex, StringPacker, Strings, cached_index, pack_strings, take_strings
from avion_ds.data.prep.manifest import (
    MANIFEST_NAME,
    Chunk,
    VideoEntry,
    dedupe_records,
    iter_manifest_records,
    read_manifest_records,
)

log = logging.getLogger(__name__)
LAYOUT = 2  # version of the arrays below: a cache of another layout is rebuilt
ENTRY_CACHE = 16384  # video entries a process keeps made (~0.5 KiB + 40 B a chunk each)
_INT_FIELDS = ("start_frame", "frames", "width", "height", "bytes", "mtime_ns")


def join_path(base: str, rel: str) -> str:
    """``str(Path(base) / rel)`` for ``rel`` already normalised by ``str(Path(rel))``, without a Path."""
    if rel.startswith("/"):
        return rel
    if rel == ".":
        return base
    if base == ".":
        return rel
    return base + rel if base.endswith("/") else base + "/" + rel


def _parse(mpath: Path, r: dict) -> tuple[str, str, list[int], float]:
    """(video id, normalised relative path, int fields, fps) of one record; ValueError as load_manifest's."""
    try:
        raw = r["path"]
        rel = str(Path(raw)) if isinstance(raw, str) else str(mpath.parent / raw)
        start, frames, fps = int(r["start_frame"]), int(r["frames"]), float(r["fps"])
        ints = [start, frames, int(r["width"]), int(r["height"]), int(r.get("bytes", -1)), int(r.get("mtime_ns", -1))]
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{mpath}: bad manifest record for video {r.get('video_id')!r}: {e}") from None
    return str(r["video_id"]), rel, ints, fps


def _record_arrays(mpath: Path) -> tuple[dict[str, np.ndarray], dict]:
    """:func:`build_manifest_arrays` from every record held as a dict (the reference: any manifest)."""
    problems: list[str] = []
    by_video: dict[str, list[tuple[list[int], float, str]]] = {}
    for r in dedupe_records(read_manifest_records(mpath, problems)):
        vid, rel, ints, fps = _parse(mpath, r)
        if ints[1] > 0:
            by_video.setdefault(vid, []).append((ints, fps, rel))
    ints, fps, paths, videos = [], [], [], []
    for chunks in by_video.values():
        chunks.sort(key=lambda c: c[0][0])
        lo = len(ints)
        for i, f, p in chunks:
            ints.append(i)
            fps.append(f)
            paths.append(p)
        last = chunks[-1][0]
        videos.append([lo, len(ints), last[0] + last[1], chunks[0][0][2], chunks[0][0][3]])
    ids_buf, ids_off = pack_strings(list(by_video))
    path_buf, path_off = pack_strings(paths)
    table = np.array(ints, np.int64).reshape(len(ints), len(_INT_FIELDS))
    return _arrays(
        table, np.array(fps, np.float64), np.array(videos, np.int64), (ids_buf, ids_off), (path_buf, path_off)
    ), {"warnings": problems}


def _arrays(table: np.ndarray, fps: np.ndarray, videos: np.ndarray, ids: tuple, paths: tuple) -> dict[str, np.ndarray]:
    """The index's arrays from the kept chunks' int table (``_INT_FIELDS``), fps, the video table, the packed
    video ids and paths."""
    return {
        "starts": np.ascontiguousarray(table[:, 0]),
        "ints": np.ascontiguousarray(table[:, 1:]),
        "fps": fps,
        "videos": videos.reshape(len(videos), 5),
        "ids_buf": ids[0],
        "ids_off": ids[1],
        "path_buf": paths[0],
        "path_off": paths[1],
    }


_PLAIN_PATH = re.compile(r"(?!\./)(?:[^/]|/(?![/.]))*[^/]")  # no //, no ./ or /. component start, no trailing /


def _norm(raw: str) -> str:
    """``str(Path(raw))`` (a plain relative or absolute path: ``raw`` itself, without making a Path)."""
    return raw if _PLAIN_PATH.fullmatch(raw) else str(Path(raw))


class _Columns:
    """Manifest records as rows of compact columns: ints, job, video number, fps, and the normalised path."""

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}
        self.vid, self.job, self.ints, self.fps = array("i"), array("q"), array("q"), array("d")
        self.paths = StringPacker()

    def add(self, r: Any) -> bool:
        """Append record ``r``; False when it is not one the reference reads as plain numbers and strings."""
        try:
            video, raw = r["video_id"], r["path"]
            if type(video) is not str or type(raw) is not str:
                return False
            ints = (int(r["start_frame"]), int(r["frames"]), int(r["width"]), int(r["height"]))
            ints += (int(r.get("bytes", -1)), int(r.get("mtime_ns", -1)))
            job, fps = int(r.get("job", 0)), float(r["fps"])
            self.ints.extend(array("q", ints))
            self.job.append(job)
        except (KeyError, TypeError, ValueError, OverflowError, AttributeError):
            return False
        self.vid.append(self.ids.setdefault(video, len(self.ids)))
        self.fps.append(fps)
        self.paths.add(_norm(raw))
        return True


def _kept_rows(vid: np.ndarray, job: np.ndarray, table: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(rows kept, in order: videos by first appearance, each video's chunks by start; the video numbers in that
    order; each video's first row in the kept rows, + their count) as :func:`dedupe_records`, the frames > 0
    filter and :func:`_record_arrays`' order pick them."""
    newest = np.zeros(int(vid.max(initial=-1)) + 1, np.int64)  # max(0, jobs): dedupe_records' start value
    np.maximum.at(newest, vid, job)
    keep = np.flatnonzero(job == newest[vid])
    order = keep[np.lexsort((keep, table[keep, 0], vid[keep]))]  # by video, start_frame, line
    v, s = vid[order], table[order, 0]
    new_key = np.ones(len(order), bool)
    new_key[1:] = (v[1:] != v[:-1]) | (s[1:] != s[:-1])
    last_of_key = np.ones(len(order), bool)
    last_of_key[:-1] = new_key[1:]
    first, last = order[new_key], order[last_of_key]  # a key's place (its first line), its record (its last)
    live = table[last, 1] > 0
    first, last, v = first[live], last[live], v[last_of_key][live]
    bounds = np.flatnonzero(np.append(True, v[1:] != v[:-1])) if len(v) else np.empty(0, np.int64)
    rank = np.argsort(np.minimum.reduceat(first, bounds)) if len(v) else bounds  # videos by first appearance
    seg = np.repeat(np.arange(len(bounds)), np.diff(np.append(bounds, len(v))))
    inverse = np.empty_like(rank)
    inverse[rank] = np.arange(len(rank))
    rows = last[np.argsort(inverse[seg], kind="stable")]
    counts = np.bincount(inverse[seg], minlength=len(rank))
    return rows, v[bounds][rank], np.append(0, np.cumsum(counts))


def _column_arrays(mpath: Path) -> tuple[dict[str, np.ndarray], dict] | None:
    """:func:`build_manifest_arrays` read line by line into columns; None for a record they cannot hold."""
    problems: list[str] = []
    cols = _Columns()
    for r in iter_manifest_records(mpath, problems):
        if not cols.add(r):
            return None
    table = np.frombuffer(cols.ints, np.int64).reshape(-1, len(_INT_FIELDS))
    vid, job = np.frombuffer(cols.vid, np.int32), np.frombuffer(cols.job, np.int64)
    rows, videos, bounds = _kept_rows(vid, job, table)
    del vid, job
    table = table[rows]
    cols.ints = cols.vid = cols.job = None  # the kept rows are copied: the columns as read go (the build's peak)
    lo, hi = bounds[:-1], bounds[1:]
    info = np.stack([lo, hi, table[hi - 1, 0] + table[hi - 1, 1], table[lo, 2], table[lo, 3]], axis=1)
    names = list(cols.ids)
    paths = take_strings(*cols.paths.arrays(), rows)
    cols.paths = None
    ids = pack_strings(names[v] for v in videos.tolist())
    fps = np.frombuffer(cols.fps, np.float64)[rows]
    return _arrays(table, fps, info.astype(np.int64), ids, paths), {"warnings": problems}


def build_manifest_arrays(mpath: Path) -> tuple[dict[str, np.ndarray], dict]:
    """The arrays of ``mpath``'s chunks (last record per (video, start_frame) of each video's newest job,
    chunks with ``frames`` > 0), videos in order of first appearance, chunks by ``start_frame``.

    Read line by line into compact columns (Ego4D's 865k lines: 0.27 GiB at the peak, as dicts 1.8 GiB);
    a manifest with a record they cannot hold as the dict reading reads it (a missing or non-numeric
    field, a non-string id or path) is read again as dicts, so its error or result is that reading's."""
    return _column_arrays(mpath) or _record_arrays(mpath)


class ChunkView(Sequence[Chunk]):
    """The chunks of one video, rows [lo, hi) of a :class:`FlatManifest`, made on access."""

    __slots__ = ("hi", "lo", "manifest")

    def __init__(self, manifest: FlatManifest, lo: int, hi: int) -> None:
        self.manifest, self.lo, self.hi = manifest, lo, hi

    def __len__(self) -> int:
        return self.hi - self.lo

    def __getitem__(self, k):
        if isinstance(k, slice):
            return [self[j] for j in range(*k.indices(len(self)))]
        n = self.hi - self.lo
        if not -n <= k < n:
            raise IndexError(f"chunk {k} of {n}")
        return self.manifest.chunk(self.lo + (k % n))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and list(self) == list(other)

    def __repr__(self) -> str:
        return repr(list(self))


class FlatVideoEntry(VideoEntry):
    """A :class:`VideoEntry` over a :class:`FlatManifest`: chunks made on access, only their starts copied."""

    def __init__(self, manifest: FlatManifest, v: int) -> None:
        lo, hi, self._num_frames, self._width, self._height = manifest.videos[v].tolist()
        self.video_id = manifest.ids[v]
        self.chunks = ChunkView(manifest, lo, hi)
        self._fps = float(manifest.fps[lo])
        self._starts = manifest.starts[lo:hi].tolist()
        self._lo = lo

    def chunk_last_frame(self, k: int) -> int:
        return self._starts[k] + self.chunks.manifest.frames[self._lo + k] - 1

    @property
    def fps(self) -> float:
        return self._fps

    @property
    def num_frames(self) -> int:
        return self._num_frames

    @property
    def width(self) -> int:
        return self._width

    @property
    def height(self) -> int:
        return self._height


class FlatManifest(Mapping[str, VideoEntry]):
    """``{video_id: VideoEntry}`` over a manifest's flat index; chunk paths absolute as ``load_manifest``'s."""

    def __init__(self, index: MappedIndex, base: Path) -> None:
        a = index.arrays
        self.index, self.base = index, str(base)
        self.starts, self.ints, self.fps, self.videos = a["starts"], a["ints"], a["fps"], a["videos"]
        self.frames = memoryview(self.ints[:, 0])  # Python ints on item reads
        self.paths = Strings(a["path_buf"], a["path_off"])
        self.ids = Strings(a["ids_buf"], a["ids_off"]).tolist()
        self._number = {v: i for i, v in enumerate(self.ids)}
        self._entries: dict[str, FlatVideoEntry] = {}  # made on first use, at most ENTRY_CACHE kept

    def __reduce__(self) -> tuple:
        return FlatManifest, (self.index, Path(self.base))  # the index pickles as its path: no arrays copied

    def chunk(self, j: int) -> Chunk:
        """Chunk row ``j``."""
        frames, width, height, size, mtime = self.ints[j].tolist()
        path = join_path(self.base, self.paths[j])
        return Chunk(path, int(self.starts[j]), frames, float(self.fps[j]), width, height, size, mtime)

    def __getitem__(self, video_id: str) -> VideoEntry:
        entry = self._entries.get(video_id)
        if entry is None:
            if len(self._entries) >= ENTRY_CACHE:
                self._entries.clear()
            entry = self._entries[video_id] = FlatVideoEntry(self, self._number[video_id])
        return entry

    def __contains__(self, video_id: object) -> bool:
        return video_id in self._number

    def __iter__(self) -> Iterator[str]:
        return iter(self.ids)

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def num_chunks(self) -> int:
        return len(self.fps)


def load_manifest_index(mpath: Path) -> FlatManifest:
    """The flat manifest of ``mpath`` (a manifest.jsonl): cached index when valid, else built and cached."""
    index = cached_index("chunks", LAYOUT, [mpath], lambda: build_manifest_arrays(mpath))
    for message in index.meta.get("warnings", []):
        log.warning("%s", message)
    return FlatManifest(index, mpath.parent)


def load_manifest(root: str | Path) -> Mapping[str, VideoEntry]:
    """``{video_id: VideoEntry}`` of ``root/manifest.jsonl``; chunk paths absolute (under the manifest's
    directory). Kept as a flat, memory-mapped index cached beside the manifest
    (:mod:`avion_ds.data.prep.manifest_index`): each video's newest job, the last record per
    (video_id, start_frame), chunks with frames > 0, sorted by start_frame; ValueError naming a bad record."""
    root = Path(root)
    mpath = root / MANIFEST_NAME if root.is_dir() or not root.suffix else root
    if not mpath.is_file():
        raise FileNotFoundError(
            f"no chunk manifest at {mpath} (run `avion-ds chunk SRC DST` first, "
            f"or set data.chunked=false for whole videos)"
        )
    return load_manifest_index(mpath)
