"""`avion-ds pack TREE OUT [--config RECIPE]`: an existing chunk tree as litdata shards (no re-encoding),
with the recipe's annotation rows of each split inside the shards."""

from __future__ import annotations

import sys

from avion_ds.cli.args import Parser
from avion_ds.config import ConfigError, add_override_option
from avion_ds.data.prep.pack import DEFAULT_ITEM_BYTES, DEFAULT_SHARD_BYTES, pack_tree, packed_labels
from avion_ds.data.prep.pack_rows import RowSource


def _parser() -> Parser:
    """The options of `avion-ds pack`."""
    p = Parser(
        prog="avion-ds pack",
        description="Pack the chunk tree TREE (with its manifest.jsonl) into litdata shards under OUT; "
        "items are windows of a video's consecutive chunks (a clip's chunks always in one item), with their "
        "frame counts, fps and sha256, and with --config the recipe's annotation rows (train and val) they serve.",
    )
    p.add_argument("tree", help="a chunk tree written by `avion-ds chunk` (holds manifest.jsonl)")
    p.add_argument("out", help="output directory for the shards")
    p.add_argument("--shard-bytes", type=int, default=DEFAULT_SHARD_BYTES, help="bytes per shard (default 1 GiB)")
    p.add_argument(
        "--item-bytes",
        type=int,
        default=DEFAULT_ITEM_BYTES,
        help="bytes of chunks per item, what one sample reads (default 32 MiB; more when a row spans more)",
    )
    p.add_argument("--workers", type=int, default=1, help="packing processes (default 1)")
    p.add_argument(
        "--config",
        default=None,
        help="a recipe whose dataset's rows (data.train_csv / data.val_csv, read over TREE) travel with the "
        "shards; training from the shards (data.shards) needs them",
    )
    add_override_option(p, "data.train_csv=PATH")
    return p


def main(argv: list[str] | None = None) -> int:
    """``avion-ds pack TREE OUT``; exit 2 on a missing tree, recipe or annotation file, or a bad size (one line)."""
    a = _parser().parse_args(argv)
    try:
        labels, source = None, None
        if a.config is not None or a.overrides:
            from avion_ds.tasks import load_recipe  # lazy: the recipe's tasks load torch; a plain pack needs none

            recipe = load_recipe(a.config, [*a.overrides, f"data.root={a.tree}", "data.chunked=true", "data.shards="])
            source = RowSource(recipe.data, recipe.sections)
            labels = packed_labels(recipe.data)
        done = pack_tree(a.tree, a.out, a.shard_bytes, a.workers, source, labels, a.item_bytes)
    except (OSError, ValueError, ImportError, ConfigError) as e:
        print(f"avion-ds pack: error: {e}", file=sys.stderr)
        return 2
    if done.problems:
        print(f"avion-ds pack: {len(done.problems)} rows left out (first: {done.problems[0]})", file=sys.stderr)
    counts = ", ".join(f"{n} {split} rows" for split, n in done.rows.items())
    print(f"packed {done.videos} videos ({done.items} items) into {a.out}" + (f" with {counts}" if counts else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
