"""`avion-ds pack TREE OUT`: an existing chunk tree as litdata shards (no re-encoding)."""

from __future__ import annotations

import sys

from avion_ds.cli.args import Parser
from avion_ds.data.prep.pack import DEFAULT_SHARD_BYTES


def _parser() -> Parser:
    """The options of `avion-ds pack`."""
    p = Parser(
        prog="avion-ds pack",
        description="Pack the chunk tree TREE (with its manifest.jsonl) into litdata shards under OUT; "
        "a video's chunks stay in one shard, with their frame counts, fps and sha256.",
    )
    p.add_argument("tree", help="a chunk tree written by `avion-ds chunk` (holds manifest.jsonl)")
    p.add_argument("out", help="output directory for the shards")
    p.add_argument("--shard-bytes", type=int, default=DEFAULT_SHARD_BYTES, help="bytes per shard (default 1 GiB)")
    p.add_argument("--workers", type=int, default=1, help="packing processes (default 1)")
    return p


def main(argv: list[str] | None = None) -> int:
    """``avion-ds pack TREE OUT``; exit 2 on a missing tree or a bad size (one line)."""
    a = _parser().parse_args(argv)
    try:
        from avion_ds.data.prep.pack import pack_tree  # lazy: litdata (the [stream] extra) loads only for pack

        n = pack_tree(a.tree, a.out, a.shard_bytes, a.workers)
    except (OSError, ValueError, ImportError) as e:
        print(f"avion-ds pack: error: {e}", file=sys.stderr)
        return 2
    print(f"packed {n} videos into {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
