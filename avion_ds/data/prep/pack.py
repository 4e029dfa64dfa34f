"""Pack an existing chunk tree into litdata shards (no re-encoding): one item per video, so a clip's
consecutive chunks always share a shard; the manifest facts (frames, fps, size, sha256) travel inside."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from avion_ds.data.prep.manifest import MANIFEST_NAME, dedupe_records, read_manifest_records

DEFAULT_SHARD_BYTES = 1 << 30  # ~1 GiB per shard


def video_groups(tree: str | Path) -> list[list[dict]]:
    """The manifest rows of ``tree`` grouped per video, each group in start-frame order."""
    groups: dict[str, list[dict]] = {}
    for r in dedupe_records(read_manifest_records(Path(tree) / MANIFEST_NAME)):
        groups.setdefault(r["video_id"], []).append(r)
    return [sorted(g, key=lambda r: int(r["start_frame"])) for _, g in sorted(groups.items())]


def video_item(group: list[dict], tree: str) -> dict:
    """One shard item: a video's chunk bytes and their manifest facts (checksums computed here)."""
    blobs = [(Path(tree) / r["path"]).read_bytes() for r in group]
    facts = [
        {k: r[k] for k in ("path", "start_frame", "frames", "fps", "width", "height") if k in r}
        | {"bytes": len(b), "sha256": hashlib.sha256(b).hexdigest()}
        for r, b in zip(group, blobs, strict=True)
    ]
    return {"video_id": group[0]["video_id"], "chunks": facts, "data": b"".join(blobs)}


def _item(args: tuple[list[dict], str]) -> dict:
    return video_item(*args)


def pack_tree(tree: str | Path, out: str | Path, shard_bytes: int = DEFAULT_SHARD_BYTES, workers: int = 1) -> int:
    """Write ``tree``'s chunks as litdata shards of about ``shard_bytes`` under ``out``; returns the videos packed.

    Raises ValueError (one line) for a tree without a manifest or a size that is not positive."""
    tree = Path(tree)
    if not (tree / MANIFEST_NAME).is_file():
        raise ValueError(f"{tree}: no {MANIFEST_NAME} (not a chunk tree; run `avion-ds chunk` first)")
    if shard_bytes <= 0:
        raise ValueError(f"--shard-bytes={shard_bytes}: must be positive")
    from litdata import optimize  # lazy: litdata is the optional [stream] extra

    groups = video_groups(tree)
    if not groups:
        raise ValueError(f"{tree / MANIFEST_NAME}: no rows")
    os.makedirs(out, exist_ok=True)
    optimize(
        fn=_item,
        inputs=[(g, str(tree)) for g in groups],
        output_dir=str(Path(out).resolve()),
        chunk_bytes=int(shard_bytes),
        num_workers=max(1, workers),
        mode="overwrite",
        verbose=False,
    )
    return len(groups)
