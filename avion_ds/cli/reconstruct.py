"""`avion-ds reconstruct --checkpoint RUN --video FILE --out grid.png`: look at a pretraining run
(the grid: :mod:`avion_ds.tasks.pretrain.reconstruct`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from avion_ds.cli.args import Parser
from avion_ds.cli.plugins import add_plugin_option, import_plugins
from avion_ds.config import ConfigError, add_override_option
from avion_ds.data.augment import DeviceAugment
from avion_ds.distributed import dist
from avion_ds.tasks.pretrain.reconstruct import load_clip, named_rows, reconstruct_grid
from avion_ds.tasks.pretrain.run_recipe import pretraining_recipe
from avion_ds.tasks.pretrain.task import build_pretrain_model, mask_spec

if TYPE_CHECKING:
    from avion_ds.engine.open_run import OpenedRun


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = Parser(prog="avion-ds reconstruct", description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", required=True, help="pretraining run directory, or a weights file (needs --config)")
    p.add_argument("--video", required=True, help="a video file")
    p.add_argument("--out", required=True, help="PNG to write")
    p.add_argument("--config", default=None, help="recipe (default: RUN/recipe.yaml)")
    add_override_option(p)
    add_plugin_option(p)
    p.add_argument("--frames", type=int, default=4, help="frames (columns) to show")
    p.add_argument("--seed", type=int, default=0, help="seed of the masks")
    p.add_argument("--min-side", type=int, default=128, help="upscale (nearest) small frames to at least this")
    return p.parse_args(argv)


def _open(args: argparse.Namespace) -> OpenedRun:
    """The pretraining run (or weights file) to look at, through the one run opener."""
    from avion_ds.engine.open_run import open_run  # lazy: start-up checks import the models (reconstruct --help)

    import_plugins(args.plugins)
    if not Path(args.video).is_file():
        raise ConfigError(f"--video not found: {args.video}")
    if args.frames <= 0:
        raise ConfigError(f"--frames={args.frames} must be positive")
    return open_run(args.checkpoint, config=args.config, overrides=args.overrides, recipe_of=pretraining_recipe)


def run(args: argparse.Namespace) -> int:
    opened = _open(args)
    recipe = opened.recipe
    assert recipe is not None
    from PIL import Image  # lazy: Pillow is an optional dependency

    from avion_ds.engine.open_run import load_line  # lazy: start-up checks import the models (reconstruct --help)

    model = build_pretrain_model(recipe, pretrained="")
    print(load_line("avion-ds reconstruct", opened, opened.load_into(model)), flush=True)
    model.eval()
    clip = load_clip(recipe, args.video)
    x, _ = DeviceAugment(recipe.data, 0, train=False)(clip[None], {})
    drawn = mask_spec(recipe).draw(np.random.default_rng(args.seed))
    masks = {k: torch.from_numpy(v)[None] for k, v in drawn.items()}
    with torch.no_grad():
        loss = float(model(x, **masks).loss)
    img = reconstruct_grid(model, x, masks, args.frames)
    scale = max(1, -(-args.min_side // recipe.data.size))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    pil = Image.fromarray(img)
    if scale > 1:
        pil = pil.resize((img.shape[1] * scale, img.shape[0] * scale), Image.NEAREST)
    Image.fromarray(named_rows(np.asarray(pil))).save(out)  # the rows named on a left margin
    print(
        f"wrote {out}: rows original / masked ({recipe.pretrain.mask_type} {recipe.pretrain.mask_ratio}) / "
        f"reconstruction, {len(drawn)} mask(s), clip loss {loss:.4f}",
        flush=True,
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point for `avion-ds reconstruct`."""
    args = parse_args(argv)
    return dist.run_entry("avion-ds reconstruct", lambda: run(args), {ConfigError: 2})


if __name__ == "__main__":
    sys.exit(main())
