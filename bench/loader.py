"""Loader benchmark: every project decode path against a fixed AVION-style reference, side by side.

Generates an EPIC-like long source video with FFmpeg's lavfi sources through PyAV (default 60 s
1920x1080 at 60 fps, keyframe every 4 s; ``--pattern mandelbrot`` for content that is costly to
decode), chunks it with ``avion-ds chunk`` defaults, and times 16-frame training clips (TSN
sampling with jitter over random 1-4 s segments, RandomResizedCrop scale (0.5, 1) to 224) in ONE
process, one decoder thread, one torch thread. Every clip is the same (indices and crop box) for
every path, drawn exactly as the dataset draws them.

  ref      AVION-style reference (fixed): decord.VideoReader(chunk, num_threads=1), get_batch of the
           clip's frames, torchvision v2 resized_crop (bilinear, antialias) on the uint8 frames
  default  the default recipe's path: the dataset with DataConfig defaults (decoder auto, decode
           timeout helper on)
  fused B  the dataset with backend B, in-process; "+ helper": the same through the timeout helper
  floor B  backend B decoding only the clip's frames of the chunks, no crop / resize

Paths are interleaved per clip (clip i through every path, order rotated) for ``--repeats``
rounds; the table gives clips/s, and the median over clips of the per-clip speed ratio to the
reference, to the backend's own floor, and the helper's cost, followed by the targets. Parts: ``paths`` (default), ``scaling`` (DataLoader with 1 and 2 workers),
``encode`` (x264 settings at equal quality: decode clips/s vs chunk bytes vs PSNR), ``helpercpu``
(CPU cost of the timeout helper, free of scheduler latency), ``helperab`` (the helper's wall and CPU
cost against in-process, with a second identical helper as the control), ``floorab`` (fused vs the backend's floor
with only those two paths in the comparison), ``faults`` (minor page faults per clip; run it again with
``AVION_DS_MALLOC_TUNE=0`` for glibc's default malloc). The A/B parts live in bench/loader_ab.py.

    python bench/loader.py --workdir /tmp/bench --parts paths,scaling,encode [--pattern mandelbrot]
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import shutil
import tempfile
import time
from fractions import Fraction
from pathlib import Path

import numpy as np
import torch
from loader_ab import (
    part_faults,
    part_floor_ab,
    part_helper_ab,
    part_helper_cpu,
)
from loader_common import clip_requests, rate, ratio, timed_rounds


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
        frame.pts, frame.time_base, frame.pict_type = n, Fraction(1, fps), 0  # lavfi marks every frame I: clear
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


def write_csv(path: Path, segs: list[tuple[float, float]]) -> None:
    from avion_ds.data.prep.synthetic import EPIC_COLUMNS, format_timestamp

    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(EPIC_COLUMNS), extrasaction="ignore")
        w.writeheader()
        for i, (s, e) in enumerate(segs):
            w.writerow(
                {
                    "narration_id": f"P01_01_{i}",
                    "video_id": "P01_01",
                    "start_timestamp": format_timestamp(s),
                    "stop_timestamp": format_timestamp(e),
                    "verb_class": 0,
                    "noun_class": 0,
                }
            )


def reference(parts, box, size: int) -> torch.Tensor:
    """AVION-style: decord VideoReader per chunk, get_batch, torchvision resized_crop on uint8."""
    import decord
    from torchvision.transforms.v2 import functional as F

    out = []
    for path, local in parts:
        vr = decord.VideoReader(path, num_threads=1)
        x = torch.from_numpy(vr.get_batch(local).asnumpy()).permute(0, 3, 1, 2)
        x = F.resized_crop(
            x,
            box.top,
            box.left,
            box.height,
            box.width,
            [size, size],
            interpolation=F.InterpolationMode.BILINEAR,
            antialias=True,
        )
        out.append(x.permute(0, 2, 3, 1))
    return out[0] if len(out) == 1 else torch.cat(out)


def part_paths(a, work: Path, cfg, entry, csv_path: Path) -> None:
    from dataclasses import replace

    from avion_ds.data import build_dataset
    from avion_ds.data.decode.select import available_backends, get_decoder

    S = cfg.size
    reqs = clip_requests(csv_path, entry, cfg, a.clips)
    default = build_dataset(cfg, "train")
    print(
        f"default recipe path: data.decoder=auto -> {default.decoder_name}, decode_timeout_s={cfg.decode_timeout_s:g}"
    )
    paths = {
        "ref  AVION-style (decord get_batch + CPU resized_crop)": lambda i: reference(*reqs[i], S),
        "default recipe (auto + timeout helper)": lambda i: default[i]["frames"],
    }
    helper_cpu = {"default recipe (auto + timeout helper)": lambda: default.decoder.helper_cpu_s}
    backends = available_backends(cuda=True)  # torchcodec-cuda joins where a GPU exists
    backends = [b for b in backends if not a.backends or b in a.backends.split(",")]
    floors, helpers = {}, {}
    for b in backends:
        ds = build_dataset(replace(cfg, decoder=b, decode_timeout_s=0.0), "train")
        paths[f"fused {b}"] = lambda i, ds=ds: ds[i]["frames"]
        dsh = build_dataset(replace(cfg, decoder=b), "train")
        helpers[b] = dsh
        paths[f"fused {b} + timeout helper"] = lambda i, ds=dsh: ds[i]["frames"]
        helper_cpu[f"fused {b} + timeout helper"] = lambda ds=dsh: ds.decoder.helper_cpu_s
        dec = get_decoder(b, exact=False)
        floors[b] = f"floor {b}: clip frames, no crop"
        paths[floors[b]] = lambda i, dec=dec: [dec.decode(p, loc) for p, loc in reqs[i][0]]
    load = os.getloadavg()[0]
    # correctness first: every path's frames equal the reference's (crop within 1.5/255 on average)
    for i in range(min(3, a.clips)):
        ref = reference(*reqs[i], S).float()
        for name, fn in paths.items():
            if name.startswith(("fused", "default")):
                mad = (fn(i).float() - ref).abs().mean().item()
                if mad > 1.5:
                    print(f"WARNING: {name} clip {i} differs from the reference by {mad:.2f}/255 on average")
    times, cpu = timed_rounds(paths, a.clips, a.repeats, helper_cpu)
    ref = times[next(iter(paths))]
    ref_cpu = cpu[next(iter(paths))]
    print(
        f"\n16-frame training clips/s, 1 process, 1 decoder thread, 1 torch thread, {cfg.num_frames}x{S}x{S}; "
        f"{a.clips} clips x {a.repeats} rounds interleaved per clip; load average before: {load:.1f}, after: "
        f"{os.getloadavg()[0]:.1f}; ratios = median over clips of per-clip time ratios; CPU = all threads "
        f"(+ the helper's), 'per CPU-s vs ref' = clips per CPU second relative to the reference (totals)"
    )
    print(
        f"{'path':<58} {'clips/s':>8} {'vs ref':>7} {'vs floor':>9} {'helper':>7} {'CPU ms/clip':>12} "
        f"{'per CPU-s vs ref':>17}"
    )
    n_clips = a.clips * a.repeats
    for name, ts in times.items():
        b = max(
            (x for x in backends if name.startswith((f"fused {x} ", f"floor {x}:")) or name == f"fused {x}"),
            key=len,
            default=None,
        )
        if name.startswith("default"):
            b = default.decoder_name
        fl = f"{ratio(ts, times[floors[b]]):8.2f}x" if b in floors else f"{'':9}"
        hc = f"{1 - ratio(ts, times[f'fused {b}']):+7.1%}" if name.endswith("timeout helper") else ""
        print(
            f"{name:<58} {rate(ts, a.repeats):8.2f} {ratio(ts, ref):6.2f}x {fl} {hc:>7} "
            f"{cpu[name] / n_clips * 1e3:12.1f} {ref_cpu / cpu[name]:16.2f}x"
        )
    d = default.decoder_name
    print("\ntargets (this run):")
    print(f"  default recipe >= 1.2x reference: {ratio(times['default recipe (auto + timeout helper)'], ref):.2f}x")
    for b in backends:
        fused, helper = times[f"fused {b}"], times[f"fused {b} + timeout helper"]
        print(
            f"  fused {b} >= 0.9x its floor: {ratio(fused, times[floors[b]]):.2f}x;  timeout helper "
            f"cost <= 3%: {1 - ratio(helper, fused):+.1%}"
        )
    print(f"  (the default path runs {d} through the helper)")
    for ds in helpers.values():
        ds.decoder.close()
    default.decoder.close()


def part_scaling(a, cfg) -> None:
    from avion_ds.data import build_dataset
    from avion_ds.data.decode.loader_bench import clips_per_s_loader

    ds = build_dataset(cfg, "train")
    print(
        f"\nDataLoader, default recipe path ({ds.decoder_name} + timeout helper), batch 4, {a.loader_batches} "
        f"batches after 2 warm-up, {os.cpu_count()} CPUs, load average before: {os.getloadavg()[0]:.1f}"
    )
    print(f"{'workers':>8} {'clips/s':>9} {'per worker':>11}")
    for w in (1, 2):
        r = clips_per_s_loader(ds, w, 4, a.loader_batches)
        print(f"{w:>8} {r:9.2f} {r / w:11.2f}")


def _encode(src: Path, dst: Path, opts: dict[str, str]) -> int:
    """Re-encode every frame of ``src`` (a lossless chunk) with libx264 ``opts``; returns bytes."""
    import av

    with av.open(str(src)) as c:
        s = c.streams.video[0]
        fps = s.average_rate
        out = av.open(str(dst), "w", format="mp4")
        st = out.add_stream("libx264", rate=fps)
        st.width, st.height, st.pix_fmt = s.codec_context.width, s.codec_context.height, "yuv420p"
        st.options = {"g": "16", "keyint_min": "16", "sc_threshold": "0", "bf": "0", **opts}
        for n, f in enumerate(c.decode(s)):
            f.pts, f.time_base, f.pict_type = n, Fraction(1) / fps, 0  # x264 picks the types (GOP 16)
            for p in st.encode(f):
                out.mux(p)
        for p in st.encode(None):
            out.mux(p)
        out.close()
    return dst.stat().st_size


def _psnr(a: Path, b: Path) -> float:
    """RGB PSNR of every frame of ``a`` against ``b`` (the lossless chunk)."""
    import av

    se, n = 0.0, 0
    with av.open(str(a)) as ca, av.open(str(b)) as cb:
        for fa, fb in zip(ca.decode(video=0), cb.decode(video=0), strict=False):
            d = fa.to_ndarray(format="rgb24").astype(np.float32) - fb.to_ndarray(format="rgb24").astype(np.float32)
            se, n = se + float((d * d).sum()), n + d.size
    return 10 * math.log10(255**2 / (se / n)) if se else float("inf")


ENCODE_SETTINGS = {  # name -> libx264 options (GOP 16, no B-frames as in avion-ds chunk)
    "veryfast crf23 (no tune)": {"preset": "veryfast", "crf": "23"},
    "veryfast crf23 fastdecode": {"preset": "veryfast", "crf": "23", "tune": "fastdecode"},
    "veryfast crf21 fastdecode": {"preset": "veryfast", "crf": "21", "tune": "fastdecode"},
    "veryfast crf19 fastdecode": {"preset": "veryfast", "crf": "19", "tune": "fastdecode"},
    "ultrafast crf21": {"preset": "ultrafast", "crf": "21"},
}


def part_encode(a, work: Path, src: Path, cfg, csv_path: Path, entry) -> None:
    from avion_ds.data.crop import CropSpec
    from avion_ds.data.decode.select import available_backends, get_decoder
    from avion_ds.data.prep.chunking import chunk_videos

    lossless = work / "chunks_lossless"
    chunk_videos(src.parent, lossless, progress=False, workers=1, crf=0)
    reqs = clip_requests(csv_path, entry, cfg, a.clips)
    files = {c.path: lossless / "P01_01" / Path(c.path).name for c in entry.chunks}
    rows, paths = {}, {}
    for name, opts in ENCODE_SETTINGS.items():
        d = work / "encode" / name.split(" (")[0].replace(" ", "_")
        d.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        size = sum(_encode(lf, d / lf.name, opts) for lf in files.values())
        psnr = float(np.mean([_psnr(d / lf.name, lf) for lf in files.values()]))
        rows[name] = (size, psnr, time.perf_counter() - t0)
        remap = {p: str(d / Path(p).name) for p in files}
        for b in ("ref",) + tuple(x for x in ("torchcodec", "decord") if x in available_backends())[:1]:
            if b == "ref":
                paths[(name, b)] = lambda i, m=remap: reference(
                    [(m[p], loc) for p, loc in reqs[i][0]], reqs[i][1], cfg.size
                )
            else:
                dec = get_decoder(b, exact=False)
                paths[(name, b)] = lambda i, m=remap, dec=dec: [
                    dec.decode(m[p], loc, CropSpec(reqs[i][1], (cfg.size, cfg.size), entry.height, entry.width))
                    for p, loc in reqs[i][0]
                ]
    times, _ = timed_rounds(paths, a.clips, a.repeats)
    base = next(iter(ENCODE_SETTINGS))
    b = next(k[1] for k in paths if k[1] != "ref")
    print(
        f"\nchunk encoding (GOP 16, no B-frames, {len(files)} chunks; PSNR vs lossless chunks, RGB); decode clips/s, "
        f"{a.clips} clips x {a.repeats} rounds interleaved per clip; load average after: {os.getloadavg()[0]:.1f}"
    )
    print(
        f"{'x264 setting':<30} {'MB':>7} {'bytes':>6} {'PSNR dB':>8} {'ref c/s':>8} {'vs':>6} {b + ' c/s':>15} {'vs':>6}"
    )
    for name, (size, psnr, _) in rows.items():
        r, f = times[(name, "ref")], times[(name, b)]
        print(
            f"{name:<30} {size / 1e6:7.2f} {size / rows[base][0]:5.2f}x {psnr:8.2f} {rate(r, a.repeats):8.2f} "
            f"{ratio(r, times[(base, 'ref')]):5.2f}x {rate(f, a.repeats):15.2f} {ratio(f, times[(base, b)]):5.2f}x"
        )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--width", type=int, default=1920)
    p.add_argument("--height", type=int, default=1080)
    p.add_argument("--fps", type=int, default=60)
    p.add_argument("--gop-seconds", type=float, default=4.0)
    p.add_argument("--pattern", default="testsrc2", help="lavfi source: testsrc2 | mandelbrot | life | ...")
    p.add_argument("--clips", type=int, default=20, help="timed clips per path per round")
    p.add_argument("--repeats", type=int, default=3, help="interleaved rounds")
    p.add_argument("--num-frames", type=int, default=16)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--loader-batches", type=int, default=10)
    p.add_argument(
        "--parts",
        default="paths,scaling",
        help="comma-separated: paths, scaling, encode, helpercpu, helperab, floorab, faults",
    )
    p.add_argument("--workdir", default=None, help="keep files here (default: a temp dir, removed)")
    p.add_argument("--backends", default=None, help="comma-separated: only these backends in paths and the A/B parts")
    p.add_argument(
        "--cpu",
        type=int,
        default=None,
        help="pin this process (and so its decoder threads and helper processes) to this one CPU",
    )
    a = p.parse_args(argv)
    parts = set(a.parts.split(","))
    if a.cpu is not None:
        os.sched_setaffinity(0, {a.cpu})
        print(f"pinned to CPU {a.cpu} (helper processes and decoder threads inherit it)")

    from avion_ds.config import DataConfig
    from avion_ds.data.prep.chunking import chunk_videos
    from avion_ds.data.prep.manifest_index import load_manifest
    from avion_ds.distributed.malloc import tune_malloc

    torch.set_num_threads(1)
    # in-process paths stand for a DataLoader worker, which tunes its malloc (the helper does too)
    print(f"malloc tuned as in DataLoader workers and the helper: {tune_malloc()}")
    work = Path(a.workdir) if a.workdir else Path(tempfile.mkdtemp(prefix="avion_bench_"))
    work.mkdir(parents=True, exist_ok=True)
    src = work / "src" / "P01_01.mp4"
    src.parent.mkdir(exist_ok=True)
    if not src.is_file():
        t = make_source(src, a.seconds, a.width, a.height, a.fps, a.gop_seconds, a.pattern)
        print(
            f"source: {a.seconds:g} s {a.width}x{a.height} @ {a.fps} fps, GOP {a.gop_seconds:g} s, {a.pattern}: "
            f"{src.stat().st_size / 1e6:.1f} MB, generated in {t:.1f} s"
        )
    summary = chunk_videos(src.parent, work / "chunks", progress=False, workers=1)
    entry = load_manifest(work / "chunks")["P01_01"]
    c = entry.chunks[0]
    print(
        f"chunks: {len(entry.chunks)} x {c.frames} frames {c.width}x{c.height} @ {c.fps:g} fps (avion-ds chunk "
        f"defaults: {summary.seconds:.1f} s, {'up to date' if summary.skipped else 'encoded'})"
    )
    if summary.failed:
        print(summary)
        return 1
    seconds = entry.num_frames / entry.fps
    csv_path = work / "segments.csv"
    write_csv(csv_path, segments(seconds, max(a.clips, 4 * a.loader_batches + 12), seed=0))
    cfg = DataConfig(
        dataset="epic",
        root=str(work / "chunks"),
        train_csv=str(csv_path),
        val_csv=str(csv_path),
        num_frames=a.num_frames,
        size=a.size,
    )
    if "paths" in parts:
        part_paths(a, work, cfg, entry, csv_path)
    if "scaling" in parts:
        part_scaling(a, cfg)
    if "helpercpu" in parts:
        part_helper_cpu(a, cfg, entry, csv_path)
    if "helperab" in parts:
        part_helper_ab(a, cfg)
    if "faults" in parts:
        part_faults(a, cfg, entry, csv_path)
    if "floorab" in parts:
        part_floor_ab(a, cfg, entry, csv_path)
    if "encode" in parts:
        part_encode(a, work, src, cfg, csv_path, entry)
    if not a.workdir:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
