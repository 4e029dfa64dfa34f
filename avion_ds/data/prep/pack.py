"""Pack an existing chunk tree into litdata shards (no re-encoding). An item is a window of a video's
consecutive chunks of about ``item_bytes`` (:mod:`avion_ds.data.prep.pack_windows`: neighbouring windows
share one chunk, and each row goes to the window holding every frame it reads), so a clip's chunks are always
in one item, hence one shard, and a sample reads one bounded item, never a whole long video; the manifest
facts (frames, fps, size, sha256) and, given a recipe, the annotation rows of each split travel inside it.

An item is ``{"video_id": str, "meta": JSON str, "data": bytes}`` (the same three leaves for every item,
whatever its number of chunks or rows): ``meta`` holds ``chunks`` (each chunk's manifest facts, in
start-frame order, their bytes concatenated in ``data``) and ``rows`` (split -> ``[start_frame, end_frame,
label, name, sample]`` per sample the window serves, as the recipe's dataset resolves them from its annotation
file; ``sample`` is its index in that dataset, which keys its clip and crop draws).
A dataset whose labels are drawn per epoch (``ego4d``: one of a narration's phrasings; ``epic_mir``: a caption
drawn by relevancy) gives its own JSON ``label`` (``packed_label``: every candidate) and draws from it when
read from the shards (``draw_label``), with the chunk tree's draws for the same (seed, epoch, sample).
Texts many rows can draw (EPIC-MIR's sentences) are named by number in the rows and stored once per item
(``meta["texts"]``: split -> number -> text, those its rows name: ``shared_texts``).
``index.json`` records each item's row count per split in its shard's entry (``avion_rows``), which
:mod:`avion_ds.data.shards` reads to address samples without opening a shard, and what the rows of each split
were packed for (``avion_labels``: dataset and label kind), which start-up checks against the recipe.
"""

from __future__ import annotations

import hashlib
import json
import logging
import multiprocessing
import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from avion_ds.data.prep.manifest import MANIFEST_NAME, VideoEntry
from avion_ds.data.prep.manifest_index import load_manifest
from avion_ds.data.prep.pack_rows import RowSource, Spans, forget_datasets, item_rows, sample_spans
from avion_ds.data.prep.pack_windows import chunk_windows
from avion_ds.data.prep.shard_index import ROW_LOADER, ROWS_KEY

log = logging.getLogger(__name__)
DEFAULT_SHARD_BYTES = 1 << 30  # ~1 GiB per shard
DEFAULT_ITEM_BYTES = 32 << 20  # a window of a video's chunks: what one sample reads (AVION's 15 s chunks: ~10)
DRAWN_KINDS = ("narration", "retrieval")  # labels drawn per epoch: shards packed for another kind cannot give them
LABELS_KEY = "avion_labels"  # index.json: split -> {"dataset": name, "kind": label kind} the rows were packed for

Labels = dict[str, dict[str, str]]  # split -> {"dataset", "kind"}


_MANIFESTS: dict[str, Mapping[str, VideoEntry]] = {}  # during one pack, in each process: the tree's manifest index


def tree_videos(tree: str | Path) -> Mapping[str, VideoEntry]:
    """The chunk tree's videos as the datasets read them (the flat, memory-mapped manifest index: each video's
    newest job, chunks in start-frame order), read once per pack in each process; not its manifest lines as
    dicts (Ego4D's 865k chunks took 1.5 GiB that way)."""
    key = str(tree)
    if key not in _MANIFESTS:
        _MANIFESTS[key] = load_manifest(tree)
    return _MANIFESTS[key]


def chunk_facts(tree: str | Path, video_id: str, first: int, last: int) -> list[dict]:
    """The manifest facts of chunks ``first`` .. ``last`` of a video, paths relative to ``tree``."""
    chunks = tree_videos(tree)[video_id].chunks[first : last + 1]
    return [
        {"video_id": video_id, "path": os.path.relpath(c.path, tree), "start_frame": c.start_frame}
        | {"frames": c.frames, "fps": c.fps, "width": c.width, "height": c.height}
        for c in chunks
    ]


def video_item(
    group: list[dict], tree: str, rows: Mapping[str, list] | None = None, texts: Mapping[str, dict] | None = None
) -> dict:
    """One shard item: consecutive chunks of a video (their bytes and manifest facts, checksums computed
    here), the rows they serve and the shared texts those rows name (:func:`item_texts`)."""
    blobs = [(Path(tree) / r["path"]).read_bytes() for r in group]
    facts = [
        {k: r[k] for k in ("path", "start_frame", "frames", "fps", "width", "height") if k in r}
        | {"bytes": len(b), "sha256": hashlib.sha256(b).hexdigest()}
        for r, b in zip(group, blobs, strict=True)
    ]
    meta = {"chunks": facts, "rows": dict(rows or {})} | ({"texts": dict(texts)} if texts else {})
    return {"video_id": group[0]["video_id"], "meta": json.dumps(meta), "data": b"".join(blobs)}


@dataclass(frozen=True)
class PackSummary:
    """What a pack wrote: videos, items, rows per split, and the samples left out (one line each)."""

    videos: int
    items: int
    rows: dict[str, int]
    problems: list[str]


Window = tuple[str, int, int, dict[str, np.ndarray]]  # video id, first and last chunk, split -> sample indices


def _item(args: tuple[str, Window, RowSource | None]) -> dict:
    """The item of one window: its chunks, and the rows of its samples made by the recipe's dataset."""
    tree, (video_id, first, last, samples), source = args
    rows, texts = item_rows(source, samples) if source is not None else ({}, {})
    return video_item(chunk_facts(tree, video_id, first, last), tree, rows, texts)


def packed_labels(cfg: Any, splits: tuple[str, ...] = ("train", "val")) -> Labels:
    """split -> the dataset and label kind a recipe's rows are packed for (``index.json``'s ``avion_labels``)."""
    from avion_ds.data.datasets.build import dataset_spec  # lazy: the dataset registry loads torch and decoders

    specs = {s: dataset_spec(cfg, s) for s in splits}
    return {s: {"dataset": spec.name, "kind": spec.label_kind} for s, spec in specs.items()}


def shard_labels_problem(location: str, wants: Labels) -> str | None:
    """:func:`labels_problem` of a local shard location's index.json (start-up); None for a remote one (its
    rows' labels are checked as they are drawn) or one without index.json (the location check names it)."""
    index_path = Path(location) / "index.json"
    if "://" in location or not index_path.is_file():
        return None
    try:
        index = json.loads(index_path.read_text())
    except ValueError:
        return None  # not a litdata index: the location check says so
    return labels_problem(index, wants, str(index_path))


def labels_problem(index: Mapping[str, Any], wants: Labels, where: str) -> str | None:
    """One line when a split's rows in ``index`` (a shard location's index.json) were packed for another dataset
    than the recipe's (their samples and labels are that dataset's), or, not recorded, when the recipe's dataset
    draws its captions per epoch (they need their candidates in the rows); else None."""
    packed = index.get(LABELS_KEY) or {}
    for split, want in wants.items():
        have = packed.get(split)
        if have is None and want["kind"] not in DRAWN_KINDS:
            continue
        if have is not None and have.get("dataset") == want["dataset"]:
            continue
        what = f"its {want['kind']} captions" if want["kind"] in DRAWN_KINDS else f"labels: {want['kind']}"
        source = "without a dataset name" if have is None else f"for data.dataset={have.get('dataset')!r}"
        return (
            f"data.shards: {where} holds {split} rows packed {source}, not for data.dataset={want['dataset']!r} "
            f"({what}); pack with this recipe (avion-ds pack TREE OUT --config RECIPE)"
        )
    return None


def _record_rows(out: Path, counts: Mapping[str, list[int]], items: int, labels: Labels | None = None) -> None:
    """Write each shard's per-item row counts into ``out/index.json`` (items in input order), and what the rows
    were packed for (``labels``)."""
    index_path = out / "index.json"
    index = json.loads(index_path.read_text())
    sizes = [int(c["chunk_size"]) for c in index["chunks"]]
    if sum(sizes) != items:
        raise RuntimeError(f"{index_path}: {sum(sizes)} items written for {items} windows")
    begin = 0
    for entry, size in zip(index["chunks"], sizes, strict=True):
        entry[ROWS_KEY] = {split: c[begin : begin + size] for split, c in counts.items()}
        begin += size
    if labels:
        index[LABELS_KEY] = labels
    if counts:  # litdata then insists on the row-addressing loader (avion_ds.data.shards) for these shards
        index["config"]["item_loader"] = ROW_LOADER
    tmp = index_path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(index))
    os.replace(tmp, index_path)


def pack_tree(
    tree: str | Path,
    out: str | Path,
    shard_bytes: int = DEFAULT_SHARD_BYTES,
    workers: int = 1,
    source: RowSource | None = None,
    labels: Labels | None = None,
    item_bytes: int = DEFAULT_ITEM_BYTES,
) -> PackSummary:
    """Write ``tree``'s chunks as litdata shards of about ``shard_bytes`` under ``out``, in items of about
    ``item_bytes``.

    With ``source`` (a recipe's dataset), every sample it can resolve is placed in the window holding its
    frames (:func:`~avion_ds.data.prep.pack_rows.sample_spans`), each item's rows are made from ``source`` as
    it is written and their counts go to ``index.json``, with ``labels`` (from :func:`packed_labels`).
    Raises ValueError (one line) for a tree without a manifest or a size that is not positive."""
    tree = Path(tree)
    if not (tree / MANIFEST_NAME).is_file():
        raise ValueError(f"{tree}: no {MANIFEST_NAME} (not a chunk tree; run `avion-ds chunk` first)")
    if shard_bytes <= 0 or item_bytes <= 0:
        raise ValueError(f"--shard-bytes={shard_bytes} --item-bytes={item_bytes}: must be positive")
    _MANIFESTS.clear()  # a pack reads the tree and the annotations as they are now, not as an earlier pack did
    forget_datasets()
    videos = tree_videos(tree)
    if not len(videos):
        raise ValueError(f"{tree / MANIFEST_NAME}: no rows")
    spans, problems = sample_spans(source) if source is not None else ({}, [])
    rows = {split: sum(len(v) for v in per_video.values()) for split, per_video in spans.items()}
    items = windows_of(videos, spans, item_bytes)
    del spans  # the windows hold the sample indices (~0.1 GiB less at Ego4D's size while writing)
    if source is not None:
        check_rows_pack(source, items)
    out = Path(out).resolve()
    os.makedirs(out, exist_ok=True)
    inputs = [(str(tree), w, source) for w in items]
    if workers <= 1:
        _write_here(inputs, out, shard_bytes)
    else:
        _write_in_workers(inputs, out, shard_bytes, workers)
    _record_rows(out, {s: [len(w[3][s]) for w in items] for s in rows}, len(items), labels)
    return PackSummary(len(videos), len(items), rows, problems)


def check_rows_pack(source: RowSource, items: list[Window]) -> None:
    """Before anything is written: the first row of each split becomes JSON as an item's rows must (a dataset
    whose labels are not plain values gives them through ``packed_label``); ValueError (one line) naming the
    dataset, the split and the sample otherwise."""
    for split in source.splits:
        first = next(((w[0], w[3][split][:1]) for w in items if len(w[3].get(split, ()))), None)
        if first is None:
            continue
        try:
            json.dumps(item_rows(source, {split: first[1]}))
        except TypeError as e:
            from avion_ds.data.datasets.build import dataset_spec  # lazy: as packed_labels

            raise ValueError(
                f"data.dataset={dataset_spec(source.cfg, split).name!r}: {split} sample {int(first[1][0])} (video {first[0]}) has a label pack "
                f"cannot write into a shard row ({e}); the dataset class gives packable labels by packed_label"
            ) from None


def _write_here(inputs: list[tuple], out: Path, shard_bytes: int) -> None:
    """Write the items in litdata's format in this process, one at a time in input order: no worker process
    (each would import torch and rebuild the recipe's datasets: ~3 GiB more at Ego4D's size), and one item in
    memory, not a shard (:class:`~avion_ds.data.prep.shard_writer.SpoolingWriter`: pending items in a spool
    file under ``out``)."""
    from avion_ds.data.prep.shard_writer import SpoolingWriter  # lazy: litdata is the optional [stream] extra

    for old in [*out.glob("*.bin"), out / "index.json"]:
        old.unlink(missing_ok=True)  # a pack writes its location afresh, as litdata's optimize(mode="overwrite")
    for spool in out.glob(".spool-*"):
        shutil.rmtree(spool, ignore_errors=True)  # a killed pack's
    writer = SpoolingWriter(str(out), chunk_bytes=int(shard_bytes))
    try:
        for k, args in enumerate(inputs):
            writer.add_item(k, _item(args))
    except BaseException:
        writer.close()  # the spool removed; the shards written so far stay without an index.json
        raise
    writer.done()
    writer.merge(1)


def _write_in_workers(inputs: list[tuple], out: Path, shard_bytes: int, workers: int) -> None:
    """Write the items with litdata's ``optimize`` in ``workers`` processes, items in input order."""
    from litdata import optimize  # lazy: litdata is the optional [stream] extra

    start_method = multiprocessing.get_start_method(allow_none=True)
    try:
        optimize(
            fn=_item,
            inputs=inputs,
            output_dir=str(out),
            chunk_bytes=int(shard_bytes),
            num_workers=workers,
            mode="overwrite",
            keep_data_ordered=True,  # items in input order: the row counts follow it
            verbose=False,
        )
    finally:  # litdata sets the process-wide start method to spawn (force=True): later DataLoaders would spawn
        multiprocessing.set_start_method(start_method, force=True)


def windows_of(videos: Mapping[str, VideoEntry], spans: Spans, item_bytes: int) -> list[Window]:
    """Each video's chunk windows (:func:`~avion_ds.data.prep.pack_windows.chunk_windows`) with the samples
    each serves (split -> sample indices), videos by id, windows in frame order."""
    out = []
    empty = np.zeros((0, 3), np.int64)
    for vid in sorted(videos):
        chunks = videos[vid].chunks
        video_rows = {s: v.get(vid, empty) for s, v in spans.items()}
        starts = [c.start_frame for c in chunks]
        sizes = [c.bytes if c.bytes >= 0 else os.path.getsize(c.path) for c in chunks]
        for a, b, mine in chunk_windows(starts, sizes, video_rows, item_bytes):
            out.append((vid, a, b, {s: np.asarray([int(r[2]) for r in rs], np.int64) for s, rs in mine.items()}))
    return out
