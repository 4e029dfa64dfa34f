"""`avion-ds search "QUERY" --index DIR`: the clips of an `avion-ds embed` index closest to a text query.

The query is embedded by the text tower of the model that wrote the index (``index.json`` names its
checkpoint; ``--checkpoint`` another copy of it), the shards are scanned one at a time (cosine
similarity, a running top-k), and the hits printed as a table: rank, score, video, start and end
seconds. ``--html OUT`` writes a page with one thumbnail per hit (the clip's middle frame, decoded by
the project's decoders, embedded as a base64 JPEG) that opens in any browser without other files.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from avion_ds.cli.args import Parser
from avion_ds.cli.embed import add_model_options, embed_texts, model_overrides
from avion_ds.cli.plugins import import_plugins
from avion_ds.config import ConfigError
from avion_ds.data.errors import DataError
from avion_ds.distributed import dist
from avion_ds.embed.index import IndexMeta, check_complete, read_clip_table, read_meta, top_k


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = Parser(
        prog="avion-ds search",
        description=__doc__.splitlines()[0],
        epilog="exit codes: 0 done, 1 failure (traceback), 2 bad input (one line)",
    )
    p.add_argument("query", help="text to search for, e.g. 'cut the onion'")
    p.add_argument("--index", required=True, help="index directory written by avion-ds embed")
    p.add_argument("--top-k", type=int, default=10, help="hits to show (default 10)")
    p.add_argument("--html", default=None, help="also write a page with a thumbnail per hit to this file")
    add_model_options(p, required=False)
    return p.parse_args(argv)


def printable(text: str) -> str:
    """``text`` with control characters (ANSI escapes, newlines, ...) shown escaped, never sent to the terminal."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def format_table(hits: list[dict]) -> str:
    """The hits as an aligned text table; names and captions printed with control characters escaped."""
    head = ("rank", "score", "video", "start_s", "end_s", "caption")
    rows = [
        (
            str(h["rank"]),
            f"{h['score']:.4f}",
            printable(h["video"]),
            f"{h['start']:.2f}",
            f"{h['end']:.2f}",
            printable(h.get("text", "")),
        )
        for h in hits
    ]
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    line = lambda r: "  ".join(c.rjust(w) if i not in (2, 5) else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths)))
    return "\n".join([line(head).rstrip(), *[line(r).rstrip() for r in rows]])


# an index's own overrides may shape the model (frames, size), never what is read or trusted
_INDEX_FORBIDDEN = ("model.trust_checkpoint", "model.pretrained", "plugins")


def index_overrides(out: Path, meta: IndexMeta) -> list[str]:
    """The ``--set`` overrides an index was embedded with, refused in one line when one names trust or a file
    to load: an index is a file from elsewhere, and nothing in it grants trust or chooses what is read."""
    for item in meta.overrides:
        key = str(item).split("=", 1)[0].strip()
        if key.startswith(_INDEX_FORBIDDEN) or not key.startswith(("data.", "model.")):
            raise ConfigError(
                f"--index {out}: index.json overrides {item!r}: an index may not set {key} "
                "(only this command line grants trust or names files to load)"
            )
    return list(meta.overrides)


def run(args: argparse.Namespace) -> int:
    from avion_ds.embed.model import load_encoder  # lazy: the models take seconds to import (search --help)

    import_plugins(args.plugins)
    if not args.query.strip():
        raise ConfigError("empty query: give the text to search for")
    if args.top_k < 1:
        raise ConfigError(f"--top-k={args.top_k} must be at least 1")
    out = Path(args.index)
    if args.html:
        page = Path(args.html)
        if page.is_dir() or any(p.exists() and not p.is_dir() for p in page.parents):
            raise ConfigError(f"--html {page}: must be a file path (a directory, or under a file, given)")
    meta = read_meta(out)
    check_complete(out, meta)
    clips, texts = read_clip_table(out, meta)
    if args.checkpoint is None and not Path(meta.checkpoint).exists():
        raise ConfigError(f"--index {out}: its checkpoint {meta.checkpoint} is gone; name a copy with --checkpoint")
    checkpoint = args.checkpoint or meta.checkpoint
    tag = args.tag if args.checkpoint else meta.tag
    if meta.config is not None and args.config is None and not args.checkpoint:
        raise ConfigError(
            f"--index {out} was embedded with --config {meta.config}: an index never names the recipe to run; "
            "pass --config (and --checkpoint) yourself"
        )
    model_name = args.model or (meta.model if Path(checkpoint).is_file() and args.config is None else None)
    overrides = model_overrides(args) if args.checkpoint else [*index_overrides(out, meta), *model_overrides(args)]
    enc = load_encoder(checkpoint, tag, args.config, model_name, overrides, command="avion-ds search")
    if enc.fingerprint != meta.fingerprint or enc.recipe.model.name != meta.model:
        raise ConfigError(
            f"--index {out} was embedded by another model ({meta.model}, weights {meta.fingerprint}) than "
            f"{checkpoint} ({enc.recipe.model.name}, weights {enc.fingerprint}); search it with the model that wrote it"
        )
    query = embed_texts(enc.model, [args.query], torch.device("cpu"))[0]
    hits = [
        {
            "rank": n + 1,
            "score": score,
            "row": row,
            "video": clips[row][0],
            "start": clips[row][1],
            "end": clips[row][2],
            "text": texts[row],
        }
        for n, (row, score) in enumerate(top_k(out, meta, query, args.top_k))
    ]
    print(f"query {printable(args.query)!r}: top {len(hits)} of {meta.num_clips} clips ({meta.model})")
    print(format_table(hits))
    if args.html:
        from avion_ds.embed.page import write_page  # lazy: Pillow (optional), only for --html

        path = write_page(Path(args.html), args.query, hits, enc.recipe.data, meta)
        print(f"wrote {path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point for `avion-ds search`."""
    args = parse_args(argv)
    return dist.run_entry("avion-ds search", lambda: run(args), {ConfigError: 2, DataError: 2})


if __name__ == "__main__":
    sys.exit(main())
