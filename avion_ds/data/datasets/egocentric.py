"""Zero-shot classification sets as LaViLa's ``eval_zeroshot.py`` reads them: EGTEA Gaze+
(``data.dataset: egtea``) and Charades-Ego (``data.dataset: charades_ego``), annotation files as
their projects release them, clips sampled as LaViLa's ``VideoCaptionDatasetBase.get_raw_item``.

- EGTEA: ``data.val_csv`` is a split file (``test_split1.txt``: ``clip_id action verb noun`` per line,
  1-based action numbers), the class file ``action_idx.txt`` (``Words_Of_Action N`` per line; "" in
  ``data.class_list`` = next to the split file, as LaViLa). Videos ``<root>/<video_id>/<clip_id>.mp4``
  with ``video_id`` = the first three ``-`` fields of the clip id; the whole clip is the span. Clips:
  ``eval.temporal_views`` (LaViLa ``--num-clips``, 10) windows of ``data.num_frames`` frames
  ``data.stride`` apart (``--clip-stride``, 2) starting at ``linspace(0, frames - num_frames * stride)``;
  a clip shorter than ``num_frames * stride`` is zero-padded first (black frames), as LaViLa.
- Charades-Ego: ``data.val_csv`` is ``CharadesEgo_v1_test_only1st.csv`` (columns ``id``, ``actions``
  (``c092 11.90 21.20;...``), ``length`` seconds), the class file ``Charades_v1_classes.txt`` (``c000
  Holding some clothes``); one untrimmed sample per video, frames over ``[0, fps * length)`` by LaViLa's
  ``get_frame_ids`` (``--sparse-sample``: segment midpoints); label a multi-hot float vector. A row whose
  ``length`` is not a positive finite number of seconds (``nan``, ``inf``, ``-5``, text) is named in one
  line, counted (``dataset.bad_rows``) and left out. Where LaViLa's frame ids reach past the video's last
  frame (a ``length`` longer than the file), LaViLa's decord raises and its loader feeds an all-zero clip;
  here the ids are clamped to the last decodable frame (at most ``MAX_CLAMP_FRAMES`` past it, a row reaching
  further is a bad sample, named and left out) and real frames are decoded: such items carry
  ``past_end = 1`` and the evaluation counts them (``num_past_end``).
"""

from __future__ import annotations

import csv
import logging
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch

from avion_ds.config import DataConfig
from avion_ds.data.crop import CropBox
from avion_ds.data.datasets.csv_rows import open_csv
from avion_ds.data.datasets.registry import check_class_list, register_dataset
from avion_ds.data.datasets.row_table import RowFields, RowTable
from avion_ds.data.prep.manifest import VideoEntry
from avion_ds.distributed.dist import is_main

log = logging.getLogger(__name__)

PAD = -1  # a frame index LaViLa fills with zeros (a clip shorter than num_frames x stride)
EGTEA_CLASSES = "action_idx.txt"
CHARADES_CLASSES = "Charades_v1_classes.txt"
CHARADES_REQUIRED = ("id", "actions", "length")


def lavila_frame_ids(start: float, end: float, num_segments: int) -> list[int]:
    """LaViLa's ``get_frame_ids(jitter=False)``: the midpoint of each of ``num_segments`` parts of
    ``(end - start - 1)``, part bounds rounded (``np.round``) and capped at ``end``."""
    seg = float(end - start - 1) / num_segments
    out = []
    for i in range(num_segments):
        first = int(np.round(seg * i) + start)
        last = min(int(np.round(seg * (i + 1)) + start), end)
        out.append(int((first + last) // 2))
    return out


def lavila_stride_clips(frames: int, num_frames: int, stride: int, num_clips: int) -> list[list[int]]:
    """LaViLa's EGTEA test clips: ``num_clips`` windows of ``num_frames`` frames ``stride`` apart, starts
    ``linspace(0, frames - num_frames * stride, num_clips, dtype=int)``; a shorter video is read whole,
    padded with :data:`PAD` to ``num_frames * stride`` and taken every ``stride``, for every clip."""
    span = num_frames * stride
    if frames < span:
        one = (list(range(frames)) + [PAD] * (span - frames))[::stride]
        return [one] * num_clips
    starts = np.linspace(0, frames - span, num_clips, dtype=int)
    return [list(range(int(s), int(s) + span, stride)) for s in starts]


def class_file(cfg: DataConfig, default_name: str) -> Path:
    """``data.class_list``, or ``default_name`` next to ``data.val_csv`` (LaViLa's layout)."""
    return Path(cfg.class_list) if cfg.class_list else Path(cfg.val_csv).parent / default_name


def read_egtea_classes(path: str | Path) -> tuple[list[str], dict[int, int]]:
    """(class names, action number -> class index) of EGTEA's ``action_idx.txt``: the name is the line
    without its last field, ``_`` as spaces, lower case; the index is the line's position (LaViLa's
    ``{label: i}``: a repeated name keeps its last position). ValueError naming a line of another layout."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"EGTEA class file not found: {p} (action_idx.txt; set data.class_list)")
    names, numbers = [], []
    for n, line in enumerate(p.read_text().splitlines(), 1):
        row = line.strip()
        if not row:
            continue
        parts = row.split(" ")
        if len(parts) < 2 or not parts[-1].isdigit():
            raise ValueError(f"{p}:{n}: expected 'Action_Name NUMBER' (EGTEA action_idx.txt), got {row[:60]!r}")
        names.append(" ".join(parts[:-1]).replace("_", " ").lower())
        numbers.append(int(parts[-1]))
    if not names:
        raise ValueError(f"{p}: no classes (expected EGTEA action_idx.txt lines 'Action_Name NUMBER')")
    position = {name: i for i, name in enumerate(names)}
    return names, {num: position[name] for num, name in zip(numbers, names)}


def read_charades_classes(path: str | Path) -> tuple[list[str], dict[str, int]]:
    """(class names, code -> index) of ``Charades_v1_classes.txt``: LaViLa reads each line with a CSV
    reader, the code is the first field's first 4 characters and the name the rest after a space."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"Charades class file not found: {p} (Charades_v1_classes.txt; set data.class_list)")
    names, codes = [], {}
    with p.open(newline="") as f:
        for n, row in enumerate(csv.reader(f), 1):
            if not row or not row[0].strip():
                continue
            text = row[0]
            if len(text) < 6 or text[0] != "c" or not text[1:4].isdigit() or text[4] != " ":
                raise ValueError(f"{p}:{n}: expected 'cNNN Class name' (Charades_v1_classes.txt), got {text[:60]!r}")
            codes[text[:4]] = len(names)
            names.append(text[5:])
    if not names:
        raise ValueError(f"{p}: no classes (expected Charades_v1_classes.txt lines 'cNNN Class name')")
    return names, codes


def _class_file_names(cfg: DataConfig, default_name: str, read: Any) -> tuple[list[str], str] | None:
    """(names, source) of a class file read by ``read``; None without the file."""
    path = class_file(cfg, default_name)
    return (read(path)[0], str(path)) if path.is_file() else None


def egtea_class_names(cfg: DataConfig, head: str | None) -> tuple[list[str], str] | None:
    """(names, source) of EGTEA's action_idx.txt."""
    return _class_file_names(cfg, EGTEA_CLASSES, read_egtea_classes)


def charades_class_names(cfg: DataConfig, head: str | None) -> tuple[list[str], str] | None:
    """(names, source) of Charades' Charades_v1_classes.txt."""
    return _class_file_names(cfg, CHARADES_CLASSES, read_charades_classes)


class _PaddedClips(RowTable):
    """Decoding that fills :data:`PAD` indices (at the end of a clip) with zero frames, as LaViLa."""

    def read_clip(self, entry: VideoEntry, indices: list[int], box: CropBox | None, resize: bool = True):
        real = [i for i in indices if i != PAD]
        frames = super().read_clip(entry, real, box, resize)
        if len(real) == len(indices):
            return frames
        pad = frames.new_zeros((len(indices) - len(real), *frames.shape[1:]))
        return torch.cat([frames, pad])


@register_dataset
class EgteaDataset(_PaddedClips):
    """EGTEA Gaze+ test clips (see module doc); label = the class index."""

    dataset_name = "egtea"
    zero_shot_protocol = "single_label"  # LaViLa: one 106-way head, mean class accuracy and top-1
    label_names = staticmethod(egtea_class_names)
    check_paths = staticmethod(check_class_list)  # data.class_list, when set

    @staticmethod
    def annotation_summary(cfg: DataConfig, split: str) -> tuple[int, dict[str, int]]:
        """(rows, no class check) of the val split (data.val_csv) without opening a video."""
        _, numbers = read_egtea_classes(class_file(cfg, EGTEA_CLASSES))
        return len(read_egtea_split(Path(cfg.val_csv), numbers)), {}

    def read_rows(self, cfg: DataConfig) -> None:
        self.split_file = Path(self._split_file())
        self.class_names, number_to_class = read_egtea_classes(class_file(cfg, EGTEA_CLASSES))
        self.num_classes = len(self.class_names)
        self.rows = read_egtea_split(self.split_file, number_to_class)

    def row_fields(self, i: int) -> RowFields:
        line, rel, _ = self.rows[i]
        return RowFields(self.split_file, line, rel, True, Path(rel).stem)

    def sample_span(self, i: int) -> tuple[VideoEntry, int, int, Any]:
        _, rel, label = self.rows[i]
        entry = self.index.by_path(rel)
        return entry, 0, entry.num_frames, label

    def clip_indices(self, start: int, end: int, rng, view: int) -> list[int]:
        c = self.cfg
        return lavila_stride_clips(end - start, c.num_frames, c.stride, self.temporal_views)[view]


def read_egtea_split(path: Path, number_to_class: dict[int, int]) -> list[tuple[int, str, int]]:
    """(line, video path under root, class index) of each line of an EGTEA split file."""
    if not path.is_file():
        raise FileNotFoundError(f"annotation file not found: {path}")
    rows = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        parts = line.strip().split(" ")
        if not parts[0]:
            continue
        if len(parts) < 2 or not parts[1].isdigit() or parts[0].count("-") < 2:
            raise ValueError(f"{path}:{n}: expected 'CLIP_ID ACTION [VERB NOUN]' (EGTEA split file), got {line[:60]!r}")
        if int(parts[1]) not in number_to_class:
            raise ValueError(f"{path}:{n}: action {parts[1]} is not in the class file")
        video_id = "-".join(parts[0].split("-")[:3])
        rows.append((n, f"{video_id}/{parts[0]}.mp4", number_to_class[int(parts[1])]))
    if not rows:
        raise ValueError(f"{path}: no annotation rows")
    return rows


@register_dataset
class CharadesEgoDataset(RowTable):
    """Charades-Ego untrimmed test videos (see module doc); label = multi-hot float (classes,)."""

    dataset_name = "charades_ego"
    zero_shot_protocol = "multi_label_map"  # LaViLa: mAP over the classes with positives
    label_names = staticmethod(charades_class_names)
    check_paths = staticmethod(check_class_list)  # data.class_list, when set
    past_end_note = "decoded from real frames clamped to the last one; LaViLa feeds an all-zero clip for them"

    @staticmethod
    def annotation_summary(cfg: DataConfig, split: str) -> tuple[int, dict[str, int]]:
        """(usable rows, no class check) of the val split (data.val_csv) without opening a video."""
        _, codes = read_charades_classes(class_file(cfg, CHARADES_CLASSES))
        return len(read_charades_rows(Path(cfg.val_csv), codes)[0]), {}

    def read_rows(self, cfg: DataConfig) -> None:
        codes = self.load_eval_targets(cfg)
        self.csv = Path(self._split_file())
        self.rows, self.bad_rows = read_charades_rows(self.csv, codes)
        if self.bad_rows and is_main():  # once per job, not per rank
            log.warning(
                "%s: %d of %d rows left out (length not a positive finite number of seconds); first: %s",
                self.csv,
                len(self.bad_rows),
                len(self.rows) + len(self.bad_rows),
                self.bad_rows[0],
            )

    def load_eval_targets(self, cfg: DataConfig) -> dict[str, int]:
        """The class names (``data.class_list``, or the class file next to ``data.val_csv``), over the chunk tree
        and from shards alike (a shard row holds class indices, not names); returns code -> class index."""
        self.class_names, codes = read_charades_classes(class_file(cfg, CHARADES_CLASSES))
        self.num_classes = len(self.class_names)
        return codes

    def row_fields(self, i: int) -> RowFields:
        line, r, _, _ = self.rows[i]
        return RowFields(self.csv, line, f"{r['id']}.mp4", True, r["id"])

    def _target(self, labels: list[int]) -> torch.Tensor:
        target = torch.zeros(self.num_classes)
        target[labels] = 1.0
        return target

    def _span(self, i: int) -> tuple[VideoEntry, float]:
        """(video, LaViLa's float frame count ``fps * length``) of row ``i``."""
        _, r, _, length = self.rows[i]
        entry = self.index.by_path(f"{r['id']}.mp4")
        return entry, entry.fps * length

    def sample_span(self, i: int) -> tuple[VideoEntry, int, int, Any]:
        entry, duration = self._span(i)
        self._duration = duration  # LaViLa: a float frame count, read by clip_indices
        return entry, 0, max(1, math.ceil(duration)), self._target(self.rows[i][2])

    def packed_label(self, i: int) -> dict[str, Any]:
        """Row ``i``'s label as a shard row holds it (JSON, exact): its class indices and LaViLa's float frame
        count ``fps * length``, which places its clip's frames (``avion-ds pack``; :meth:`draw_label` reads it)."""
        _, duration = self._span(i)
        return {"classes": [int(k) for k in self.rows[i][2]], "frames": duration}

    def draw_label(self, i: int, value: Any, where: str) -> torch.Tensor:
        """The multi-hot label of a shard row's packed label (:meth:`packed_label`); its frame count is the
        clip's, as :meth:`sample_span` sets it over the chunk tree."""
        self._duration = float(value["frames"])
        return self._target([int(k) for k in value["classes"]])

    def clip_indices(self, start: int, end: int, rng, view: int) -> list[int]:
        ids = lavila_frame_ids(0, getattr(self, "_duration", end), self.cfg.num_frames * self.temporal_views)
        n = self.cfg.num_frames
        return ids[view * n : (view + 1) * n]

    def _load(self, i: int) -> dict:
        item = super()._load(i)
        entry = self.sample_span(i)[0]  # the video and frame count of row i (from the tree or a shard row)
        ids = lavila_frame_ids(0, self._duration, self.cfg.num_frames * self.temporal_views)
        item["past_end"] = int(max(ids) >= entry.num_frames)  # LaViLa: an all-zero clip; here real frames
        return item

    def _placeholder(self, i: int, message: str) -> dict:
        item = super()._placeholder(i, message)
        item["label"] = torch.zeros(self.num_classes)
        item["past_end"] = 0
        return item


def charades_length(value: str) -> float | None:
    """The seconds of a Charades ``length`` field; None unless a positive finite number."""
    try:
        out = float(value)
    except ValueError:
        return None
    return out if math.isfinite(out) and out > 0 else None


def read_charades_rows(path: Path, codes: dict[str, int]) -> tuple[list[tuple[int, dict, list[int], float]], list[str]]:
    """((line, row, class indices, length seconds) of each usable row, ``file:line (id): why`` of each row left
    out for its ``length``); ValueError naming an action code the class file lacks, or no usable row."""
    csv_path, rows = open_csv(path, CHARADES_REQUIRED)
    if not rows:
        raise ValueError(f"{csv_path}: no annotation rows")
    usable, bad = [], []
    for line, r in rows:
        labels = []
        for action in filter(None, r["actions"].split(";")):
            code = action.split(" ")[0]
            if code not in codes:
                raise ValueError(f"{csv_path}:{line}: action {code!r} is not in the class file")
            labels.append(codes[code])
        length = charades_length(r["length"])
        if length is None:
            bad.append(
                f"{csv_path}:{line} ({r['id']}): length {r['length']!r} is not a positive finite number of seconds"
            )
            continue
        usable.append((line, r, labels, length))
    if not usable:
        raise ValueError(f"{csv_path}: none of its {len(rows)} rows has a usable length; first: {bad[0]}")
    return usable, bad
