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
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import numpy as np

from avion_ds.data.index_cache import MappedIndex, Strings, cached_index, pack_strings
from avion_ds.data.prep.manifest import MANIFEST_NAME, Chunk, VideoEntry, dedupe_records, read_manifest_records

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


def build_manifest_arrays(mpath: Path) -> tuple[dict[str, np.ndarray], dict]:
    """The arrays of ``mpath``'s chunks (last record per (video, start_frame) of each video's newest job,
    chunks with ``frames`` > 0), videos in order of first appearance, chunks by ``start_frame``."""
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
    arrays = {
        "starts": np.ascontiguousarray(table[:, 0]),
        "ints": np.ascontiguousarray(table[:, 1:]),
        "fps": np.array(fps, np.float64),
        "videos": np.array(videos, np.int64).reshape(len(videos), 5),
        "ids_buf": ids_buf,
        "ids_off": ids_off,
        "path_buf": path_buf,
        "path_off": path_off,
    }
    return arrays, {"warnings": problems}


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
