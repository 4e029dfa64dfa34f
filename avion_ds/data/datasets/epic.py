"""EPIC-Kitchens-100 action segments: the official CSV columns, verb + noun labels or AVION's action ids."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from avion_ds.config import DataConfig, rename_key
from avion_ds.data.datasets.csv_rows import open_csv, parse_int
from avion_ds.data.datasets.epic_actions import ActionMap, action_map_from_pairs, map_files
from avion_ds.data.datasets.protocols import Protocol
from avion_ds.data.datasets.registry import check_class_list, register_dataset
from avion_ds.data.datasets.row_table import RowFields, RowTable
from avion_ds.data.datasets.video_index import VideoIndex
from avion_ds.data.errors import DataError
from avion_ds.data.prep.manifest import VideoEntry
from avion_ds.data.sampling import parse_timestamp, segment_span


@dataclass
class EpicKeys:
    """EPIC's own recipe keys (section ``epic``)."""

    label: str = "verb_noun"  # verb_noun (heads verb + noun) | action (ONE head over AVION's verb:noun ids)


rename_key("data.epic_label", "epic.label")

EPIC_CLASS_FILES = {"verb": "EPIC_100_verb_classes.csv", "noun": "EPIC_100_noun_classes.csv"}
EPIC_REQUIRED = ("narration_id", "video_id", "start_timestamp", "stop_timestamp", "verb_class", "noun_class")


def epic_action_map(csv_paths: list[str | Path]) -> ActionMap:
    """AVION's action ids over the EPIC CSVs ``csv_paths`` (train + validation), see
    :mod:`~avion_ds.data.datasets.epic_actions`; FileNotFoundError / ValueError naming a bad file."""
    pairs = []
    for path in csv_paths:
        pairs += [(parse_int(r["verb_class"]), parse_int(r["noun_class"])) for _, r in open_csv(path, EPIC_REQUIRED)[1]]
    return action_map_from_pairs(pairs)


def epic_seconds(r: dict, where: str) -> tuple[float, float]:
    """(start, stop) seconds of an EPIC-100 CSV row (action or retrieval file); DataError naming ``where``."""
    try:
        start_s, stop_s = parse_timestamp(r["start_timestamp"]), parse_timestamp(r["stop_timestamp"])
    except ValueError as e:
        raise DataError(f"{where}: {e}") from None
    if stop_s < start_s:
        raise DataError(
            f"{where}: stop_timestamp {r['stop_timestamp']} is before start_timestamp {r['start_timestamp']}"
        )
    return start_s, stop_s


def epic_video(index: VideoIndex, r: dict, where: str) -> VideoEntry:
    """The manifest entry of an EPIC-100 CSV row's ``video_id``; DataError naming ``where``."""
    try:
        return index.by_id(r["video_id"])
    except DataError as e:
        raise DataError(f"{where}: {e}") from None


def epic_heads(cfg: DataConfig) -> tuple[str, ...]:
    """EPIC's label heads: verb + noun, or AVION's one action head under ``epic.label: action``."""
    return ("action",) if cfg.label == "action" else ("verb", "noun")


def epic_heads_example(cfg: DataConfig) -> dict[str, int]:
    """The ``model.heads`` of the full EPIC-100 (error messages' example): 3806 actions, or 97 verbs + 300 nouns."""
    return {"action": 3806} if cfg.label == "action" else {"verb": 97, "noun": 300}


def epic_summary(cfg: DataConfig, split: str) -> tuple[int, dict[str, int]]:
    """(rows, classes per head) of ``split``'s EPIC CSV without opening a video (start-up checks)."""
    path = cfg.train_csv if split == "train" else cfg.val_csv
    _, rows = open_csv(path, EPIC_REQUIRED)
    if not rows:
        raise ValueError(f"{path}: no annotation rows")
    if cfg.label == "action":
        return len(rows), {"action": len(epic_action_map(map_files(cfg.train_csv, cfg.val_csv)))}
    top = {
        h: max((v for _, r in rows if (v := parse_int(r[f"{h}_class"])) is not None), default=-1) + 1
        for h in ("verb", "noun")
    }
    return len(rows), top


def check_action_count(cfg: DataConfig, have: dict[str, int], want: dict[str, int]) -> str | None:
    """Under ``epic.label: action`` the action head holds exactly the map's actions: ids beyond the
    map would never be a target, fewer rows cannot hold them."""
    if cfg.label != "action" or "action" not in want:
        return None
    n = have.get("action", 0)
    if n == want["action"]:
        return None
    return (
        f"model.heads.action={want['action']} but data.train_csv + data.val_csv make {n} actions "
        f"(AVION's verb:noun map); set model.heads.action={n}"
    )


def epic_class_files(class_list: str, val_csv: str) -> dict[str, Path]:
    """Verb and noun class CSVs: ``data.class_list`` (the verb file, the noun file beside it) or the
    released names next to ``data.val_csv``."""
    if class_list:
        verb = Path(class_list)
        return {"verb": verb, "noun": verb.with_name(verb.name.replace("verb", "noun"))}
    return {h: Path(val_csv).parent / name for h, name in EPIC_CLASS_FILES.items()}


def epic_keys(path: Path) -> list[str]:
    """The ``key`` column of an EPIC-100 class CSV in ``id`` order (ValueError for another layout)."""
    p, rows = open_csv(path, ("id", "key"))
    ids = [parse_int(r["id"]) for _, r in rows]
    if sorted(i for i in ids if i is not None) != list(range(len(rows))):
        raise ValueError(f"{p}: expected ids 0..{len(rows) - 1} in column 'id' (EPIC-100 class file)")
    keys = [""] * len(rows)
    for i, (_, r) in zip(ids, rows):
        keys[int(i)] = r["key"]
    return keys


def epic_class_names(cfg: DataConfig, head: str | None) -> tuple[list[str], str] | None:
    """(names, source) of ``head``'s classes: the verb / noun class CSVs' ``key`` column, actions as
    ``<verb> <noun>`` of AVION's map; None without the class files."""
    files = epic_class_files(cfg.class_list, cfg.val_csv)
    if not all(f.is_file() for f in files.values()):
        return None
    if head in files:
        return epic_keys(files[head]), str(files[head])
    if head == "action":
        verbs, nouns = epic_keys(files["verb"]), epic_keys(files["noun"])
        amap = epic_action_map(map_files(cfg.train_csv, cfg.val_csv))
        names = [f"{verbs[v]} {nouns[n]}" for v, n in zip(amap.verbs, amap.nouns)]
        return names, f"{files['verb'].name} + {files['noun'].name} over AVION's action map"
    return None


@register_dataset
class EpicDataset(RowTable):
    """EPIC-Kitchens-100 action segments (official CSV columns); label = {"verb", "noun"}, or with
    ``epic.label: action`` {"action"}: the id of (verb, noun) in AVION's map (``self.action_map``)."""

    dataset_name = "epic"
    zero_shot_protocol = "epic_actions"  # LaViLa: verb and noun heads, and the verb:noun action head
    eval_protocols: ClassVar[dict[str, Protocol]] = {  # eval.protocol=epic: what a published number means
        "epic": Protocol(
            "",
            16,
            "segment",
            None,
            1,
            1,
            224,
            "AVION scripts/main_lavila_finetune_cls.py: 16 frames segment-based, 1 clip x 1 centre crop 224",
        )
    }
    label_names = staticmethod(epic_class_names)
    check_paths = staticmethod(check_class_list)  # data.class_list, when set
    dataset_heads = staticmethod(epic_heads)
    dataset_section = EpicKeys
    section_choices: ClassVar[dict[str, tuple[str, ...]]] = {"label": ("verb_noun", "action")}
    heads_key = "epic.label"  # chooses the heads (verb + noun, or action)
    heads_example = staticmethod(epic_heads_example)
    annotation_summary = staticmethod(epic_summary)
    check_labels = staticmethod(check_action_count)
    label_heads = ("verb", "noun")
    action_map: ActionMap | None = None  # under epic.label: action

    def read_rows(self, cfg: DataConfig) -> None:
        self.csv, self.rows = open_csv(self._split_file(), EPIC_REQUIRED)
        if not self.rows:
            raise ValueError(f"{self.csv}: no annotation rows")
        verbs, nouns = [], []
        for p in {cfg.train_csv, cfg.val_csv} - {""}:
            if Path(p).is_file():
                for _, r in open_csv(p, EPIC_REQUIRED)[1]:
                    verbs.append(parse_int(r["verb_class"]))
                    nouns.append(parse_int(r["noun_class"]))
        self.num_classes = {
            "verb": max((v for v in verbs if v is not None), default=-1) + 1,
            "noun": max((n for n in nouns if n is not None), default=-1) + 1,
        }
        if cfg.label == "action":
            self.action_map = epic_action_map(map_files(cfg.train_csv, cfg.val_csv))
            self.label_heads = ("action",)
            self.num_classes = {"action": len(self.action_map)}

    def row_fields(self, i: int) -> RowFields:
        line, r = self.rows[i]
        return RowFields(self.csv, line, r["video_id"], False, r["narration_id"])

    def sample_span(self, i: int) -> tuple[VideoEntry, int, int, Any]:
        line, r = self.rows[i]
        where = f"{self.csv}:{line} ({r['narration_id']})"
        start_s, stop_s = epic_seconds(r, where)
        verb, noun = parse_int(r["verb_class"]), parse_int(r["noun_class"])
        if verb is None or noun is None or verb < 0 or noun < 0:
            raise DataError(f"{where}: bad verb_class/noun_class {r['verb_class']!r}/{r['noun_class']!r}")
        entry = epic_video(self.index, r, where)
        start, end = segment_span(start_s, stop_s, entry)  # AVION's cap at its chunk's last frame
        if self.action_map is not None:
            return entry, start, end, {"action": self.action_map.id_of(verb, noun)}
        return entry, start, end, {"verb": verb, "noun": noun}
