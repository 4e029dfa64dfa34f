"""Something-Something V2: ``labels.json`` + ``train.json`` / ``validation.json`` over ``{id}.webm`` videos.

A split file is the official JSON list of ``{"id", "label", "template", "placeholders"}``; the
class of a row is ``labels.json[template without brackets]`` ("Putting [something] onto
[something]" -> "Putting something onto something" -> "95"). ``labels.json`` is
``data.class_list`` or, when empty, the file next to ``data.train_csv``. The sources are VP8/VP9
``.webm``: ``avion-ds chunk`` re-encodes them to H.264 (seeking in webm is unreliable in
decord); the manifest id is the file stem, i.e. the SSv2 ``id``. SSv2 labels name directions
("left to right"), so its recipes turn horizontal flips off (``data.hflip: 0``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar

from avion_ds.config import ConfigError, DataConfig
from avion_ds.data.datasets.csv_rows import split_csv
from avion_ds.data.datasets.protocols import Protocol
from avion_ds.data.datasets.registry import check_class_list, register_dataset
from avion_ds.data.datasets.row_table import RowFields, RowTable
from avion_ds.data.prep.manifest import VideoEntry
from avion_ds.data.sampling import ssv2_test_indices

LABELS_NAME = "labels.json"


def template_class(template: str) -> str:
    """The labels.json key of a template: the placeholders' brackets removed."""
    return template.replace("[", "").replace("]", "")


def load_labels(path: str | Path) -> dict[str, int]:
    """labels.json -> {class text: index}; ValueError naming the file when malformed."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"SSv2 labels file not found: {p} (set data.class_list to labels.json)")
    try:
        raw = json.loads(p.read_text())
        labels = {str(k): int(v) for k, v in raw.items()}
    except (json.JSONDecodeError, AttributeError, TypeError, ValueError) as e:
        raise ValueError(f"{p}: not an SSv2 labels.json mapping of class text to index ({e})") from None
    if sorted(labels.values()) != list(range(len(labels))):
        raise ValueError(f"{p}: class indices are not 0..{len(labels) - 1}")
    return labels


def read_split(path: str | Path, labels: dict[str, int]) -> tuple[Path, list[tuple[int, str, int]]]:
    """train.json / validation.json -> [(position, id, class index)]; ValueError naming the bad entry."""
    p = Path(path)
    if not str(p) or not p.is_file():
        raise FileNotFoundError(f"SSv2 split file not found: {p}")
    try:
        items = json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{p}: not JSON ({e})") from None
    if not isinstance(items, list) or not items:
        raise ValueError(f"{p}: expected a non-empty JSON list of {{id, template}} entries")
    rows = []
    for n, it in enumerate(items, 1):
        if not isinstance(it, dict) or "id" not in it or "template" not in it:
            raise ValueError(f"{p}: entry {n} has no id/template (the test split has no labels)")
        key = template_class(str(it["template"]))
        if key not in labels:
            raise ValueError(f"{p}: entry {n} (id {it['id']}): template {it['template']!r} is not in labels.json")
        rows.append((n, str(it["id"]), labels[key]))
    return p, rows


def ssv2_class_names(cfg: DataConfig, head: str | None) -> tuple[list[str], str] | None:
    """(names in class order, the labels.json read); None without the file."""
    path = Path(cfg.class_list or Path(cfg.train_csv or cfg.val_csv).parent / LABELS_NAME)
    if not path.is_file():
        return None
    labels = load_labels(path)
    return sorted(labels, key=labels.__getitem__), str(path)


@register_dataset
class SSv2Dataset(RowTable):
    """Something-Something V2 classification; label = int (174 classes)."""

    dataset_name = "ssv2"
    eval_protocols: ClassVar[dict[str, Protocol]] = {  # eval.protocol=ssv2: what a published number means
        "ssv2": Protocol(
            "",
            16,
            "segment",
            None,
            2,
            3,
            224,
            "VideoMAE scripts/ssv2/*/finetune.sh: 16 frames segment-based, 2 clips x 3 crops, short side 224",
        )
    }
    label_names = staticmethod(ssv2_class_names)
    eval_segments = staticmethod(ssv2_test_indices)  # VideoMAE's SSv2 test views

    @staticmethod
    def annotation_summary(cfg: DataConfig, split: str) -> tuple[int, int]:
        """(rows, classes) of ``split``'s file without touching a video."""
        return split_summary(cfg, split_csv(cfg, split))

    @staticmethod
    def check_paths(cfg: DataConfig, split: str) -> None:
        """The class list: ``data.class_list`` or a labels.json next to the split files."""
        check_class_list(cfg, split)
        check_labels_file(cfg)

    def read_rows(self, cfg: DataConfig) -> None:
        split_file = self._split_file()
        labels_path = cfg.class_list or str(Path(cfg.train_csv or split_file).parent / LABELS_NAME)
        self.labels = load_labels(labels_path)
        self.num_classes = len(self.labels)
        self.split_path, self.rows = read_split(split_file, self.labels)

    def row_fields(self, i: int) -> RowFields:
        line, vid, _ = self.rows[i]
        return RowFields(self.split_path, line, vid, False, vid)

    def sample_span(self, i: int) -> tuple[VideoEntry, int, int, Any]:
        _, vid, label = self.rows[i]
        entry = self.index.by_id(vid)
        return entry, 0, entry.num_frames, label


def split_summary(cfg: DataConfig, path: str | Path) -> tuple[int, int]:
    """(rows, classes) of an SSv2 split file without touching a video (start-up checks)."""
    labels = load_labels(cfg.class_list or str(Path(cfg.train_csv or path).parent / LABELS_NAME))
    _, rows = read_split(path, labels)
    return len(rows), len(labels)


def check_labels_file(cfg: DataConfig) -> None:
    """ConfigError naming ``data.class_list`` when it is empty and no labels.json lies next to the split files."""
    if not cfg.class_list and not (Path(cfg.train_csv or cfg.val_csv).parent / LABELS_NAME).is_file():
        raise ConfigError(
            f"data.class_list is empty and there is no labels.json next to {cfg.train_csv or cfg.val_csv}: "
            f"set data.class_list to SSv2's labels.json"
        )
