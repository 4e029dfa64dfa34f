"""`avion-ds models [PATTERN]`: registered model sizes with parameters and forward GFLOPs per clip."""

from __future__ import annotations

import sys

from avion_ds.cli.parsers import models_args
from avion_ds.models.listing import describe, gflops_text


def main(argv: list[str] | None = None) -> int:
    """Entry point for `avion-ds models`."""

    args = models_args(argv)
    from avion_ds.models.registry import list_models  # lazy: the registry pulls torch; models --help answers without it

    names = list_models(args.pattern)
    if not names:
        print(
            f"avion-ds models: error: no registered model contains {args.pattern!r}; known: {', '.join(list_models())}",
            file=sys.stderr,
        )
        return 2
    try:
        rows = [describe(n, args.frames, args.size, args.num_classes) for n in names]
    except ValueError as e:  # ViTArch.validate: geometry that does not divide, one line
        print(f"avion-ds models: error: {e}", file=sys.stderr)
        return 2
    print(
        f"{'model':<36} {'width':>5} {'depth':>5} {'heads':>5} {'input':>7} {'patch':>6} {'classes':>7} "
        f"{'params':>9} {'GFLOPs':>9}"
    )
    for r in rows:
        gflops = "-" if r["gflops"] is None else gflops_text(r["gflops"])
        print(
            f"{r['name']:<36} {r['width']:>5} {r['depth']:>5} {r['heads']:>5} {r['input']:>7} {r['patch']:>6} "
            f"{r['classes']:>7} {r['params_m']:>8.2f}M {gflops:>9}"
        )
    if any(r["gflops"] is None for r in rows):
        print(
            "note: pretrain_* rows show the encoder's geometry; parameters include the decoder; their FLOPs "
            "depend on the mask ratio",
            file=sys.stderr,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
