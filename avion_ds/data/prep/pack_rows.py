"""The annotation rows a pack carries, never all held at once.

Planning the items needs only each sample's video and frame span: numpy arrays, 24 bytes a sample (Ego4D's
4M narrations in ~100 MB, where Python lists of whole rows grew the packing process past 4 GiB). An item's
rows (``[start_frame, end_frame, label, name, sample]``; the label as :func:`row_label` packs it) are made
when the item is written, by the recipe's dataset itself, built once in each packing process from a
:class:`RowSource` (litdata's writer runs in worker processes; the chunk tree's memory-mapped index makes a
rebuild cheap).
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from avion_ds.data.errors import DataError

PACKABLE_KINDS = ("class", "none", "narration", "retrieval")  # drawn kinds: the dataset's packed_label / draw_label
SharedTexts = tuple[Sequence[str], Callable[[Any], Iterable[int]]]  # (texts, the numbers a packed label names)
Spans = dict[str, dict[str, np.ndarray]]  # split -> video id -> (k, 3) int64 [start, end, sample], sample order


@dataclass(frozen=True)
class RowSource:
    """Where a pack's rows come from: a recipe's data config and sections, over the chunk tree ``cfg.root``."""

    cfg: Any
    sections: Mapping[str, Any] | None = None
    splits: tuple[str, ...] = ("train", "val")


_BUILT: dict[bytes, dict[str, Any]] = {}  # during one pack, per process: a source's datasets (by its pickled bytes)
_LAST: list[Any] = [None, None]  # the last source asked for and its datasets: no pickling per item


def forget_datasets() -> None:
    """Drop the datasets built so far (a new pack reads the annotations as they are now)."""
    _BUILT.clear()
    _LAST[:] = [None, None]


def datasets_of(source: RowSource) -> dict[str, Any]:
    """split -> the recipe's dataset over the tree, built once per pack in each process (litdata's worker
    processes get their own copy of ``source`` per item: those are matched by value). ValueError for a
    dataset of another label kind than :data:`PACKABLE_KINDS`."""
    if _LAST[0] is source:
        return _LAST[1]
    key = pickle.dumps(source)  # a cache key only: nothing is unpickled
    if key not in _BUILT:
        from avion_ds.data.datasets.build import split_view  # lazy: the registry loads torch and decoders

        built = {}
        for split in source.splits:
            spec, view = split_view(source.cfg, split, source.sections)
            if spec.label_kind not in PACKABLE_KINDS:
                raise ValueError(
                    f"data.dataset={spec.name!r}: labels of kind {spec.label_kind!r}; pack packs datasets with labels "
                    f"of kind {', '.join(PACKABLE_KINDS)} only"
                )
            built[split] = spec.build(view, split, 1, 1, 0)
        _BUILT[key] = built
    _LAST[:] = [source, _BUILT[key]]
    return _BUILT[key]


def sample_spans(source: RowSource) -> tuple[Spans, list[str]]:
    """(split -> video id -> ``[start, end, sample]`` rows, problems): every sample the dataset would draw, its
    span as the dataset resolves it; a sample it cannot resolve (unknown video, bad times, no caption) is
    left out and named in ``problems``."""
    out: Spans = {}
    problems: list[str] = []
    for split, ds in datasets_of(source).items():
        n = len(ds)
        code, span = np.full(n, -1, np.int32), np.zeros((n, 3), np.int64)
        codes: dict[str, int] = {}
        for i in range(n):
            try:
                entry, start, end, _ = ds.sample_span(i)
            except DataError as e:
                problems.append(f"{split} sample {i}: {e}")
                continue
            code[i] = codes.setdefault(entry.video_id, len(codes))
            span[i] = (int(start), int(end), i)
        kept = np.flatnonzero(code >= 0)
        order = kept[np.argsort(code[kept], kind="stable")]  # by video, samples in order within one
        bounds = np.searchsorted(code[order], np.arange(len(codes) + 1))
        out[split] = {vid: span[order[bounds[c] : bounds[c + 1]]] for vid, c in codes.items()}
    return out, problems


def row_label(ds: Any, i: int, label: Any) -> Any:
    """The label of sample ``i`` as a shard row holds it: the dataset's ``packed_label`` (every candidate of a
    label drawn per epoch), else the fixed label ``sample_span`` gave."""
    packed = getattr(ds, "packed_label", None)
    return label if packed is None else packed(i)


def item_texts(rows: Mapping[str, list], shared: Mapping[str, SharedTexts]) -> dict[str, dict[str, str]]:
    """split -> number -> text of the shared texts an item's ``rows`` name (stored once in its ``meta``)."""
    out = {}
    for split, (texts, names) in shared.items():
        numbers = sorted({int(k) for r in rows.get(split, []) for k in names(r[2])})
        if numbers:
            out[split] = {str(k): texts[k] for k in numbers}
    return out


def item_rows(source: RowSource, samples: Mapping[str, np.ndarray]) -> tuple[dict[str, list], dict[str, dict]]:
    """(split -> rows, shared texts they name) of an item serving ``samples`` (split -> sample indices)."""
    datasets = datasets_of(source)
    rows: dict[str, list] = {}
    shared: dict[str, SharedTexts] = {}
    for split, idx in samples.items():
        ds, out = datasets[split], []
        for i in (int(k) for k in idx):
            entry, start, end, label = ds.sample_span(i)
            try:
                name = ds.row_name(i)
            except NotImplementedError:
                name = f"{entry.video_id}#{i}"
            out.append([int(start), int(end), row_label(ds, i, label), name, i])
        rows[split] = out
        texts = getattr(ds, "shared_texts", lambda: None)()
        if texts is not None:
            shared[split] = texts
    return rows, item_texts(rows, shared)
