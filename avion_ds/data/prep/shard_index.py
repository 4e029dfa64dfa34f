"""What ``avion-ds pack`` records in a shard location's ``index.json`` beyond litdata's own keys, and the
start-up check of a ``data.shards`` location (no litdata needed: start-up runs without it loaded)."""

from __future__ import annotations

import json
from pathlib import Path

ROWS_KEY = "avion_rows"  # per shard entry of index.json: split -> rows of each of its items
ROW_LOADER = "RowItemLoader"  # the item loader litdata must read row-carrying shards with
REMOTE_PREFIXES = ("http://", "https://", "s3://")


def shard_problem(location: str, splits: tuple[str, ...] = ("train", "val")) -> str | None:
    """One line naming ``data.shards`` when a local location has no shards with rows of ``splits`` (a missing
    directory or index.json, shards packed without --config), else None; remote locations are read by litdata."""
    if location.startswith(REMOTE_PREFIXES):
        return None
    index_path = Path(location) / "index.json"
    if not Path(location).is_dir():
        return f"data.shards: directory not found: {location}"
    if not index_path.is_file():
        return f"data.shards: {location} has no index.json (write shards with `avion-ds pack TREE {location}`)"
    try:
        chunks = json.loads(index_path.read_text())["chunks"]
    except (ValueError, KeyError, TypeError) as e:
        return f"data.shards: {index_path} is not a litdata index ({type(e).__name__}: {e})"
    missing = [s for s in splits if not chunks or any(s not in (c.get(ROWS_KEY) or {}) for c in chunks)]
    if missing:
        return f"data.shards: {index_path} holds no {'/'.join(missing)} rows (pack with --config RECIPE)"
    return None
