"""An embedding index on disk: fixed-length clips of a video source, their video embeddings in shards.

Layout of ``OUT/``:

- ``index.json``: the model (name, weights fingerprint, checkpoint, tag), the clip settings (seconds,
  stride, frames, size), the source (root, chunked), the clip count, shard size, embedding width;
- ``clips.csv``: ``row,video,start,end,text`` (seconds; ``text``: the ``--segments`` row's narration, else
  empty), one line per clip, written before any embedding;
- ``shards/shard_NNNNN.safetensors``: ``embeddings`` float32 (n, E), unit length, and ``rows`` int64 (n,)
  of shard NNNNN's clips (rows ``[N * shard_size, (N + 1) * shard_size)``); clips that failed to decode (or
  gave a non-finite embedding) are left out and named in the file's metadata;
- ``shards/shard_NNNNN.sha256``: the shard file's SHA-256, written after it. A shard counts as complete
  only when its checksum file is there and matches: a rerun re-embeds missing, truncated or altered shards
  (resume) and ranks split them; search verifies every shard it reads.

An index is a file from elsewhere: every field of ``index.json``, every line of ``clips.csv`` and every
shard is checked once at load, and a damaged one is refused in one line naming the file.
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load, save_file

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


def checksum_path(out: Path, shard: int) -> Path:
    return shard_path(out, shard).with_suffix(".sha256")


def write_clips(out: Path, clips: list[tuple[str, float, float]], texts: list[str] | None = None) -> None:
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / (CLIPS_FILE + ".tmp")
    with tmp.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["row", "video", "start", "end", "text"])
        for i, (video, start, end) in enumerate(clips):
            w.writerow([i, video, f"{start:.3f}", f"{end:.3f}", texts[i] if texts else ""])
    tmp.replace(out / CLIPS_FILE)


def _clip_rows(out: Path) -> list[dict[str, str]]:
    path = Path(out) / CLIPS_FILE
    if not path.is_file() or path.is_symlink():
        raise ConfigError(f"{path}: missing (or a symlink); the index is incomplete, rerun avion-ds embed")
    try:
        with path.open(newline="") as f:
            reader = csv.DictReader(f)
            if not {"row", "video", "start", "end"} <= set(reader.fieldnames or ()):
                raise ConfigError(f"{path}: header {reader.fieldnames} lacks row,video,start,end")
            return list(reader)
    except (UnicodeDecodeError, csv.Error) as e:
        raise ConfigError(f"{path}: not a clips table ({e})") from None


def _inside(root: Path, video: str) -> bool:
    """A folder index's video path names a file under its root (no absolute path, no ``..`` out of it)."""
    if not video or Path(video).is_absolute():
        return False
    return (root / video).resolve().is_relative_to(root.resolve())


def read_clip_table(out: Path, meta: IndexMeta | None = None) -> tuple[list[tuple[str, float, float]], list[str]]:
    """(clips, texts) of ``clips.csv``, every line checked: rows 0..n-1 in order, finite times with
    start <= end, ``meta.num_clips`` lines, and (a folder of videos) every video inside the indexed root."""
    path = Path(out) / CLIPS_FILE
    clips, texts = [], []
    for i, r in enumerate(_clip_rows(out)):
        try:
            row, start, end = int(r["row"]), float(r["start"]), float(r["end"])
        except (TypeError, ValueError):
            raise ConfigError(f"{path}: line {i + 2}: row/start/end must be numbers, got {r}") from None
        if row != i or not (math.isfinite(start) and math.isfinite(end)) or start < 0 or end < start:
            raise ConfigError(
                f"{path}: line {i + 2}: row {r['row']}, start {r['start']}, end {r['end']} is not clip {i}"
            )
        video = r["video"] or ""
        if meta is not None and not meta.chunked and not _inside(Path(meta.root), video):
            raise ConfigError(f"{path}: line {i + 2}: video {video!r} lies outside the indexed root {meta.root}")
        clips.append((video, start, end))
        texts.append(r.get("text") or "")
    if meta is not None and len(clips) != meta.num_clips:
        raise ConfigError(f"{path}: {len(clips)} clips, index.json says num_clips={meta.num_clips}")
    return clips, texts


def read_clips(out: Path, meta: IndexMeta | None = None) -> list[tuple[str, float, float]]:
    """The clips of ``clips.csv`` (checked: ``read_clip_table``)."""
    return read_clip_table(out, meta)[0]


def write_meta(out: Path, meta: IndexMeta) -> None:
    tmp = out / (INDEX_FILE + ".tmp")
    tmp.write_text(json.dumps(asdict(meta), indent=1) + "\n")
    tmp.replace(out / INDEX_FILE)


_META_TYPES = {
    "model": str,
    "fingerprint": str,
    "checkpoint": str,
    "tag": (str, type(None)),
    "config": (str, type(None)),
    "clip_seconds": (int, float),
    "stride_seconds": (int, float),
    "num_frames": int,
    "size": int,
    "root": str,
    "chunked": bool,
    "num_clips": int,
    "shard_size": int,
    "embed_dim": int,
    "source": str,
    "overrides": list,
}


def _check_meta(path: Path, raw: object) -> IndexMeta:
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: not an index (a JSON object is expected)")
    for key, kind in _META_TYPES.items():
        value = raw.get(key)
        if key not in raw or not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise ConfigError(f"{path}: {key}={value!r} is not an index field of the right type")
    for key in ("clip_seconds", "stride_seconds", "num_frames", "size", "num_clips", "shard_size", "embed_dim"):
        if not math.isfinite(raw[key]) or raw[key] <= 0:
            raise ConfigError(f"{path}: {key}={raw[key]!r} must be positive")
    if not all(isinstance(o, str) for o in raw["overrides"]):
        raise ConfigError(f"{path}: overrides={raw['overrides']!r} must be a list of key=value strings")
    return IndexMeta(**{k: raw[k] for k in _META_TYPES})


def read_meta(out: str | Path, flag: str = "--index") -> IndexMeta:
    """``index.json`` of ``out``, every field checked; ConfigError (one line) when it is not an index."""
    path = Path(out) / INDEX_FILE
    if not path.is_file():
        raise ConfigError(f"{flag} {out}: not an embedding index (no {INDEX_FILE}; write one with avion-ds embed)")
    try:
        raw = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise ConfigError(f"{flag} {out}: {path} is not JSON ({e})") from None
    return _check_meta(path, raw)


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def write_shard(out: Path, shard: int, rows: torch.Tensor, embeddings: torch.Tensor, failed: dict[int, str]) -> None:
    """Shard ``shard`` written whole or not at all (temporary name, then rename), then its checksum file."""
    path = shard_path(out, shard)
    path.parent.mkdir(parents=True, exist_ok=True)
    checksum_path(out, shard).unlink(missing_ok=True)
    tmp = path.with_suffix(".tmp")
    tensors = {"embeddings": embeddings.float().contiguous(), "rows": rows.long().contiguous()}
    save_file(tensors, str(tmp), metadata={"failed": json.dumps({str(k): v for k, v in failed.items()})})
    digest = _digest(tmp.read_bytes())
    tmp.replace(path)
    sums = checksum_path(out, shard).with_suffix(".sha256.tmp")
    sums.write_text(digest + "\n")
    sums.replace(checksum_path(out, shard))


def shard_problem(out: Path, shard: int) -> str | None:
    """Why shard ``shard`` is not complete (missing, a symlink, no checksum, checksum differs), else None."""
    path, sums = shard_path(out, shard), checksum_path(out, shard)
    if not path.exists() and not path.is_symlink():
        return "missing"
    if path.is_symlink() or not path.is_file() or sums.is_symlink():
        return "not a regular file"
    if not sums.is_file():
        return f"no {sums.name} (an interrupted write)"
    if _digest(path.read_bytes()) != sums.read_text().strip():
        return "checksum differs (truncated or altered)"
    return None


def missing_shards(out: Path, meta: IndexMeta) -> list[int]:
    """The shards to (re-)embed: missing, or failing their checksum."""
    return [s for s in range(meta.num_shards) if shard_problem(out, s) is not None]


def read_shard(out: Path, meta: IndexMeta, shard: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows, embeddings) of one shard, checked: checksum, tensor names and types, width ``embed_dim``, one
    row per embedding, rows unique and inside the shard's range, embeddings finite. ConfigError naming it."""
    path = shard_path(out, shard)
    why = shard_problem(out, shard)
    if why is not None:
        raise ConfigError(f"{path}: {why}; rerun the same avion-ds embed command to rewrite it")
    try:
        t = load(path.read_bytes())
    except (SafetensorError, ValueError, OSError) as e:
        raise ConfigError(f"{path}: not a readable shard ({str(e)[:120]})") from None
    rows, emb = t.get("rows"), t.get("embeddings")
    lo, hi = shard * meta.shard_size, min((shard + 1) * meta.shard_size, meta.num_clips)
    if rows is None or emb is None or rows.dtype != torch.int64 or not emb.is_floating_point():
        raise ConfigError(f"{path}: needs int64 rows and float embeddings, has {sorted(t)}")
    if emb.dim() != 2 or emb.shape[1] != meta.embed_dim or rows.shape != (emb.shape[0],):
        raise ConfigError(
            f"{path}: {tuple(rows.shape)} rows for embeddings {tuple(emb.shape)}; index.json says width {meta.embed_dim}"
        )
    if rows.numel() and (int(rows.min()) < lo or int(rows.max()) >= hi or rows.unique().numel() != rows.numel()):
        raise ConfigError(f"{path}: rows must be unique clips in [{lo}, {hi}), got {rows.tolist()[:8]}...")
    if not bool(torch.isfinite(emb).all()):
        raise ConfigError(f"{path}: holds non-finite embeddings")
    return rows, emb


def iter_shards(out: Path, meta: IndexMeta) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """(rows, embeddings) of each shard in turn (checked: ``read_shard``): one shard in memory at a time."""
    for s in range(meta.num_shards):
        yield read_shard(out, meta, s)


def check_complete(out: Path, meta: IndexMeta, flag: str = "--index") -> None:
    gone = missing_shards(out, meta)
    if gone:
        raise ConfigError(
            f"{flag} {out}: {len(gone)} of {meta.num_shards} shards missing or damaged (first: "
            f"{shard_path(out, gone[0]).name}, {shard_problem(out, gone[0])}); rerun the same avion-ds embed command"
        )


def top_k(out: Path, meta: IndexMeta, query: torch.Tensor, k: int) -> list[tuple[int, float]]:
    """The ``k`` clips most similar to the unit ``query`` (E,), streamed over the shards: (row, cosine);
    ties keep the lower row first."""
    best_rows, best_scores = torch.empty(0, dtype=torch.long), torch.empty(0)
    for rows, emb in iter_shards(out, meta):
        all_rows, all_scores = torch.cat([best_rows, rows]), torch.cat([best_scores, emb.float() @ query.float()])
        order = torch.argsort(all_rows, stable=True)  # ties broken by row, whatever the shard order
        all_rows, all_scores = all_rows[order], all_scores[order]
        keep = torch.argsort(all_scores, descending=True, stable=True)[:k]
        best_rows, best_scores = all_rows[keep], all_scores[keep]
    return [(int(r), float(s)) for r, s in zip(best_rows, best_scores)]
