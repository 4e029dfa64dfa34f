"""``data.dataset: epic_mir``: EPIC-KITCHENS-100 multi-instance retrieval (MIR) clips and targets.

Rows are those of ``EPIC_100_retrieval_{train,test}.csv`` as released (AVION's reader uses
``video_id``, ``start_timestamp``, ``stop_timestamp`` and ``narration``; ``narration_id`` names the
row). Frames as :class:`~avion_ds.data.datasets.epic.EpicDataset` spans them (the video's own frame
rate, AVION's cap at the last frame of the chunk holding the stop time), sampled by AVION's
``get_frame_ids``: segment midpoints at eval, plus a uniform jitter of +- half a segment in training.

Label ``{"tokens": LongTensor (77,), "row": int, "relevancy": float}``: ``row`` is the row's 0-based
position in the CSV (the relevancy matrix's row, kept when rows are dropped up front). At eval, and
in training without ``epic_mir.train_relevancy``, the tokens are the row's own narration (relevancy 1).
With ``epic_mir.train_sentences`` + ``epic_mir.train_relevancy`` a training clip's caption is drawn as AVION's
MIR fine-tuning does: uniformly among the sentences whose relevancy to the row is > 0.1 (seeded by
(seed, epoch, index)), ``relevancy`` its value.

:func:`load_mir_targets` gives what the MIR metrics need: AVION's column order
(``indexes = [video_id.tolist().index(elem) for elem in text_id]``) and the relevancy matrix. AVION's
relevancy pickles hold a numpy array; a pickled list of lists is converted to a float64 array and the
start-up data line says so (key, file, shape). Rows repeating an earlier row (same ``video_id``, start,
stop and narration) are kept, each being a relevancy-matrix row that AVION reads too, and said in one
line at load: their count and the first with the row it repeats.

From shards (``data.shards``): a packed row holds its matrix row and what its caption is drawn from
(:meth:`EpicMirDataset.packed_label`), drawn as from the annotation files; MIR scoring reads the whole
relevancy matrix from the files (:meth:`EpicMirDataset.load_eval_targets`).
"""

from __future__ import annotations

import base64
import csv
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from avion_ds.config import ConfigError, DataConfig, rename_key
from avion_ds.data.crop import clip_rng
from avion_ds.data.datasets.csv_rows import not_utf8, open_csv, split_csv
from avion_ds.data.datasets.epic import epic_seconds, epic_video
from avion_ds.data.datasets.narration_tokens import check_tokenizer, empty_tokens, text_tokens
from avion_ds.data.datasets.registry import check_file_key, register_dataset
from avion_ds.data.datasets.row_table import MidpointRows, RowFields
from avion_ds.data.errors import DataError, KeyedInputError
from avion_ds.data.prep.manifest import VideoEntry
from avion_ds.data.safe_pickle import load_pickle
from avion_ds.data.sampling import segment_span
from avion_ds.distributed.dist import is_main

log = logging.getLogger(__name__)


@dataclass
class EpicMirKeys:
    """EPIC-100 MIR's own recipe keys (section ``epic_mir``): the sentence / relevancy pair of each split."""

    train_sentences: str = ""  # EPIC_100_retrieval_train_sentence.csv
    train_relevancy: str = ""  # caption_relevancy_EPIC_100_retrieval_train.pkl
    val_sentences: str = ""  # EPIC_100_retrieval_test_sentence.csv
    val_relevancy: str = ""  # caption_relevancy_EPIC_100_retrieval_test.pkl


for _key in ("train_sentences", "train_relevancy", "val_sentences", "val_relevancy"):
    rename_key(f"data.{_key}", f"epic_mir.{_key}")


def check_mir_files(cfg: DataConfig, split: str) -> None:
    """The split's sentence and relevancy files come as a pair and exist; ConfigError naming the key."""
    sentences, relevancy = getattr(cfg, f"{split}_sentences"), getattr(cfg, f"{split}_relevancy")
    if bool(sentences) != bool(relevancy):
        empty = f"epic_mir.{split}_relevancy" if sentences else f"epic_mir.{split}_sentences"
        raise ConfigError(f"{empty} is empty but its pair is set; retrieval targets need both files")
    check_file_key(f"epic_mir.{split}_sentences", sentences)
    check_file_key(f"epic_mir.{split}_relevancy", relevancy)


MIR_REQUIRED = ("narration_id", "video_id", "start_timestamp", "stop_timestamp", "narration")
POSITIVE_RELEVANCY = 0.1  # AVION: a caption is a positive of a clip when its relevancy is above this
CAPTION_STREAM = 7933  # the clip generator's "view" slot reserved for the caption draw


@dataclass
class MirTargets:
    """What EPIC-100 MIR scoring needs beside the embeddings."""

    columns: np.ndarray  # int64 (sentences,): the CSV row of each sentence, in the sentence file's order
    relevancy: np.ndarray  # float (rows, sentences): relevancy of sentence j to CSV row i
    sentence_ids: list[str]  # first column of the sentence file
    sentences: list[str]  # second column of the sentence file (the caption text)
    row_ids: list[str] = field(default_factory=list)  # first column of the CSV (narration_id), by row
    note: str = ""  # what loading changed (a pickled list converted to an array), for the start-up data line


def first_columns(path: str | Path, columns: int = 1) -> list[list[str]]:
    """The first ``columns`` fields of every data row of a CSV (header skipped), as pandas' ``.values``
    sees them; ValueError naming the file and line of a short row."""
    p = Path(path)
    if not str(path) or not p.is_file():
        raise FileNotFoundError(f"file not found: {p}")
    with p.open(newline="", encoding="utf-8") as f:
        reader = csv.reader(f)
        try:
            if next(reader, None) is None:
                raise ValueError(f"{p}: empty file (expected a header and rows)")
            out = []
            for fields in reader:
                if not fields:
                    continue
                if len(fields) < columns:
                    raise ValueError(f"{p}:{reader.line_num}: expected at least {columns} columns, got {len(fields)}")
                out.append([x.strip() for x in fields[:columns]])
        except UnicodeDecodeError as e:
            raise not_utf8(p, e) from None
    return out


@contextmanager
def _named(key: str | None) -> Iterator[None]:
    """Errors of the file behind recipe key ``key`` re-raised as :class:`KeyedInputError` starting with it."""
    try:
        yield
    except (ValueError, FileNotFoundError) as e:
        if key is None or isinstance(e, KeyedInputError):
            raise
        raise KeyedInputError(f"{key}: {e}") from None


def _relevancy_matrix(path: str | Path) -> tuple[np.ndarray, str]:
    """(the relevancy pickle as a 2-D float array, read with the restricted unpickler; a note when it was not
    a numpy array and was converted)."""
    raw = load_pickle(path)
    kind = "" if isinstance(raw, np.ndarray) else type(raw).__name__
    try:
        rel = np.asarray(raw)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{path}: not a relevancy matrix ({e})") from None
    if rel.ndim != 2 or not np.issubdtype(rel.dtype, np.number):
        raise ValueError(f"{path}: expected a 2-D numeric relevancy matrix, got {rel.dtype} of shape {rel.shape}")
    rel = rel if np.issubdtype(rel.dtype, np.floating) else rel.astype(np.float64)
    for bad, what in ((~np.isfinite(rel), "NaN or infinite"), (rel < 0, "negative")):
        if bad.any():
            i, j = (int(k) for k in np.argwhere(bad)[0])
            raise ValueError(
                f"{path}: {int(bad.sum())} {what} relevancy value(s), first at row {i}, sentence {j} "
                f"({rel[i, j]}); relevancies are finite and >= 0"
            )
    note = f"{path}: a pickled {kind} (AVION's hold a numpy array), converted to a {rel.dtype} {rel.shape} array"
    return rel, note if kind else ""


def check_exact_matches(rel: np.ndarray, path: str | Path) -> None:
    """Every row (video) and column (sentence) of an evaluation relevancy matrix has a relevancy of exactly
    1 (its own narration): the MIR metrics divide by the count of those. ValueError naming the first."""
    for axis, what in ((1, "row (video)"), (0, "column (sentence)")):
        empty = np.flatnonzero(~(rel == 1).any(axis=axis))
        if empty.size:
            raise ValueError(
                f"{path}: relevancy {what} {int(empty[0])} has no entry equal to 1 ({empty.size} such); "
                "every clip and sentence of the MIR test matrix matches itself exactly"
            )


def load_mir_targets(
    csv_path: str | Path,
    sentence_csv: str | Path,
    relevancy_pkl: str | Path,
    keys: tuple[str, str, str] | None = None,
    evaluation: bool = False,
) -> MirTargets:
    """AVION's MIR targets: the CSV row of each sentence (first-column match, first occurrence) and the
    relevancy matrix (rows of ``csv_path`` x sentences of ``sentence_csv``), shapes and values checked
    (one line; ``evaluation``: every row and column has an exact match, :func:`check_exact_matches`).
    ``keys``: the recipe keys of the three files; an error then starts with the key of the file at fault."""
    csv_key, sentence_key, relevancy_key = keys or (None, None, None)
    with _named(csv_key):
        row_ids = [r[0] for r in first_columns(csv_path)]
    with _named(sentence_key):
        sentence_rows = first_columns(sentence_csv, 2)
        first: dict[str, int] = {}
        for n, rid in enumerate(row_ids):
            first.setdefault(rid, n)
        columns = []
        for n, (sid, _) in enumerate(sentence_rows):
            if sid not in first:
                raise ValueError(f"{sentence_csv}: sentence row {n + 1} ({sid}) names no row of {csv_path}")
            columns.append(first[sid])
    with _named(relevancy_key):
        rel, note = _relevancy_matrix(relevancy_pkl)
        want = (len(row_ids), len(sentence_rows))
        if rel.shape != want:
            raise ValueError(
                f"{relevancy_pkl}: relevancy matrix of shape {rel.shape} does not match {csv_path} ({want[0]} rows) "
                f"x {sentence_csv} ({want[1]} sentences), expected {want}"
            )
        if evaluation:
            check_exact_matches(rel, relevancy_pkl)
    columns_array = np.asarray(columns, np.int64)
    sentence_ids, sentences = [s for s, _ in sentence_rows], [t for _, t in sentence_rows]
    note = f"{relevancy_key}: {note}" if note and relevancy_key else note
    return MirTargets(columns_array, rel, sentence_ids, sentences, row_ids, note)


@register_dataset
class EpicMirDataset(MidpointRows):
    """EPIC-100 MIR clips (see module doc); label = ``{"tokens", "row", "relevancy"}``."""

    dataset_name = "epic_mir"
    label_kind = "retrieval"  # video-text pairs with a caption relevancy matrix: MIR
    dataset_section = EpicMirKeys
    check_paths = staticmethod(check_mir_files)

    @staticmethod
    def annotation_summary(cfg: DataConfig, split: str) -> tuple[int, dict[str, int]]:
        """(rows, no classes) of ``split``'s MIR CSV without opening a video."""
        return mir_summary(split_csv(cfg, split))

    def read_rows(self, cfg: DataConfig) -> None:
        check_tokenizer()  # a missing tokenizer extra is a one-line error now, not in a DataLoader worker
        self.csv, rows = open_csv(self._split_file(), MIR_REQUIRED)
        if not rows:
            raise ValueError(f"{self.csv}: no annotation rows")
        self.rows = [(pos, line, r) for pos, (line, r) in enumerate(rows)]
        if not self.train:  # an evaluation row that cannot be sampled would only fail after training
            for pos, line, r in self.rows:
                try:
                    epic_seconds(r, f"{self.csv}:{line} ({r['narration_id']})")
                except DataError as e:
                    raise ValueError(str(e)) from None
        self.num_classes = 0
        self.targets: MirTargets | None = None  # training: captions drawn by relevancy
        self.mir_targets: MirTargets | None = None  # evaluation: what the MIR metrics score against
        split_key = "train" if self.train else "val"
        sentences, relevancy = getattr(cfg, f"{split_key}_sentences"), getattr(cfg, f"{split_key}_relevancy")
        if sentences or relevancy:
            if not (sentences and relevancy):
                missing = f"epic_mir.{split_key}_relevancy" if sentences else f"epic_mir.{split_key}_sentences"
                raise ValueError(f"{missing} is empty: the MIR files come as a pair (sentences and relevancy)")
            keys = (f"data.{split_key}_csv", f"epic_mir.{split_key}_sentences", f"epic_mir.{split_key}_relevancy")
            loaded = load_mir_targets(self.csv, sentences, relevancy, keys, evaluation=not self.train)
            if self.train:
                self.targets = loaded
            else:
                self.mir_targets = loaded
        say_duplicates(self.csv, self.rows)

    def load_eval_targets(self, cfg: DataConfig) -> None:
        """The MIR targets of a dataset reading its rows and captions from shards (``data.shards``): scoring needs
        the whole relevancy matrix, not a row's captions, so evaluation reads ``data.val_csv``,
        ``epic_mir.val_sentences`` and ``epic_mir.val_relevancy`` as from the chunk tree (the pair unset:
        contrastive accuracies). KeyedInputError (one line) for the pair set without ``data.val_csv``."""
        self.targets = self.mir_targets = None
        if self.train or not (cfg.val_sentences or cfg.val_relevancy):
            return
        if not (cfg.val_csv and cfg.val_sentences and cfg.val_relevancy):
            raise KeyedInputError(
                "epic_mir.val_relevancy: MIR scoring with data.shards reads the whole relevancy matrix from "
                "data.val_csv, epic_mir.val_sentences and epic_mir.val_relevancy (not from the shards); set all three"
            )
        keys = ("data.val_csv", "epic_mir.val_sentences", "epic_mir.val_relevancy")
        self.mir_targets = load_mir_targets(cfg.val_csv, cfg.val_sentences, cfg.val_relevancy, keys, evaluation=True)

    def startup_line(self) -> str:
        """The base line, plus what loading the relevancy file changed (a pickled list converted)."""
        loaded = self.targets or self.mir_targets
        return super().startup_line() + (f"; {loaded.note}" if loaded is not None and loaded.note else "")

    def row_fields(self, i: int) -> RowFields:
        _, line, r = self.rows[i]
        return RowFields(self.csv, line, r["video_id"], False, r["narration_id"])

    def _where(self, i: int) -> str:
        _, line, r = self.rows[i]
        return f"{self.csv}:{line} ({r['narration_id']})"

    def sample_span(self, i: int) -> tuple[VideoEntry, int, int, Any]:
        _, _, r = self.rows[i]
        where = self._where(i)
        start_s, stop_s = epic_seconds(r, where)
        caption, relevancy = self.caption(i)
        entry = epic_video(self.index, r, where)
        start, end = segment_span(start_s, stop_s, entry)
        return entry, start, end, (caption, relevancy, int(self.rows[i][0]))

    def caption(self, i: int) -> tuple[str, float]:
        """(caption text, relevancy) of sample ``i``: its narration, or a drawn relevant sentence (module doc)."""
        pos, _, r = self.rows[i]
        if self.targets is None:
            if not r["narration"]:
                raise DataError(f"{self._where(i)}: empty narration")
            return r["narration"], 1.0
        rel = self.targets.relevancy[pos]
        positives = np.flatnonzero(rel > POSITIVE_RELEVANCY)
        if not len(positives):
            raise DataError(f"{self._where(i)}: no sentence has relevancy > {POSITIVE_RELEVANCY} to this row")
        j = int(positives[self._caption_draw(i, len(positives))])
        return self.targets.sentences[j], float(rel[j])

    def _caption_draw(self, i: int, n: int) -> int:
        """Which of ``n`` candidate captions sample ``i`` gets this epoch (seeded by (seed, epoch, i))."""
        return int(clip_rng(self.seed, self.epoch, i, CAPTION_STREAM).integers(n))

    def packed_label(self, i: int) -> dict[str, Any]:
        """What ``avion-ds pack`` stores of sample ``i``'s label (JSON): its relevancy-matrix row and what
        :meth:`draw_label` draws each epoch's caption from as :meth:`caption` does: its own narration, or (with
        ``epic_mir.train_relevancy``) the numbers of the sentences above POSITIVE_RELEVANCY grouped by relevancy
        value (``{repr(value): base64 of little-endian int32 numbers}``; the texts once per shard item,
        :meth:`shared_texts`), a few bytes per candidate where EPIC-100 rows have thousands."""
        pos, _, r = self.rows[i]
        if self.targets is None:
            return {"row": int(pos), "narration": r["narration"]}
        rel = self.targets.relevancy[pos]
        numbers = np.flatnonzero(rel > POSITIVE_RELEVANCY)
        groups: dict[str, str] = {}
        for value in np.unique(rel[numbers]):
            chosen = numbers[rel[numbers] == value].astype("<i4")
            groups[repr(float(value))] = base64.b64encode(chosen.tobytes()).decode("ascii")
        return {"row": int(pos), "positives": groups}

    def shared_texts(self) -> tuple[list[str], Any] | None:
        """(the sentences, the sentence numbers a packed label names) when labels name sentences, else None."""
        return None if self.targets is None else (self.targets.sentences, positive_numbers)

    def sentence_text(self, j: int) -> str:
        """The text of sentence ``j`` (a shard dataset reads it from its item)."""
        return self.targets.sentences[j]

    def draw_label(self, i: int, value: Any, where: str) -> tuple[str, float, int]:
        """(caption, relevancy, row) of sample ``i`` this epoch from its packed label (:meth:`packed_label`): the
        sentences in sentence order, one drawn as :meth:`caption` draws."""
        if not isinstance(value, dict) or "row" not in value or not (value.get("narration") or value.get("positives")):
            raise DataError(f"{where}: the shard row holds no epic_mir caption (pack with an epic_mir recipe)")
        if value.get("narration"):
            return value["narration"], 1.0, int(value["row"])
        groups = [(float(v), _numbers(b)) for v, b in value["positives"].items()]
        numbers = np.concatenate([n for _, n in groups])
        values = np.concatenate([np.full(len(n), v) for v, n in groups])
        order = np.argsort(numbers, kind="stable")
        k = int(order[self._caption_draw(i, len(order))])
        return self.sentence_text(int(numbers[k])), float(values[k]), int(value["row"])

    def sample_where(self, i: int) -> str:
        """``file:line (narration_id)`` of sample ``i``, for messages."""
        return self._where(i)

    def _load(self, i: int) -> dict:
        item = super()._load(i)
        caption, relevancy, row = item["label"]
        item["label"] = {"tokens": text_tokens(caption, self.sample_where(i)), "row": row, "relevancy": relevancy}
        return item

    def _placeholder(self, i: int, message: str) -> dict:
        item = super()._placeholder(i, message)
        row = int(self.rows[i][0]) if 0 <= i < len(self.rows) else -1
        item["label"] = {"tokens": empty_tokens(), "row": row, "relevancy": 0.0}
        return item


def _numbers(encoded: str) -> np.ndarray:
    """The sentence numbers of one relevancy group of a packed label (base64 of little-endian int32)."""
    return np.frombuffer(base64.b64decode(encoded), "<i4")


def positive_numbers(label: Any) -> list[int]:
    """The sentence numbers a packed training label names (none for a row's own narration)."""
    groups = label.get("positives") or {} if isinstance(label, dict) else {}
    return [int(j) for b in groups.values() for j in _numbers(b)]


def say_duplicates(path: Path, rows: list[tuple[int, int, dict]]) -> int:
    """Count the rows repeating an earlier row (same video_id, start, stop, narration) and name the first in
    one log line (rank 0); they are kept (module doc). Returns the count."""
    seen: dict[tuple[str, ...], tuple[int, str]] = {}
    count, first = 0, ""
    for _, line, r in rows:
        key = (r["video_id"], r["start_timestamp"], r["stop_timestamp"], r["narration"])
        at, name = seen.setdefault(key, (line, r["narration_id"]))
        if at != line:
            count += 1
            first = first or f"{path}:{line} ({r['narration_id']}) repeats {path}:{at} ({name})"
    if count and is_main():
        log.warning(
            "%s: %d duplicate rows (same video_id, start, stop and narration as an earlier row), kept: each is a "
            "relevancy-matrix row and AVION reads every row; first: %s",
            path,
            count,
            first,
        )
    return count


def mir_summary(path: str | Path) -> tuple[int, dict[str, int]]:
    """(rows, no classes) of a MIR CSV without opening a video (start-up checks)."""
    _, rows = open_csv(path, MIR_REQUIRED)
    if not rows:
        raise ValueError(f"{path}: no annotation rows")
    return len(rows), {}
