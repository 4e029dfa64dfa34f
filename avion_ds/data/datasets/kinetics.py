"""Kinetics-400/600/700: official annotation CSVs, VideoMAE ``path label`` lists, class indices.

Accepted split files (``data.train_csv`` / ``data.val_csv``):

- the official CSV (``label,youtube_id,time_start,time_end,split``; K400, K600 and K700 share it).
  A row names the video ``{youtube_id}_{time_start:06d}_{time_end:06d}`` (the usual download
  naming, in class folders or flat); a file named just ``{youtube_id}`` is accepted too. Class
  index = position in ``data.class_list`` (one name a line) or, without one, in the sorted label
  names of the train CSV (the convention of the public label maps).
- ``path label`` lines (VideoMAE's lists) or a ``path,label`` CSV (header optional); labels are
  integers, or class names mapped as above.

Rows whose video is not in the chunk manifest / under the root (a real K400 copy lacks 5-10%)
are dropped at start, listed in ``dataset.missing`` and counted in one log line; never a crash.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any, ClassVar

from avion_ds.config import DataConfig
from avion_ds.data.datasets.csv_rows import open_csv, parse_int, split_csv
from avion_ds.data.datasets.protocols import Protocol
from avion_ds.data.datasets.registry import check_class_list, register_dataset
from avion_ds.data.datasets.row_table import RowFields, RowTable
from avion_ds.data.errors import DataError
from avion_ds.data.prep.manifest import VideoEntry

OFFICIAL_COLUMNS = ("label", "youtube_id", "time_start", "time_end")


def kinetics_stem(youtube_id: str, time_start: str | float, time_end: str | float) -> str:
    """The usual file name (no extension) of a Kinetics clip: ``{id}_{start:06d}_{end:06d}``."""
    return f"{youtube_id}_{int(float(time_start)):06d}_{int(float(time_end)):06d}"


def read_video_list(path: str | Path) -> tuple[Path, list[tuple[int, str, str]]]:
    """``path,label`` CSV (header optional) or ``path label`` lines -> [(line, path, label text)]."""
    path = Path(path)
    if not str(path) or not path.is_file():
        raise FileNotFoundError(f"video list not found: {path}")
    lines = [(n, ln.strip()) for n, ln in enumerate(path.read_text().splitlines(), 1) if ln.strip()]
    if not lines:
        raise ValueError(f"{path}: empty video list")
    out: list[tuple[int, str, str]] = []
    if "," in lines[0][1]:
        first = next(csv.reader([lines[0][1]]))
        if parse_int(first[-1]) is None:  # a header row
            _, rows = open_csv(path, ("path", "label"))
            return path, [(n, r["path"], r["label"]) for n, r in rows]
        for n, text in lines:
            fields = next(csv.reader([text]))
            out.append((n, ",".join(fields[:-1]).strip(), fields[-1].strip()))
        return path, out
    for n, text in lines:
        parts = text.rsplit(maxsplit=1)
        out.append((n, parts[0], parts[1] if len(parts) > 1 else ""))
    return path, out


def is_official_csv(path: str | Path) -> bool:
    """True when the file's header has the official Kinetics columns; ValueError for the unlabelled test CSV."""
    with Path(path).open(newline="") as f:
        header = [h.strip() for h in next(csv.reader(f), [])]
    if "youtube_id" in header and "label" not in header:
        raise ValueError(
            f"{path}: an official Kinetics CSV without a label column (the test split is "
            f"unlabelled); train and val need labels"
        )
    return all(c in header for c in OFFICIAL_COLUMNS)


def load_class_list(path: str | Path) -> list[str]:
    """Class names, index = line number (blank lines ignored); ValueError on duplicates."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"data.class_list: file not found: {p}")
    names = [ln.strip() for ln in p.read_text().splitlines() if ln.strip()]
    dup = sorted({n for n in names if names.count(n) > 1})
    if not names or dup:
        raise ValueError(f"{p}: {'duplicate class names ' + ', '.join(dup) if dup else 'no class names'}")
    return names


def _raw_rows(path: str | Path) -> tuple[Path, list[tuple[int, list[str], bool, str]]]:
    """[(line, candidate video refs, refs are paths, label text)] of any accepted split file."""
    if Path(path).is_file() and is_official_csv(path):
        p, rows = open_csv(path, OFFICIAL_COLUMNS)
        out = []
        for n, r in rows:
            if parse_int(r["time_start"]) is None or parse_int(r["time_end"]) is None:
                raise ValueError(f"{p}:{n}: bad time_start/time_end {r['time_start']!r}/{r['time_end']!r}")
            out.append(
                (
                    n,
                    [kinetics_stem(r["youtube_id"], r["time_start"], r["time_end"]), r["youtube_id"]],
                    False,
                    r["label"],
                )
            )
        return p, out
    p, rows = read_video_list(path)
    return p, [(n, [rel], True, lab) for n, rel, lab in rows]


def kinetics_class_names(cfg: DataConfig, head: str | None) -> tuple[list[str], str] | None:
    """(names, source): ``data.class_list``, or the sorted label names of the train CSV; None for integer labels."""
    if cfg.class_list:
        return load_class_list(cfg.class_list), cfg.class_list
    if not cfg.train_csv or not Path(cfg.train_csv).is_file():
        return None
    texts = [lab for *_, lab in _raw_rows(cfg.train_csv)[1]]
    if all(parse_int(t) is not None for t in texts):
        return None  # integer labels: no names
    return sorted(set(texts)), f"the sorted labels of {cfg.train_csv}"


@register_dataset
class KineticsDataset(RowTable):
    """Kinetics-style classification (see module doc); label = int class index."""

    dataset_name = "kinetics"
    eval_protocols: ClassVar[dict[str, Protocol]] = {  # eval.protocol=k400: what a published number means
        "k400": Protocol(
            "",
            16,
            "stride",
            4,
            5,
            3,
            224,
            "VideoMAE scripts/kinetics/*/finetune.sh: 16x4, 5 clips x 3 crops, short side 224",
        )
    }
    label_names = staticmethod(kinetics_class_names)
    check_paths = staticmethod(check_class_list)  # data.class_list, when set
    maps_kinetics710_head = True  # a Kinetics-710 head (VideoMAE V2) maps onto its 400 / 600 / 700 classes

    @staticmethod
    def annotation_summary(cfg: DataConfig, split: str) -> tuple[int, int]:
        """(rows, classes) of ``split``'s list without touching a video."""
        return split_summary(cfg, split_csv(cfg, split))

    def read_rows(self, cfg: DataConfig) -> None:
        self.list_path, raw = _raw_rows(self._split_file())
        self.classes = self._classes(cfg)
        lookup = {name: k for k, name in enumerate(self.classes or [])}
        self.rows: list[tuple[int, str, bool, int | None, str]] = []  # line, ref, by_path, label, label text
        for n, refs, by_path, lab in raw:
            label = parse_int(lab)
            if self.classes is not None and lab in lookup:  # a class name
                label = lookup[lab]
            elif self.classes is not None and label is None:  # neither a known name nor an index
                raise ValueError(
                    f"{self.list_path}:{n}: label {lab!r} is not a known class "
                    f"({cfg.class_list or 'the sorted train labels'})"
                )
            ref = next((r for r in refs if self.index.exists(r, by_path)), refs[0])
            self.rows.append((n, ref, by_path, label, lab))
        if self.classes is not None:
            self.num_classes = len(self.classes)
        else:
            labels = [label for *_, label, _ in self.rows if label is not None]
            if self.split == "train" and cfg.val_csv and Path(cfg.val_csv).is_file():
                labels += [parse_int(lab) or 0 for *_, lab in _raw_rows(cfg.val_csv)[1]]
            elif cfg.train_csv and Path(cfg.train_csv).is_file():
                labels += [parse_int(lab) or 0 for *_, lab in _raw_rows(cfg.train_csv)[1]]
            self.num_classes = max(labels, default=-1) + 1

    def _classes(self, cfg: DataConfig) -> list[str] | None:
        """Class names when labels are names (official CSVs, named lists), else None (integer labels)."""
        if cfg.class_list:
            return load_class_list(cfg.class_list)
        source = cfg.train_csv if cfg.train_csv and Path(cfg.train_csv).is_file() else self._split_file()
        texts = [lab for *_, lab in _raw_rows(source)[1]]
        if all(parse_int(t) is not None for t in texts):
            return None
        return sorted(set(texts))

    def row_fields(self, i: int) -> RowFields:
        line, ref, by_path, _, _ = self.rows[i]
        return RowFields(self.list_path, line, ref, by_path, ref)

    def sample_span(self, i: int) -> tuple[VideoEntry, int, int, Any]:
        line, ref, by_path, label, lab = self.rows[i]
        if label is None or label < 0:
            raise DataError(f"{self.list_path}:{line}: bad label {lab!r} for {ref}")
        entry = self.index.by_path(ref) if by_path else self.index.by_id(ref)
        return entry, 0, entry.num_frames, label


def split_summary(cfg: DataConfig, path: str | Path) -> tuple[int, int]:
    """(rows, classes) of a Kinetics split file without touching a video (start-up checks)."""
    _, raw = _raw_rows(path)
    if not raw:
        raise ValueError(f"{path}: no annotation rows")
    texts = [lab for *_, lab in raw]
    if cfg.class_list:
        names = load_class_list(cfg.class_list)
    elif all(parse_int(t) is not None for t in texts):
        return len(raw), max(parse_int(t) for t in texts) + 1
    else:
        train = cfg.train_csv if cfg.train_csv and Path(cfg.train_csv).is_file() else path
        names = sorted({lab for *_, lab in _raw_rows(train)[1]})
    known = set(names)
    for n, _, _, lab in raw:  # the dataset would refuse it later, after the process group exists
        index = parse_int(lab)
        if lab not in known and (index is None or not 0 <= index < len(names)):
            raise ValueError(
                f"{path}:{n}: label {lab!r} is not a known class ({cfg.class_list or 'the sorted train labels'})"
            )
    return len(raw), len(names)
