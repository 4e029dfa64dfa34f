"""`avion-ds chunk SRC DST`: re-encode long videos into short chunks + manifest.jsonl (or index an existing tree)."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

from avion_ds.cli.args import Parser
from avion_ds.data.prep.chunking import FAILURES_NAME, chunk_videos
from avion_ds.data.prep.x264 import describe_x264


def _parser() -> Parser:
    """The options of `avion-ds chunk`."""
    p = Parser(
        prog="avion-ds chunk",
        description="Re-encode videos under SRC into short "
        "H.264 chunks DST/<video_id>/<start_second>.mp4 plus DST/manifest.jsonl; with --index-only, write "
        "DST/manifest.jsonl for an existing chunk tree SRC (<video>.<ext>/<start_second>.<ext>, AVION's "
        "layout) without re-encoding.",
    )
    p.add_argument("src", help="a video file or a directory searched recursively")
    p.add_argument("dst", nargs="?", help="output directory (--index-only: default SRC)")
    p.add_argument(
        "--index-only",
        action="store_true",
        help="index an existing chunk tree (no re-encoding); the encoding options are not used",
    )
    p.add_argument(
        "--decode-count",
        action="store_true",
        help="--index-only: count every chunk's frames by decoding (default: the MP4 header's count, verified)",
    )
    p.add_argument(
        "--chunk-seconds",
        type=float,
        default=None,
        help="chunk length (default 15; --index-only: default the most common spacing of the chunk names)",
    )
    p.add_argument(
        "--short-side",
        type=int,
        default=320,
        help="scale the short side down to this (default 320; 0 keeps the size); never upscales",
    )
    p.add_argument(
        "--fps", type=float, default=30, help="constant output frame rate (default 30; 0 keeps the source's)"
    )
    p.add_argument("--gop", type=int, default=16, help="keyframe interval in frames (default 16)")
    p.add_argument("--crf", type=int, default=23, help="libx264 CRF (default 23)")
    p.add_argument("--preset", default="veryfast", help="libx264 preset (default veryfast)")
    p.add_argument(
        "--tune",
        default="fastdecode",
        help='libx264 tune (default fastdecode: faster decoding at equal quality, BENCHMARKS.md; "" for none)',
    )
    p.add_argument(
        "--workers",
        type=int,
        default=max(1, (os.cpu_count() or 2) // 2),
        help="parallel processes (default: half the CPUs)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def main(argv: list[str] | None = None) -> int:
    """``avion-ds chunk SRC DST [...]``; exit 1 when any source failed (listed in DST/chunk_failures.tsv)."""
    a = _parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if a.index_only:
        from avion_ds.data.prep.index_tree import run_index  # lazy: numpy + the index tree (~170 ms) only for --index

        return run_index(a.src, a.dst, a.chunk_seconds, a.decode_count, a.workers, not a.no_progress)
    if a.dst is None:
        print("avion-ds chunk: error: DST is required (only --index-only defaults it to SRC)", file=sys.stderr)
        return 2
    try:
        s = chunk_videos(
            a.src,
            a.dst,
            15.0 if a.chunk_seconds is None else a.chunk_seconds,
            a.short_side or None,
            a.fps or None,
            a.gop,
            a.crf,
            a.workers,
            not a.no_progress,
            a.preset,
            a.tune,
        )
    except (OSError, ValueError) as e:
        print(f"avion-ds chunk: error: {e}", file=sys.stderr)
        return 2
    print(s)
    print(f"encoder: {describe_x264()}")
    if s.failed:
        print(f"failures listed in {Path(a.dst) / FAILURES_NAME}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
