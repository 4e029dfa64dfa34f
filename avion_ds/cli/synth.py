"""`avion-ds synth OUT`: a small learnable EPIC-style synthetic dataset (videos + CSVs + narrations)."""

from __future__ import annotations

import sys

from avion_ds.cli.args import Parser
from avion_ds.data.prep.synthetic import make_synthetic_epic


def main(argv: list[str] | None = None) -> int:
    """``avion-ds synth OUT``: write a learnable synthetic EPIC-style dataset (videos + CSVs)."""
    p = Parser(prog="avion-ds synth", description=make_synthetic_epic.__doc__.splitlines()[0])
    p.add_argument(
        "out",
        help="output directory (videos/, train.csv, val.csv; ego4d_train.pkl/.csv narrations of the train "
        "segments; retrieval_annotations/: EPIC-100 MIR files, test = the val segments)",
    )
    p.add_argument("--num-videos", type=int, default=4, help="long videos to generate")
    p.add_argument("--segments-per-video", type=int, default=12, help="action segments (CSV rows) per video")
    p.add_argument("--segment-seconds", type=float, default=2.0, help="length of each segment")
    p.add_argument("--width", type=int, default=96, help="frame width in pixels")
    p.add_argument("--height", type=int, default=72, help="frame height in pixels")
    p.add_argument("--fps", type=float, default=15, help="frames per second")
    p.add_argument("--num-verbs", type=int, default=4, help="verb classes (motion directions)")
    p.add_argument("--num-nouns", type=int, default=3, help="noun classes (shapes)")
    p.add_argument("--seed", type=int, default=0, help="random seed (same seed, same dataset)")
    p.add_argument("--val-fraction", type=float, default=0.25, help="share of segments written to val.csv")
    p.add_argument(
        "--background",
        default="blocks",
        help="blocks: random colour blocks per video (classification); smooth: a linear colour ramp "
        "per segment (spatially predictable, for masked pretraining)",
    )
    a = p.parse_args(argv)
    for flag, value in (
        ("--num-videos", a.num_videos),
        ("--segments-per-video", a.segments_per_video),
        ("--segment-seconds", a.segment_seconds),
        ("--width", a.width),
        ("--height", a.height),
        ("--fps", a.fps),
        ("--num-verbs", a.num_verbs),
        ("--num-nouns", a.num_nouns),
    ):
        if not value > 0:
            print(f"avion-ds synth: error: {flag} {value} must be positive", file=sys.stderr)
            return 2
    if not 0.0 <= a.val_fraction < 1.0:
        print(f"avion-ds synth: error: --val-fraction {a.val_fraction} must be in [0, 1)", file=sys.stderr)
        return 2
    try:
        info = make_synthetic_epic(
            a.out,
            a.num_videos,
            a.segments_per_video,
            a.segment_seconds,
            a.width,
            a.height,
            a.fps,
            a.num_verbs,
            a.num_nouns,
            a.seed,
            a.val_fraction,
            a.background,
        )
    except (ValueError, OSError) as e:  # bad arguments or an unusable output path
        print(f"avion-ds synth: error: {e}", file=sys.stderr)
        return 2
    print(
        f"wrote {info['num_train']} train / {info['num_val']} val segments from {a.num_videos} videos "
        f"under {a.out} (verbs={a.num_verbs}, nouns={a.num_nouns}, {info['num_narrations']} distinct "
        f"narrations); videos in {info['videos']}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
