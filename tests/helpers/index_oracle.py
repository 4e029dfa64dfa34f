"""The Python-object annotation index (one ``Chunk`` / tuple / string object per row): the oracle
that the flat, memory-mapped index must reproduce exactly (tests) and the baseline of bench/data_scale.py."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from avion_ds.data.datasets import ego4d
from avion_ds.data.datasets.flat_index import finite_or_nan as _number
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
        records = list(ego4d._file_rows(p))
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


WORDS = [
    "picks",
    "up",
    "puts",
    "down",
    "the",
    "a",
    "knife",
    "cup",
    "plate",
    "onion",
    "tap",
    "door",
    "opens",
    "closes",
    "cuts",
    "washes",
    "rinses",
    "holds",
    "moves",
    "looks",
    "at",
    "table",
    "counter",
    "drawer",
    "phone",
    "box",
    "bag",
    "towel",
    "lid",
    "pan",
    "spoon",
    "stirs",
    "pours",
    "water",
    "into",
    "from",
    "on",
]


def write_scale_inputs(
    out: Path,
    videos: int,
    rows: int,
    seed: int = 0,
    chunks: tuple[int, int] = (40, 140),
    mixed: bool = False,
) -> tuple[Path, Path]:
    """An Ego4D-shaped chunk manifest (``videos`` x ``chunks`` chunks of 450 frames at 30 fps, some 449)
    and ``rows`` narrations in AVION's pickle layout (``(video_uid, start, end, narration)``), no videos.

    ``mixed`` adds rephraser lists, numpy scalars, bad times and bad narrations to the rows. Returns
    (chunk directory, pickle path)."""
    import json
    import pickle
    import uuid

    rng = np.random.default_rng(seed)
    root = Path(out) / "chunks"
    root.mkdir(parents=True, exist_ok=True)
    uids = [str(uuid.UUID(bytes=rng.bytes(16))) for _ in range(videos)]
    counts = rng.integers(chunks[0], chunks[1] + 1, videos)
    with (root / "manifest.jsonl").open("w") as f:
        for uid, n in zip(uids, counts.tolist()):
            for k in rng.permutation(n).tolist():  # lines out of order: the index sorts them
                frames = 449 if rng.random() < 0.3 else 450
                rec = {"video_id": uid, "path": f"{uid}/{k * 15}.mp4", "start": k * 15.0, "start_frame": k * 450}
                rec.update(frames=frames, fps=30.0, width=456, height=256, bytes=int(rng.integers(1e6, 9e6)))
                rec.update(mtime_ns=1_700_000_000_000_000_000 + k, source=f"/data/ego4d/{uid}.mp4", job=1)
                f.write(json.dumps(rec, sort_keys=True) + "\n")
    vid = rng.integers(0, videos, rows)
    length = counts[vid] * 15.0
    start = rng.random(rows) * length
    end = start + rng.random(rows) * 3 + 0.2
    words = rng.integers(0, len(WORDS), (rows, 6))
    data: list[tuple] = []
    for r in range(rows):
        text = "#C C " + " ".join(WORDS[w] for w in words[r, : 3 + r % 4])
        data.append((uids[vid[r]], float(start[r]), float(end[r]), text))
    if mixed:
        for r in rng.choice(rows, rows // 10, replace=False).tolist():
            uid, s, e, text = data[r]
            pick = r % 7
            value = [text, text + " again", text.upper()] if pick < 3 else text
            if pick == 3:
                s, e = np.float64(s), np.float32(e)
            elif pick == 4:
                s = "soon" if r % 2 else float("nan")
            elif pick == 5:
                value = [None, ["x"], "  ", [text, ""], ("a", "b"), 7][r % 6]
            elif pick == 6:
                e = s - 1.0
            data[r] = (uid, s, e, value, "extra")
    pkl = Path(out) / "ego4d_train.pkl"
    pkl.write_bytes(pickle.dumps(data, protocol=pickle.HIGHEST_PROTOCOL))
    return root, pkl
