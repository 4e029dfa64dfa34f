"""An embedding index on disk: fixed-length clips of a video source, their video embeddings in shards.

Layout of ``OUT/``:

- ``index.json``: the model (name, weights fingerprint, checkpoint, tag), the clip settings (seconds,
  stride, frames, size), the source (root, chunked), the clip count, shard size, embedding width;
- ``clips.csv``: ``row,video,start,end`` (seconds), one line per clip, written before any embedding;
- ``shards/shard_NNNNN.safetensors``: ``embeddings`` float32 (n, E), unit length, and ``rows`` int64 (n,)
  of shard NNNNN's clips (rows ``[N * shard_size, (N + 1) * shard_size)``); clips that failed to decode are
  left out and named in the file's metadata. A shard is written to a temporary name and renamed, so a
  present shard is complete: a rerun embeds only the missing ones (resume), and ranks split the shards.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from avion_ds.config import ConfigError

INDEX_FILE = "index.json"
CLIPS_FILE = "clips.csv"
SHARD_DIR = "shards"


@dataclass
class IndexMeta:
    """What ``index.json`` holds (see module doc)."""

    model: str
    fingerprint: str
    checkpoint: str
    tag: str | None
    config: str | None
    clip_seconds: float
    stride_seconds: float
    num_frames: int
    size: int
    root: str
    chunked: bool
    num_clips: int
    shard_size: int
    embed_dim: int
    source: str
    overrides: list[str]

    @property
    def num_shards(self) -> int:
        return (self.num_clips + self.shard_size - 1) // self.shard_size

    def settings(self) -> dict:
        """What must match for a rerun to resume into the same directory."""
        d = asdict(self)
        return {k: d[k] for k in ("fingerprint", "clip_seconds", "stride_seconds", "num_frames", "size", "root")}


def shard_path(out: Path, shard: int) -> Path:
    return out / SHARD_DIR / f"shard_{shard:05d}.safetensors"


def write_clips(out: Path, clips: list[tuple[str, float, float]]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / (CLIPS_FILE + ".tmp")
    with tmp.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["row", "video", "start", "end"])
        for i, (video, start, end) in enumerate(clips):
            w.writerow([i, video, f"{start:.3f}", f"{end:.3f}"])
    tmp.replace(out / CLIPS_FILE)


def read_clips(out: Path) -> list[tuple[str, float, float]]:
    with (out / CLIPS_FILE).open(newline="") as f:
        return [(r["video"], float(r["start"]), float(r["end"])) for r in csv.DictReader(f)]


def write_meta(out: Path, meta: IndexMeta) -> None:
    tmp = out / (INDEX_FILE + ".tmp")
    tmp.write_text(json.dumps(asdict(meta), indent=1) + "\n")
    tmp.replace(out / INDEX_FILE)


def read_meta(out: str | Path, flag: str = "--index") -> IndexMeta:
    """``index.json`` of ``out``; ConfigError (one line) when it is not an index."""
    path = Path(out) / INDEX_FILE
    if not path.is_file():
        raise ConfigError(f"{flag} {out}: not an embedding index (no {INDEX_FILE}; write one with avion-ds embed)")
    try:
        return IndexMeta(**json.loads(path.read_text()))
    except (ValueError, TypeError) as e:
        raise ConfigError(f"{flag} {out}: {path} is not an index of this version ({e})") from None


def write_shard(out: Path, shard: int, rows: torch.Tensor, embeddings: torch.Tensor, failed: dict[int, str]) -> None:
    """Shard ``shard`` written whole or not at all (temporary name, then rename)."""
    path = shard_path(out, shard)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tensors = {"embeddings": embeddings.float().contiguous(), "rows": rows.long().contiguous()}
    save_file(tensors, str(tmp), metadata={"failed": json.dumps({str(k): v for k, v in failed.items()})})
    tmp.replace(path)


def missing_shards(out: Path, meta: IndexMeta) -> list[int]:
    return [s for s in range(meta.num_shards) if not shard_path(out, s).is_file()]


def iter_shards(out: Path, meta: IndexMeta) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """(rows, embeddings) of each shard in turn: one shard in memory at a time."""
    for s in range(meta.num_shards):
        t = load_file(str(shard_path(out, s)))
        yield t["rows"], t["embeddings"]


def check_complete(out: Path, meta: IndexMeta, flag: str = "--index") -> None:
    gone = missing_shards(out, meta)
    if gone:
        raise ConfigError(
            f"{flag} {out}: {len(gone)} of {meta.num_shards} shards missing (first: {shard_path(out, gone[0]).name}); "
            "rerun the same avion-ds embed command to finish it"
        )


def top_k(out: Path, meta: IndexMeta, query: torch.Tensor, k: int) -> list[tuple[int, float]]:
    """The ``k`` clips most similar to the unit ``query`` (E,), streamed over the shards: (row, cosine)."""
    best_rows, best_scores = torch.empty(0, dtype=torch.long), torch.empty(0)
    for rows, emb in iter_shards(out, meta):
        scores = emb.float() @ query.float()
        all_rows, all_scores = torch.cat([best_rows, rows]), torch.cat([best_scores, scores])
        keep = torch.topk(all_scores, min(k, all_scores.numel())).indices
        best_rows, best_scores = all_rows[keep], all_scores[keep]
    order = torch.argsort(best_scores, descending=True, stable=True)
    return [(int(best_rows[i]), float(best_scores[i])) for i in order]
