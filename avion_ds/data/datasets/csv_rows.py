"""Annotation CSV reading shared by the datasets: rows with their line numbers, one-line errors naming the file."""

from __future__ import annotations

import csv
from pathlib import Path

from avion_ds.config import DataConfig


def open_csv(path: str | Path, required: tuple[str, ...]) -> tuple[Path, list[tuple[int, dict]]]:
    """DictReader rows [(line, row)] with stripped keys/values; ValueError naming missing columns."""
    path = Path(path)
    if not str(path) or not path.is_file():
        raise FileNotFoundError(f"annotation file not found: {path}")
    with path.open(newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        try:
            header = [h.strip() for h in (reader.fieldnames or [])]
            missing = [c for c in required if c not in header]
            if missing:
                raise ValueError(
                    f"{path}: missing column(s) {', '.join(missing)} (header: {', '.join(header) or 'empty'})"
                )
            reader.fieldnames = header
            rows = [(reader.line_num, {k: (v or "").strip() for k, v in row.items() if k}) for row in reader]
        except UnicodeDecodeError as e:
            raise not_utf8(path, e) from None
    return path, rows


def not_utf8(path: str | Path, e: UnicodeDecodeError) -> ValueError:
    """The one-line error of a text file that is not UTF-8: the file and the first bad byte."""
    return ValueError(f"{path}: not UTF-8 text (byte {e.object[e.start]:#04x} at offset {e.start})")


def parse_int(text: str) -> int | None:
    """int(float(text)), or None when it is not a number."""
    try:
        return int(float(text))
    except (TypeError, ValueError):
        return None


def split_csv(cfg: DataConfig, split: str) -> str:
    """The annotation file of ``split``: ``data.train_csv`` or ``data.val_csv``."""
    return cfg.train_csv if split == "train" else cfg.val_csv
