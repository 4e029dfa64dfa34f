"""x264 with and without its AVX-512 code: encode time and reproducibility of the chunk writer's output.

The chunk and synthetic-video writers leave x264's AVX-512 code out on CPUs that have it
(``avion_ds/data/prep/x264.py``), because its output varied run to run on identical frames. This prints
what that costs: one synthetic source is decoded and scaled once (AVION's 320 px short side, 30 fps), then
its frames are encoded as chunks by the chunk writer with x264's own CPU detection (``auto``) and with
the writers' choice, alternating (``--warmup`` rounds, then ``--repeats``), and the median times, their
ratio and how many distinct outputs each variant gave. In one process, so the in-process variation the
choice removes shows as several distinct outputs of ``auto`` (on an AVX-512 CPU; elsewhere both are the
same configuration).

    python bench/x264_asm.py                      # ~1 min on 2 cores
    python bench/x264_asm.py --seconds 30 --repeats 9
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import sys
import tempfile
import time
from fractions import Fraction
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from avion_ds.data.prep import chunk_source
from avion_ds.data.prep.synthetic import write_video
from avion_ds.data.prep.x264 import x264_options


def _frames(src: Path, short_side: int) -> list[np.ndarray]:
    import av

    with av.open(str(src)) as c:
        s = c.streams.video[0]
        out = []
        for f in c.decode(s):
            h = short_side
            w = int(round(f.width * h / f.height / 2)) * 2
            out.append(f.reformat(width=w, height=h, format="yuv420p").to_ndarray())
    return out


def _encode(frames: list[np.ndarray], path: Path, options: dict[str, str], gop: int) -> tuple[float, str]:
    import av

    h, w = frames[0].shape[0] * 2 // 3, frames[0].shape[1]
    t0 = time.perf_counter()
    writer = chunk_source._ChunkWriter(path, w, h, Fraction(30), gop, 23, "veryfast", "fastdecode")
    writer.s.options = {**{k: v for k, v in writer.s.options.items() if k != "x264-params"}, **options}
    for a in frames:
        writer.write(av.VideoFrame.from_ndarray(a, format="yuv420p"))
    writer.finish()
    return time.perf_counter() - t0, hashlib.md5(path.read_bytes()).hexdigest()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=15.0, help="source length (AVION's chunk: 15 s)")
    p.add_argument("--short-side", type=int, default=320)
    p.add_argument("--pattern", default="testsrc", choices=("testsrc", "noise"), help="synthetic source content")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeats", type=int, default=7)
    args = p.parse_args(argv)
    if args.warmup < 2:
        p.error("--warmup: at least 2")
    ours = x264_options()
    choice = "writers' choice: " + (ours["x264-params"] if ours else "x264 detects (no AVX-512 here)")
    variants = {"auto: x264 detects": {}, choice: ours}
    with tempfile.TemporaryDirectory() as tmp:
        src = write_video(Path(tmp) / "src.mp4", int(args.seconds * 30), 640, 360, fps=30, pattern=args.pattern)
        frames = _frames(src, args.short_side)
        print(f"{len(frames)} frames of {frames[0].shape[1]}x{frames[0].shape[0] * 2 // 3}, GOP 16, CRF 23, veryfast")
        times: dict[str, list[float]] = {k: [] for k in variants}
        hashes: dict[str, set[str]] = {k: set() for k in variants}
        for i in range(args.warmup + args.repeats):
            for name, opts in variants.items():
                dt, digest = _encode(frames, Path(tmp) / "chunk.mp4", opts, 16)
                hashes[name].add(digest)
                if i >= args.warmup:
                    times[name].append(dt)
    base = statistics.median(next(iter(times.values())))
    for name in variants:
        med = statistics.median(times[name])
        print(f"  {name[:40]:40s} median {med:.3f} s  x{med / base:.3f}  distinct outputs {len(hashes[name])}")
    same = set.intersection(*hashes.values())
    print(f"  outputs shared by both variants: {len(same)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
