"""`avion-ds embed`: video embeddings of fixed-length clips of your videos (an index for `avion-ds search`),
or text embeddings of queries.

Videos: ``avion-ds embed SOURCE --checkpoint CK --out DIR`` (SOURCE: a chunk tree, a folder of videos or
a dataset CSV with ``--root``; :mod:`avion_ds.embed.clips`). The clips are embedded by the video tower
one shard at a time and each shard written as it completes (:mod:`avion_ds.embed.index`), so memory
stays bounded by one shard whatever the hours of video, and a rerun of the same command resumes. Under a
launcher (``torchrun --nproc_per_node N -m avion_ds.cli embed ...``) rank r embeds shards r, r + N, ...;
no process group is needed. Text: ``avion-ds embed --text "QUERY" [--text ...] --checkpoint CK --out
q.safetensors`` writes ``embeddings`` (n, E) with the texts in the file's metadata.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from torch.utils.data import DataLoader, Subset

from avion_ds.cli.args import Parser
from avion_ds.cli.plugins import add_plugin_option, import_plugins
from avion_ds.config import ConfigError, add_override_option
from avion_ds.data import DeviceAugment
from avion_ds.data.errors import DataError
from avion_ds.data.tokenizer import tokenize
from avion_ds.distributed import dist
from avion_ds.distributed.dist import env_world_size
from avion_ds.distributed.run_log import progress
from avion_ds.embed.index import (
    IndexMeta,
    missing_shards,
    read_clip_table,
    read_meta,
    shard_problem,
    write_clips,
    write_meta,
    write_shard,
)


def add_model_options(p: argparse.ArgumentParser, required: bool = True) -> None:
    """The options naming the dual encoder (shared with `avion-ds search`)."""
    p.add_argument("--checkpoint", required=required, help="run directory or weights file of a dual encoder")
    p.add_argument("--tag", default=None, help="checkpoint tag of the run directory (best: the one best.json names)")
    p.add_argument("--config", default=None, help="YAML recipe (default: RUN_DIR/recipe.yaml)")
    p.add_argument(
        "--model", default=None, help="registered dual encoder of a weights file (e.g. clip_vit_base_patch16_224)"
    )
    p.add_argument(
        "--trust-checkpoint", action="store_true", help="allow full unpickling of the checkpoint (can run code)"
    )
    add_override_option(p, "data.num_frames=4")
    add_plugin_option(p)


def model_overrides(args: argparse.Namespace) -> list[str]:
    return [*args.overrides, *(["model.trust_checkpoint=true"] if args.trust_checkpoint else [])]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = Parser(
        prog="avion-ds embed",
        description=__doc__.splitlines()[0],
        epilog="exit codes: 0 done, 1 failure (traceback), 2 bad input (one line)",
    )
    p.add_argument("source", nargs="?", help="chunk tree, folder of videos, or dataset CSV (with --root)")
    p.add_argument("--text", action="append", default=[], help="a text query to embed instead (repeatable)")
    p.add_argument("--out", required=True, help="index directory (videos) or .safetensors file (--text)")
    p.add_argument("--root", default=None, help="videos of a dataset CSV: chunk tree or folder (ids = file stems)")
    p.add_argument("--segments", action="store_true", help="dataset CSV: clips within each row's start/stop")
    p.add_argument("--clip-seconds", type=float, default=2.0, help="clip length in seconds (default 2)")
    p.add_argument("--stride-seconds", type=float, default=None, help="clip start every N seconds (default: length)")
    p.add_argument("--batch-size", type=int, default=8, help="clips per forward")
    p.add_argument("--workers", type=int, default=2, help="DataLoader workers per process")
    p.add_argument("--shard-size", type=int, default=1024, help="clips per shard file (the unit of resume)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_model_options(p)
    args = p.parse_args(argv)
    args.stride_seconds = args.clip_seconds if args.stride_seconds is None else args.stride_seconds
    return args


def check_args(args: argparse.Namespace) -> None:
    if args.text:
        if args.source:
            raise ConfigError("give either a video SOURCE or --text queries, not both")
        out = Path(args.out)
        if out.is_dir() or any(p.exists() and not p.is_dir() for p in out.parents):
            raise ConfigError(f"--out {out}: must be a file path (a directory, or under a file, given)")
        empty = next((t for t in args.text if not t.strip()), None)
        if empty is not None:
            raise ConfigError(f"--text {empty!r}: empty query")
        return
    if not args.source:
        raise ConfigError("nothing to embed: give a video SOURCE (chunk tree, folder, dataset CSV) or --text QUERY")
    for name in ("clip_seconds", "stride_seconds"):
        value = getattr(args, name)
        if not math.isfinite(value) or value < MIN_SECONDS:
            raise ConfigError(
                f"--{name.replace('_', '-')}={value} must be a number of seconds >= {MIN_SECONDS} "
                "(one frame at 100 fps)"
            )
    for name in ("batch_size", "shard_size"):
        if getattr(args, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')}={getattr(args, name)} must be at least 1")
    if args.workers < 0:
        raise ConfigError(f"--workers={args.workers} must be 0 (in-process) or more")
    if Path(args.out).exists() and not Path(args.out).is_dir():
        raise ConfigError(f"--out {args.out}: a file, not a directory")


MIN_SECONDS = 0.01  # clip length / stride floor: one frame at 100 fps (a smaller stride only repeats frames)


def device_and_dtype() -> tuple[torch.device, torch.dtype]:
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))), torch.bfloat16
    return torch.device("cpu"), torch.float32


@torch.no_grad()
def embed_texts(model: torch.nn.Module, texts: list[str], device: torch.device) -> torch.Tensor:
    """(n, E) unit float32 text embeddings."""
    return F.normalize(model.encode_text(tokenize(texts).to(device)).float(), dim=-1).cpu()


def run_text(args: argparse.Namespace) -> int:
    from avion_ds.embed.model import load_encoder  # lazy: the models take seconds to import (embed --help)

    enc = load_encoder(args.checkpoint, args.tag, args.config, args.model, model_overrides(args))
    emb = embed_texts(enc.model, args.text, torch.device("cpu"))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"texts": json.dumps(args.text), "model": enc.recipe.model.name, "fingerprint": enc.fingerprint}
    save_file({"embeddings": emb.contiguous()}, str(out), metadata=meta)
    print(f"wrote {out} ({len(args.text)} text embedding(s) of width {emb.shape[1]}, model {enc.recipe.model.name})")
    return 0


def prepare_index(args: argparse.Namespace, enc, listed, rank: int):
    """(index meta, dataset) for the ``listed`` (root, chunked, clips); the index files written by rank 0
    (a resumed index must match)."""
    from avion_ds.embed.clips import WindowDataset  # lazy: the decoder modules (~35 ms) load after parsing

    out = Path(args.out)
    root, chunked, clips, texts = listed
    d = enc.recipe.data
    meta = IndexMeta(
        model=enc.recipe.model.name,
        fingerprint=enc.fingerprint,
        checkpoint=str(Path(args.checkpoint).resolve()),
        tag=enc.tag,
        config=str(Path(args.config).resolve()) if args.config else None,
        clip_seconds=args.clip_seconds,
        stride_seconds=args.stride_seconds,
        num_frames=d.num_frames,
        size=d.size,
        root=str(root.resolve()),
        chunked=chunked,
        num_clips=len(clips),
        shard_size=args.shard_size,
        embed_dim=int(enc.model.arch.vision.proj_dim),
        source=str(Path(args.source).resolve()),
        overrides=list(args.overrides),
    )
    if (out / "index.json").is_file():
        old = read_meta(out, "--out")
        if (
            old.settings() != meta.settings()
            or old.shard_size != meta.shard_size
            or read_clip_table(out, old) != ([(v, round(a, 3), round(b, 3)) for v, a, b in clips], texts)
        ):
            diff = [k for k, v in meta.settings().items() if old.settings()[k] != v] or ["clips or shard size"]
            raise ConfigError(
                f"--out {out}: holds an index made with other settings ({', '.join(diff)}); use another --out"
            )
    elif rank == 0:
        write_clips(out, clips, texts)
        write_meta(out, meta)
    return meta, WindowDataset(d, root, chunked, clips)


def run_videos(args: argparse.Namespace) -> int:
    from avion_ds.embed.clips import list_clips  # lazy: the decoder modules (~35 ms) load after parsing
    from avion_ds.embed.model import load_encoder  # lazy: the models take seconds to import (embed --help)

    rank, world = int(os.environ.get("RANK", "0")), env_world_size()
    listed = list_clips(args.source, args.root, args.segments, args.clip_seconds, args.stride_seconds)
    enc = load_encoder(args.checkpoint, args.tag, args.config, args.model, model_overrides(args))
    meta, ds = prepare_index(args, enc, listed, rank)
    out = Path(args.out)
    mine = [s for s in missing_shards(out, meta) if s % world == rank]
    damaged = [s for s in mine if shard_problem(out, s) != "missing"]
    if damaged:
        why = shard_problem(out, damaged[0])
        print(f"rank {rank}: {len(damaged)} damaged shard(s) embedded again (first: shard {damaged[0]}, {why})")
    device, dtype = device_and_dtype()
    model = enc.model.to(device=device, dtype=dtype)
    augment = DeviceAugment(ds.cfg, 0, train=False)
    todo = sum(min(meta.shard_size, meta.num_clips - s * meta.shard_size) for s in mine)
    if rank == 0:
        print(
            f"avion-ds embed: {meta.num_clips} clips in {meta.num_shards} shards, {todo} to embed on rank 0 of {world}"
        )
    bar = None if args.no_progress else progress(total=todo, desc="embed", unit="clip")
    failed_total = 0
    for s in mine:
        rows, emb, failed = embed_shard(model, ds, augment, s, meta, args, device, dtype, bar)
        write_shard(out, s, rows, emb, failed)
        failed_total += len(failed)
        if failed:
            print(f"shard {s}: {len(failed)} clip(s) failed to decode and are left out: {next(iter(failed.values()))}")
    if bar is not None:
        bar.close()
    print(f"rank {rank}: wrote {len(mine)} shard(s) under {out / 'shards'} ({failed_total} clip(s) failed to decode)")
    return 0


@torch.no_grad()
def embed_shard(model, ds, augment, shard: int, meta, args, device, dtype, bar):
    """(rows, unit embeddings, failed {row: reason}) of one shard's clips."""
    lo, hi = shard * meta.shard_size, min((shard + 1) * meta.shard_size, meta.num_clips)
    loader = DataLoader(Subset(ds, range(lo, hi)), batch_size=args.batch_size, num_workers=args.workers)
    rows, embs, failed = [], [], {}
    for batch in loader:
        ok = batch["failed_index"] < 0
        for i, reason in zip(batch["failed_index"].tolist(), batch["failed_reason"]):
            if i >= 0:
                failed[i] = reason
        x, labels = augment(batch["frames"].to(device), {"row": batch["label"]["row"]})
        video = F.normalize(model.encode_video(x.to(dtype)).float(), dim=-1).cpu()
        finite = torch.isfinite(video).all(dim=1)
        for i in labels["row"].cpu()[ok & ~finite].tolist():
            failed[i] = "non-finite embedding (left out)"
        ok = ok & finite
        rows.append(labels["row"].cpu()[ok])
        embs.append(video[ok])
        if bar is not None:
            bar.update(len(ok))
    return torch.cat(rows), torch.cat(embs), failed


def run(args: argparse.Namespace) -> int:
    import_plugins(args.plugins)
    check_args(args)
    return run_text(args) if args.text else run_videos(args)


def main(argv: list[str] | None = None) -> int:
    """Entry point for `avion-ds embed`."""
    args = parse_args(argv)
    return dist.run_entry("avion-ds embed", lambda: run(args), {ConfigError: 2, DataError: 2})


if __name__ == "__main__":
    sys.exit(main())
