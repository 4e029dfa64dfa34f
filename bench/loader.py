"""Loader benchmark: naive long-video decode vs chunked + fused decode+crop, per decoder process.

Generates an EPIC-like long source video with FFmpeg's lavfi sources through PyAV (default 60 s
1920x1080 at 60 fps, keyframe every 4 s; ``--seconds 180`` for the issue's full 3 minutes — the
naive cost per clip depends on resolution and GOP, not on length), chunks it with ``avion-ds chunk`` defaults (15 s, short side 320, 30 fps,
GOP 16), then measures 16-frame training clips/s in ONE process, one decoder thread, one torch
thread, over the same random EPIC-style segments (TSN sampling with jitter, RandomResizedCrop
scale (0.5, 1) to 224):

  (a) naive   decord on the original long video, accurate get_batch, RandomResizedCrop + resize on CPU
  (b) chunked the dataset's own path (EpicDataset.__getitem__) over chunks, crop fused per backend,
              also decord through the timeout helper process (decode_timeout_s > 0)
  (c) floor   each backend decoding only the needed frames of the chunks, no crop / resize

and prints clips/s with the ratios (b)/(a) and (b)/(c) (same backend's floor), then DataLoader
throughput with 2 workers.

    python bench/loader.py [--seconds 60 --width 1920 --height 1080 --fps 60 --clips 30 --workdir DIR]
"""

from __future__ import annotations

import argparse
import csv
import shutil
import tempfile
import time
from fractions import Fraction
from pathlib import Path

import numpy as np
import torch


def make_source(path: Path, seconds: float, width: int, height: int, fps: int, gop_s: float, pattern: str) -> float:
    """Encode ``seconds`` of an FFmpeg lavfi ``pattern`` to H.264 with a GOP of ``gop_s`` seconds."""
    import av

    t0 = time.perf_counter()
    src = av.open(f"{pattern}=size={width}x{height}:rate={fps}", format="lavfi")
    out = av.open(str(path), "w", format="mp4")
    st = out.add_stream("libx264", rate=Fraction(fps))
    st.width, st.height, st.pix_fmt = width, height, "yuv420p"
    st.options = {"crf": "23", "preset": "ultrafast", "g": str(int(gop_s * fps)), "keyint_min": str(int(gop_s * fps))}
    n_total = int(seconds * fps)
    for n, frame in enumerate(src.decode(video=0)):
        if n >= n_total:
            break
        frame = frame.reformat(format="yuv420p")
        frame.pts, frame.time_base = n, Fraction(1, fps)
        for p in st.encode(frame):
            out.mux(p)
    for p in st.encode(None):
        out.mux(p)
    out.close()
    src.close()
    return time.perf_counter() - t0


def segments(seconds: float, n: int, seed: int) -> list[tuple[float, float]]:
    """Random EPIC-like action segments (1-4 s) inside the video."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        length = float(rng.uniform(1.0, 4.0))
        start = float(rng.uniform(0, seconds - length - 0.1))
        out.append((start, start + length))
    return out


def rate(fn, n: int, warmup: int = 2) -> float:
    for i in range(warmup):
        fn(i)
    t0 = time.perf_counter()
    for i in range(n):
        fn(i)
    return n / (time.perf_counter() - t0)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--width", type=int, default=1920)
    p.add_argument("--height", type=int, default=1080)
    p.add_argument("--fps", type=int, default=60)
    p.add_argument("--gop-seconds", type=float, default=4.0)
    p.add_argument("--pattern", default="testsrc2", help="lavfi source: testsrc2 | mandelbrot | life | ...")
    p.add_argument("--clips", type=int, default=30, help="timed clips per method")
    p.add_argument("--num-frames", type=int, default=16)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--loader-batches", type=int, default=10)
    p.add_argument("--workdir", default=None, help="keep files here (default: a temp dir, removed)")
    a = p.parse_args(argv)

    from torchvision.transforms.v2 import functional as F

    from avion_ds.config import DataConfig
    from avion_ds.data import build_dataset, build_loader
    from avion_ds.data.chunking import chunk_videos
    from avion_ds.data.crop import clip_rng, random_resized_crop
    from avion_ds.data.decoders import available_backends, get_decoder
    from avion_ds.data.manifest import load_manifest
    from avion_ds.data.sampling import map_to_chunks, seconds_to_frames, segment_indices
    from avion_ds.data.synthetic import EPIC_COLUMNS, _timestamp

    torch.set_num_threads(1)
    work = Path(a.workdir) if a.workdir else Path(tempfile.mkdtemp(prefix="avion_bench_"))
    work.mkdir(parents=True, exist_ok=True)
    src = work / "src" / "P01_01.mp4"
    src.parent.mkdir(exist_ok=True)
    if not src.is_file():
        t = make_source(src, a.seconds, a.width, a.height, a.fps, a.gop_seconds, a.pattern)
        print(f"source: {a.seconds:g} s {a.width}x{a.height} @ {a.fps} fps, GOP {a.gop_seconds:g} s, {a.pattern}: "
              f"{src.stat().st_size / 1e6:.1f} MB, generated in {t:.1f} s")
    summary = chunk_videos(src.parent, work / "chunks", progress=False, workers=1)
    print(f"chunk (15 s, short side 320, 30 fps, GOP 16, CRF 23; 1 worker): {summary.seconds:.1f} s for "
          f"{a.seconds:g} s of video ({'up to date' if summary.skipped else 'encoded'})")
    if summary.failed:
        print(summary)
        return 1
    segs = segments(a.seconds, max(a.clips + 4, 4 * a.loader_batches + 12), seed=0)
    csv_path = work / "segments.csv"
    with csv_path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(EPIC_COLUMNS), extrasaction="ignore")
        w.writeheader()
        for i, (s, e) in enumerate(segs):
            w.writerow({"narration_id": f"P01_01_{i}", "video_id": "P01_01", "start_timestamp": _timestamp(s),
                        "stop_timestamp": _timestamp(e), "verb_class": 0, "noun_class": 0})
    T, S = a.num_frames, a.size
    cfg = DataConfig(dataset="epic", root=str(work / "chunks"), train_csv=str(csv_path), val_csv=str(csv_path),
                     num_frames=T, size=S, decode_timeout_s=0.0)
    results: dict[str, float] = {}

    # (a) naive: decord on the long source, accurate get_batch, RRC + resize on CPU
    import decord

    def naive(i: int) -> torch.Tensor:
        start, end = segs[i]
        vr = decord.VideoReader(str(src), ctx=decord.cpu(0), num_threads=1)
        rng = clip_rng(0, 0, i)
        f0, f1 = seconds_to_frames(start, end, float(vr.get_avg_fps()))
        idx = segment_indices(f0, min(f1, len(vr)), T, train=True, rng=rng)
        frames = torch.from_numpy(vr.get_batch(idx).asnumpy()).permute(0, 3, 1, 2)
        b = random_resized_crop(frames.shape[2], frames.shape[3], (0.5, 1.0), (0.75, 4 / 3), rng)
        return F.resized_crop(frames, b.top, b.left, b.height, b.width, [S, S], antialias=True)

    results["(a) naive decord, long video, CPU crop"] = rate(naive, a.clips)

    # (b) chunked + fused, through the dataset
    for name in available_backends():
        ds = build_dataset(DataConfig(**{**cfg.__dict__, "decoder": name}), "train")
        results[f"(b) chunked+fused {name}"] = rate(lambda i, ds=ds: ds[i]["frames"], a.clips)
    ds_t = build_dataset(DataConfig(**{**cfg.__dict__, "decode_timeout_s": 60.0}), "train")
    results["(b) chunked+fused decord via timeout helper"] = rate(lambda i: ds_t[i]["frames"], a.clips)
    ds_t.decoder.close()
    ds_nf = build_dataset(cfg, "train")
    ds_nf._decoder = get_decoder("decord", fuse=False)
    results["(b') chunked decord, crop after decode"] = rate(lambda i: ds_nf[i]["frames"], a.clips)

    # (c) floor: only the needed frames of the chunks, no crop / resize, per backend
    entry = load_manifest(work / "chunks")["P01_01"]

    def floor_fn(dec):
        def floor(i: int) -> None:
            start, end = segs[i]
            f0, f1 = seconds_to_frames(start, end, entry.fps)
            idx = segment_indices(f0, f1, T, train=True, rng=clip_rng(0, 0, i))
            for path, local in map_to_chunks(idx, entry):
                dec.decode(path, local)
        return floor

    floors = {name: rate(floor_fn(get_decoder(name)), a.clips) for name in available_backends()}
    for name, v in floors.items():
        results[f"(c) floor {name}: needed chunk frames, no crop"] = v

    base = results["(a) naive decord, long video, CPU crop"]
    print(f"\n16-frame training clips/s, 1 process, 1 decoder thread, {T}x{S}x{S} output")
    print(f"{'method':<50} {'clips/s':>8} {'vs (a)':>8} {'vs (c)':>8}")
    for k, v in results.items():
        backend = next((b for b in floors if b in k), "decord")
        print(f"{k:<50} {v:8.2f} {v / base:7.1f}x {v / floors[backend]:7.2f}x")

    # DataLoader throughput, 2 workers (decord, timeout helper on as in the default recipe)
    ds = build_dataset(DataConfig(**{**cfg.__dict__, "decode_timeout_s": 60.0}), "train")
    loader = build_loader(ds, batch_size=4, workers=2, shuffle=True, seed=0, drop_last=True, distributed=False)
    it = iter(loader)
    next(it)
    next(it)
    t0, n = time.perf_counter(), 0
    for _ in range(min(a.loader_batches, len(loader) - 2)):
        n += next(it)["frames"].shape[0]
    print(f"\nDataLoader, 2 workers, batch 4, decord + timeout helper: {n / (time.perf_counter() - t0):.2f} clips/s")
    if not a.workdir:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
