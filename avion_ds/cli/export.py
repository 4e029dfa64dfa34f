"""`avion-ds export --checkpoint RUN --out FILE`: consolidate ZeRO shards into one fp32 safetensors file
(or a Hugging Face directory); the consolidation: :mod:`avion_ds.engine.export`."""

from __future__ import annotations

import sys
from pathlib import Path

from avion_ds.cli.args import Parser, add_positional_alias, alias_positional
from avion_ds.cli.parsers import add_weights_option
from avion_ds.cli.plugins import add_plugin_option, import_plugins
from avion_ds.config import ConfigError
from avion_ds.engine.export import export, run_weights
from avion_ds.engine.export_formats import FORMATS, export_as


def main(argv: list[str] | None = None) -> int:
    """Entry point for `avion-ds export`."""
    p = Parser(
        prog="avion-ds export",
        description=__doc__.splitlines()[0],
        epilog="exit codes: 0 done, 1 failure (traceback), 2 bad input (one line)",
    )
    p.add_argument("--checkpoint", dest="run_dir", default=None, help="training output_dir holding checkpoints/")
    add_positional_alias(p, "--checkpoint", "run_dir")
    p.add_argument(
        "--out",
        required=True,
        help="output file (.safetensors recommended, or .pt; AVION's checkpoint_best.pt with --format avion), "
        "or the directory to create with --format hf / open_clip",
    )
    p.add_argument(
        "--tag", default=None, help="checkpoint tag, or best (the one best.json names); default: newest complete"
    )
    p.add_argument(
        "--format",
        default="safetensors",
        choices=FORMATS,
        help="safetensors: one fp32 state dict for create_model(pretrained=...) (our layout, any model); hf: a "
        "Hugging Face directory with its preprocessor_config.json (a classifier as VideoMAEForVideoClassification: "
        "single-head models, or one --head; a pretraining run as VideoMAEForPreTraining); open_clip: a directory "
        "open_clip.create_model('local-dir:DIR') loads (a dual encoder); avion: AVION's checkpoint_best.pt "
        "layout (a dual encoder)",
    )
    p.add_argument(
        "--head",
        default=None,
        help="with --format hf and a multi-head model (EPIC verb + noun): the head to export as the classifier",
    )
    add_weights_option(p, "as avion-ds eval --weights")
    p.add_argument(
        "--trust-checkpoint",
        action="store_true",
        help="allow full unpickling of checkpoint files that pickle more than tensors and a few known "
        "types (it can run code from them)",
    )
    add_plugin_option(p)
    args = p.parse_args(argv)
    alias_positional(args, "--checkpoint", "run_dir", "avion-ds export")
    try:
        import_plugins(args.plugins)  # --format hf reads the run's recipe (its task)
        if not Path(args.run_dir).is_dir():
            raise ConfigError(f"run dir not found: {args.run_dir}")
        from avion_ds.engine.open_run import open_run  # lazy: start-up checks import the models (export --help)

        trust = ["model.trust_checkpoint=true"] if args.trust_checkpoint else []
        opened = open_run(args.run_dir, tag=args.tag, overrides=trust, run_dir_only=True)
        tag = opened.tag
        weights = args.weights or run_weights(Path(args.run_dir))
        which = ", ema weights" if weights == "ema" else ""  # the trained weights unless said
        if args.format != "safetensors" or args.head is not None:  # another library's layout (engine.export_formats)
            print(export_as(args.format, args.run_dir, args.out, tag, args.head, args.trust_checkpoint, weights))
            return 0
        out = export(args.run_dir, args.out, tag, args.trust_checkpoint, weights)
    except ConfigError as e:
        print(f"avion-ds export: error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {out} (checkpoint {tag}{which})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
