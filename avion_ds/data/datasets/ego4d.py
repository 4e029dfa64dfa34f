"""``data.dataset: ego4d``: Ego4D narration clips for video-text pretraining (AVION / LaViLa).

Rows ``(video_uid, start_sec, end_sec, narration)`` come from ``data.train_csv`` / ``data.val_csv``
and, for training, every ``ego4d.aux_train`` file appended after them (AVION's ``ConcatDataset`` of
``--train-metadata-aux``). Accepted files:

- AVION's pickle (``ego4d_train.pkl``, the rephraser / narrator pickles): a list of tuples
  ``(video_uid, start_sec, end_sec, narration, ...)``, read with the restricted unpickler
  (:mod:`avion_ds.data.safe_pickle`; numpy scalars are fine, code is refused);
- CSV with columns ``video_uid,start_sec,end_sec,narration``;
- JSON lines with the same keys.

``narration`` is a string or a list of strings (the LLM rephraser's), of which one is drawn per
sample from the clip generator keyed by (seed, epoch, index), so every epoch can see another
phrasing; validation draws with epoch 0. A row is named ``file:N`` (N = 1-based row of a pickle,
the line of a CSV / JSONL file). A file that is not such a list, a row without the four fields, a
JSONL line that is not JSON fail at construction (one line naming file:N); a row whose times are
not numbers, that are negative, whose end is before its start, or whose narration is empty is a bad sample
(:class:`DataError`: skipped or raised under ``data.on_error``, quarantined by ``avion-ds check``).
Rows repeating an earlier row (same video, start, end and narration) are kept, as AVION and LaViLa read
every row, and said in one line at load: their count and the first with the row it repeats.

Videos resolve by ``video_uid`` as EPIC's ``video_id`` does (:meth:`VideoIndex.by_id`: the chunk
manifest's id, or the stem of a whole video). Frames: AVION's ``get_frame_ids`` over
``[round(start * fps), round(end * fps))`` with ``fps`` = ``data.fps`` (> 0; AVION reads Ego4D at 30)
or the video's own rate, capped at the last frame of the chunk holding the end (AVION's chunked
``video_loader``): segment midpoints, plus a uniform jitter of +- half a segment in training
(:func:`~avion_ds.data.sampling.jittered_midpoints`). Label: ``{"tokens": LongTensor (77,)}``.

From shards (``data.shards``): ``avion-ds pack`` stores each row's narration or whole list
(:meth:`Ego4dDataset.packed_label`) and the same draw picks each epoch's (:meth:`Ego4dDataset.draw_label`).
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from avion_ds.config import DataConfig, rename_key
from avion_ds.data.crop import clip_rng
from avion_ds.data.datasets.csv_rows import not_utf8, open_csv
from avion_ds.data.datasets.flat_index import NarrationTexts, Unreadable, load_narration_index, narration_columns
from avion_ds.data.datasets.flat_index import short_repr as _short
from avion_ds.data.datasets.narration_tokens import check_tokenizer, empty_tokens, text_tokens
from avion_ds.data.datasets.registry import check_file_key, register_dataset
from avion_ds.data.datasets.row_table import MidpointRows, RowFields
from avion_ds.data.errors import DataError
from avion_ds.data.index_cache import MappedIndex
from avion_ds.data.prep.manifest import VideoEntry
from avion_ds.data.safe_pickle import NotASequence, iter_pickle_items
from avion_ds.data.sampling import segment_span
from avion_ds.distributed.dist import is_main

log = logging.getLogger(__name__)
NARRATION_KEYS = ("video_uid", "start_sec", "end_sec", "narration")


@dataclass
class Ego4dKeys:
    """Ego4D's own recipe keys (section ``ego4d``)."""

    aux_train: list[str] = field(default_factory=list)  # extra narration files appended to data.train_csv's


rename_key("data.aux_train", "ego4d.aux_train")


def check_aux_files(cfg: DataConfig, split: str) -> None:
    """Every ``ego4d.aux_train`` file of the train split exists; ConfigError naming the key and the path."""
    if split == "train":
        for k, path in enumerate(cfg.aux_train):
            check_file_key(f"ego4d.aux_train[{k}]", path)


TEXT_STREAM = 7927  # the clip generator's "view" slot reserved for the narration draw
PICKLE_SUFFIXES = (".pkl", ".pickle")
JSONL_SUFFIXES = (".jsonl", ".json")


@dataclass
class NarrationTable:
    """Narration rows of one or more files, stored by column in a memory-mapped index (shared pages)."""

    files: list[Path]
    src: np.ndarray  # file number of each row
    line: np.ndarray  # row N of its file (1-based pickle row, CSV / JSONL line)
    uids: list[str]  # distinct video uids
    vid: np.ndarray  # index into uids
    start: np.ndarray  # seconds (nan: not a number; raw value in ``bad_times``)
    end: np.ndarray
    text: Sequence[Any]  # narration as read: a string or a tuple of strings (checked when drawn)
    bad_times: Mapping[int, tuple[Any, Any]] = field(default_factory=dict)
    index: MappedIndex | None = None  # the mapped file of the columns (pickles as its path)

    def __reduce__(self) -> tuple:
        if self.index is None:
            return super().__reduce__()
        return _mapped_table, (self.index, self.files)

    def __len__(self) -> int:
        return len(self.text)

    def where(self, k: int) -> str:
        """``file:N (video_uid)`` of row ``k``."""
        return f"{self.files[int(self.src[k])]}:{int(self.line[k])} ({self.uids[int(self.vid[k])]})"


def _pickle_rows(path: Path) -> Iterator[tuple[int, Any, Any, Any, Any]]:
    """The ``(row, uid, start, end, narration)`` records of an AVION pickle, one at a time, read as a stream
    (:func:`iter_pickle_items`: the 4M Ego4D rows are never all held); a video's uid, which the pickler
    writes once for all of its rows, is the part later rows refer to."""
    try:
        for n, row in enumerate(iter_pickle_items(path, shared=(0,)), 1):  # a video's uid: one object, its rows
            if not isinstance(row, (tuple, list)) or len(row) < 4:
                raise ValueError(
                    f"{path}:{n}: expected a tuple (video_uid, start_sec, end_sec, narration, ...), got {_short(row)}"
                )
            yield n, row[0], row[1], row[2], row[3]
    except NotASequence as e:
        raise ValueError(
            f"{path}: expected a list of (video_uid, start_sec, end_sec, narration, ...) tuples, got {e.type_name}"
        ) from None


def _csv_records(path: Path) -> list[tuple[int, Any, Any, Any, Any]]:
    _, rows = open_csv(path, NARRATION_KEYS)
    return [(n, r["video_uid"], r["start_sec"], r["end_sec"], r["narration"]) for n, r in rows]


def _jsonl_records(path: Path) -> list[tuple[int, Any, Any, Any, Any]]:
    out = []
    with path.open(encoding="utf-8") as f:
        try:
            for n, text in enumerate(f, 1):
                if not text.strip():
                    continue
                try:
                    obj = json.loads(text)
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path}:{n}: not a JSON object ({e.msg})") from None
                if not isinstance(obj, dict):
                    keys = ", ".join(NARRATION_KEYS)
                    raise ValueError(f"{path}:{n}: expected a JSON object with keys {keys}")  # noqa: TRY004 - bad file
                missing = [k for k in NARRATION_KEYS if k not in obj]
                if missing:
                    raise ValueError(f"{path}:{n}: missing key(s) {', '.join(missing)}")
                text_value = obj["narration"]
                out.append((n, obj["video_uid"], obj["start_sec"], obj["end_sec"], text_value))
        except UnicodeDecodeError as e:
            raise not_utf8(path, e) from None
    return out


def _file_format(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix in PICKLE_SUFFIXES:
        return "pickle"
    if suffix in JSONL_SUFFIXES:
        return "jsonl"
    if suffix == ".csv":
        return "csv"
    with path.open("rb") as f:
        head = f.read(1)
    return "pickle" if head == b"\x80" else "jsonl" if head == b"{" else "csv"


def _file_rows(path: Path) -> Iterable[tuple[int, Any, Any, Any, Any]]:
    """The ``(row, uid, start, end, narration)`` records of one narration file, by its format (a pickle's
    one at a time)."""
    kind = _file_format(path)
    return _pickle_rows(path) if kind == "pickle" else _jsonl_records(path) if kind == "jsonl" else _csv_records(path)


def _mapped_table(index: MappedIndex, files: list[Path]) -> NarrationTable:
    return NarrationTable(**narration_columns(index, files), index=index)


def _candidate_rows(t: NarrationTable) -> np.ndarray:
    """Rows sharing (video, start, end, narration kind and byte length) with another row: the only rows that
    can repeat one. One uint64 per row, sorted once (4M rows: 0.2-0.9 s on one core of the CI VM)."""
    text = t.text
    if len(t) < 2:
        return np.empty(0, np.int64)
    if isinstance(text, NarrationTexts):
        off = text.strings.off
        bounds = off if text.one_string_each else off[text.row_str]  # row k: strings row_str[k]..row_str[k+1]
        size, kind = np.diff(bounds), text.kind
    else:
        size, kind = np.array([len(repr(x)) for x in text]), np.zeros(len(t), np.int8)
    h = np.asarray(t.vid).astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    for col, mult in ((t.start, 0xC2B2AE3D27D4EB4F), (t.end, 0x165667B19E3779F9), (size, 0x27D4EB2F165667C5)):
        h ^= np.ascontiguousarray(col).view(np.uint64) * np.uint64(mult)  # wraps mod 2**64
    h ^= np.asarray(kind).astype(np.uint64)
    ordered = np.sort(h)
    repeated = ordered[1:][ordered[1:] == ordered[:-1]]
    return np.flatnonzero(np.isin(h, repeated)) if len(repeated) else np.empty(0, np.int64)


def duplicate_rows(t: NarrationTable) -> tuple[int, int, int]:
    """(rows repeating an earlier row: same video, start, end and narration; the first such row; the row it
    repeats), -1 for none."""
    start, end = np.ascontiguousarray(t.start).view(np.uint64), np.ascontiguousarray(t.end).view(np.uint64)
    seen: dict[tuple, int] = {}
    count, first, original = 0, -1, -1
    for k in _candidate_rows(t).tolist():
        value = t.text[k]
        key = (int(t.vid[k]), int(start[k]), int(end[k]), repr(value) if isinstance(value, Unreadable) else value)
        earlier = seen.setdefault(key, k)
        if earlier != k:
            count += 1
            if first < 0:
                first, original = k, earlier
    return count, first, original


@functools.lru_cache(maxsize=8)
def _read_cached(paths: tuple[str, ...], stats: tuple[tuple[int, ...], ...]) -> NarrationTable:
    files = [Path(p) for p in paths]
    table = _mapped_table(load_narration_index(files, _file_rows), files)
    count, first, original = duplicate_rows(table)
    if count and is_main():  # once per process and file list (this cache), rank 0 only
        log.warning(
            "%s: %d duplicate narration rows (same video, start, end and narration as an earlier row), kept as "
            "AVION / LaViLa read every row; first: %s repeats %s",
            " + ".join(paths),
            count,
            table.where(first),
            table.where(original),
        )
    return table


def read_narration_files(paths: list[str | Path]) -> NarrationTable:
    """The rows of ``paths`` one after another (AVION's ConcatDataset), video uids merged; a flat index
    cached beside the first file (:mod:`~avion_ds.data.datasets.flat_index`), per process per file state
    (size, mtime, ctime, inode: an edit whose mtime is put back still changes the ctime)."""
    stats = []
    for path in paths:
        p = Path(path)
        if not str(path) or not p.is_file():
            raise FileNotFoundError(f"narration file not found: {p}")
        st = p.stat()
        stats.append((st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino))
    return _read_cached(tuple(str(Path(p)) for p in paths), tuple(stats))


def read_narrations(cfg: DataConfig, split: str) -> NarrationTable:
    """The rows of ``split``: ``val_csv``, or ``train_csv`` followed by every ``aux_train`` file."""
    if split == "train":
        if not cfg.train_csv:
            raise ValueError("data.train_csv is empty: set it to the train narration file")
        return read_narration_files([cfg.train_csv, *cfg.aux_train])
    if not cfg.val_csv:
        raise ValueError("data.val_csv is empty: set it to the val narration file")
    return read_narration_files([cfg.val_csv])


def draw_narration(value: Any, rng: np.random.Generator, where: str) -> str:
    """The narration of a row: the string, or one of its list drawn with ``rng``; DataError if empty."""
    if isinstance(value, str):
        if not value.strip():
            raise DataError(f"{where}: empty narration")
        return value
    if isinstance(value, tuple) and value and all(isinstance(x, str) and x.strip() for x in value):
        return value[int(rng.integers(len(value)))]
    raise DataError(f"{where}: narration must be a non-empty string or list of strings, got {_short(value)}")


@register_dataset
class Ego4dDataset(MidpointRows):
    """Ego4D narration clips (see module doc); label = ``{"tokens": LongTensor (77,)}``."""

    dataset_name = "ego4d"
    label_kind = "narration"  # video-text pairs: contrastive pretraining
    dataset_section = Ego4dKeys
    check_paths = staticmethod(check_aux_files)

    @staticmethod
    def annotation_summary(cfg: DataConfig, split: str) -> tuple[int, dict[str, int]]:
        """(rows, no classes) of ``split``'s narration files without opening a video."""
        return narration_summary(cfg, split)

    def read_rows(self, cfg: DataConfig) -> None:
        check_tokenizer()  # a missing tokenizer extra is a one-line error now, not in a DataLoader worker
        self.table = read_narrations(cfg, self.split)
        self.num_classes = 0
        self.rows = np.arange(len(self.table))

    def row_fields(self, i: int) -> RowFields:
        t, k = self.table, int(self.rows[i])
        uid = t.uids[int(t.vid[k])]
        return RowFields(t.files[int(t.src[k])], int(t.line[k]), uid, False, f"{uid} {t.start[k]:g}-{t.end[k]:g}s")

    def _prune(self) -> None:
        """:meth:`VideoClipDataset._prune` by column: videos looked up once per uid, quarantine per named row."""
        t = self.table
        present = np.array([self.index.exists(u) for u in t.uids], bool)
        keep = present[t.vid] if len(t.uids) else np.zeros(len(t), bool)
        for k in np.flatnonzero(~keep):
            path, line = t.files[int(t.src[k])], int(t.line[k])
            self.missing.append(f"{t.where(k)}: video {t.uids[int(t.vid[k])]!r} not found under {self.index.root}")
            self.missing_where.append((path, line))
        if self._quarantine:
            for k in self._quarantine_candidates(keep):
                reason = self._quarantine_reason(int(k), *self.row_ref(int(k)))
                if reason:
                    self.quarantined.append(f"{t.where(k)}: {reason}")
                    keep[k] = False
        self.rows = np.flatnonzero(keep)
        self._report_pruned(len(self.rows), len(t), t.files[0])

    def _quarantine_candidates(self, keep: np.ndarray) -> np.ndarray:
        """Rows (still kept) that quarantine.tsv may name: by annotation row, or by a chunk of their video."""
        t, hit = self.table, np.zeros(len(self.table), bool)
        for f, path in enumerate(t.files):
            prefix = f"{Path(path).resolve()}:"
            named = (key[len(prefix) :] for key in self._quarantine if key.startswith(prefix))
            lines = [int(n) for n in named if n.isdigit()]
            if lines:
                hit |= (t.src == f) & np.isin(t.line, lines)
        bad_videos = [v for v, uid in enumerate(t.uids) if self._video_quarantined(uid)]
        if bad_videos:
            hit |= np.isin(t.vid, bad_videos)
        return np.flatnonzero(hit & keep)

    def _video_quarantined(self, uid: str) -> bool:
        """Whether quarantine.tsv names any file of video ``uid``."""
        return self.index.exists(uid) and any(f in self._quarantine for f in self.index.relative_files(uid))

    def sample_span(self, i: int) -> tuple[VideoEntry, int, int, Any]:
        t, k = self.table, int(self.rows[i])
        where = t.where(k)
        start_s, end_s = float(t.start[k]), float(t.end[k])
        if k in t.bad_times:
            s, e = t.bad_times[k]
            raise DataError(f"{where}: start_sec/end_sec {_short(s)}/{_short(e)} are not numbers")
        if start_s < 0 or end_s < 0:
            raise DataError(f"{where}: start_sec/end_sec {start_s:g}/{end_s:g}: a time before the video's start")
        if end_s < start_s:
            raise DataError(f"{where}: end_sec {end_s:g} is before start_sec {start_s:g}")
        text = self.draw_label(i, t.text[k], where)
        try:
            entry = self.index.by_id(t.uids[int(t.vid[k])])
        except DataError as e:
            raise DataError(f"{where}: {e}") from None
        start, end = segment_span(start_s, end_s, entry, self.cfg.fps)
        return entry, start, end, text

    def draw_label(self, i: int, value: Any, where: str) -> str:
        """The narration of sample ``i`` this epoch (validation: epoch 0) from its row's ``value``: the string,
        or one of its list drawn by (seed, epoch, i); shard datasets draw from the packed value the same way."""
        rng = clip_rng(self.seed, self.epoch if self.train else 0, i, TEXT_STREAM)
        return draw_narration(tuple(value) if isinstance(value, list) else value, rng, where)

    def packed_label(self, i: int) -> str | list[str]:
        """What ``avion-ds pack`` stores of sample ``i``'s label (JSON): the narration, or its whole list of
        phrasings (each epoch draws one, :meth:`draw_label`)."""
        value = self.table.text[int(self.rows[i])]
        return list(value) if isinstance(value, tuple) else value

    def sample_where(self, i: int) -> str:
        """``file:N (video_uid)`` of sample ``i``, for messages."""
        return self.table.where(int(self.rows[i]))

    def _load(self, i: int) -> dict:
        item = super()._load(i)
        item["label"] = {"tokens": text_tokens(item["label"], self.sample_where(i))}
        return item

    def _placeholder(self, i: int, message: str) -> dict:
        item = super()._placeholder(i, message)
        item["label"] = {"tokens": empty_tokens()}
        return item


def narration_summary(cfg: DataConfig, split: str) -> tuple[int, dict[str, int]]:
    """(rows, no classes) of ``split``'s narration files without opening a video (start-up checks)."""
    return len(read_narrations(cfg, split)), {}
