"""``quarantine.tsv``: what ``avion-ds check`` found broken, read by the datasets to skip rows up front.

One ``file<TAB>reason`` line per culprit. ``file`` is a chunk or video path relative to the data
root (``P01_01/15.mp4``), or an annotation row ``/abs/path/train.csv:12``. The datasets drop
rows that name a quarantined annotation line or whose clip span touches a quarantined chunk.
"""

from __future__ import annotations

import logging
from pathlib import Path

log = logging.getLogger(__name__)
QUARANTINE_NAME = "quarantine.tsv"


def quarantine_path(root: str | Path, setting: str) -> Path | None:
    """The quarantine file that ``data.quarantine`` names (auto: ``root/quarantine.tsv`` if present)."""
    if setting in ("", "none"):
        return None
    if setting == "auto":
        p = Path(root) / QUARANTINE_NAME
        return p if p.is_file() else None
    p = Path(setting)
    if not p.is_file():
        raise FileNotFoundError(f"data.quarantine: file not found: {p}")
    return p


def read_quarantine(path: str | Path | None) -> dict[str, str]:
    """{file: reason}; an empty dict for no file."""
    if path is None:
        return {}
    out: dict[str, str] = {}
    for line in Path(path).read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, reason = line.partition("\t")
            out[name] = reason
    return out


def write_quarantine(path: str | Path, entries: dict[str, str]) -> None:
    """Write (or, with no entries, remove) the quarantine file."""
    path = Path(path)
    if not entries:
        path.unlink(missing_ok=True)
        return
    text = "".join(f"{k}\t{v.replace(chr(9), ' ').replace(chr(10), ' ')}\n" for k, v in sorted(entries.items()))
    path.write_text(text)


def row_key(annotation: str | Path, line: int) -> str:
    """The quarantine name of one annotation row."""
    return f"{Path(annotation).resolve()}:{line}"
