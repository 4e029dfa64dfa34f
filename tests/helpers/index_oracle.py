"""The Python-object annotation index (one ``Chunk`` / tuple / string object per row): the oracle
that the flat, memory-mapped index must reproduce exactly (tests) and the baseline of bench/data_scale.py."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from avion_ds.data.datasets import ego4d
from avion_ds.data.prep.manifest import MANIFEST_NAME, Chunk, VideoEntry, dedupe_records, read_manifest_records


def object_manifest(root: str | Path) -> dict[str, VideoEntry]:
    """``root/manifest.jsonl`` as ``{video_id: VideoEntry}`` of Chunk objects (chunk paths absolute)."""
    root = Path(root)
    mpath = root / MANIFEST_NAME if root.is_dir() or not root.suffix else root
    base = mpath.parent
    by_video: dict[str, list[Chunk]] = {}
    for r in dedupe_records(read_manifest_records(mpath)):
        try:
            chunk = Chunk(
                str(base / r["path"]),
                int(r["start_frame"]),
                int(r["frames"]),
                float(r["fps"]),
                int(r["width"]),
                int(r["height"]),
                int(r.get("bytes", -1)),
                int(r.get("mtime_ns", -1)),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"{mpath}: bad manifest record for video {r.get('video_id')!r}: {e}") from None
        if chunk.frames > 0:
            by_video.setdefault(str(r["video_id"]), []).append(chunk)
    return {vid: VideoEntry(vid, chunks) for vid, chunks in by_video.items()}


def _number(value: Any) -> float:
    if isinstance(value, bool):
        return math.nan
    try:
        out = float(value)
    except (TypeError, ValueError):
        return math.nan
    return out if math.isfinite(out) else math.nan


def _table(path: Path, records: list) -> ego4d.NarrationTable:
    lookup: dict[str, int] = {}
    n = len(records)
    line, vid = np.empty(n, np.int64), np.empty(n, np.int32)
    start, end = np.empty(n, np.float64), np.empty(n, np.float64)
    text: list[Any] = [None] * n
    bad: dict[int, tuple[Any, Any]] = {}
    for k, (row, uid, s, e, narration) in enumerate(records):
        line[k], vid[k] = row, lookup.setdefault(str(uid), len(lookup))
        start[k], end[k] = _number(s), _number(e)
        if math.isnan(start[k]) or math.isnan(end[k]):
            bad[k] = (s, e)
        text[k] = tuple(narration) if isinstance(narration, list) else narration
    return ego4d.NarrationTable([path], np.zeros(n, np.int16), line, list(lookup), vid, start, end, text, bad)


def object_narrations(paths: list[str | Path]) -> ego4d.NarrationTable:
    """The rows of ``paths`` (ConcatDataset order) as Python objects: tuples / strings per row."""
    tables = []
    for path in paths:
        p = Path(path)
        records = ego4d._file_records(p)
        if not records:
            raise ValueError(f"{p}: no narration rows")
        tables.append(_table(p, records))
    if len(tables) == 1:
        return tables[0]
    lookup: dict[str, int] = {}
    vids, bad, offset = [], {}, 0
    for t in tables:
        remap = np.array([lookup.setdefault(u, len(lookup)) for u in t.uids], np.int32)
        vids.append(remap[t.vid])
        bad.update({k + offset: v for k, v in t.bad_times.items()})
        offset += len(t)
    return ego4d.NarrationTable(
        [f for t in tables for f in t.files],
        np.concatenate([t.src + i for i, t in enumerate(tables)]).astype(np.int16),
        np.concatenate([t.line for t in tables]),
        list(lookup),
        np.concatenate(vids),
        np.concatenate([t.start for t in tables]),
        np.concatenate([t.end for t in tables]),
        [x for t in tables for x in t.text],
        bad,
    )


def object_dataset(ds: ego4d.Ego4dDataset, paths: list[str | Path]) -> ego4d.Ego4dDataset:
    """``ds`` with its index replaced by the Python-object one (same rows kept): the oracle of ``ds``."""
    import copy

    old = copy.copy(ds)
    old.index = copy.copy(ds.index)
    if ds.index.chunked:
        old.index.videos = object_manifest(ds.index.root)
    old.table = object_narrations(paths)
    return old
