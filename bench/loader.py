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
cost with only the in-process and helper paths in the comparison), ``floorab`` (fused vs the backend's floor
with only those two paths in the comparison), ``faults`` (minor page faults per clip; run it again with
``AVION_DS_MALLOC_TUNE=0`` for glibc's default malloc).

    python bench/loader.py --workdir /tmp/bench --parts paths,scaling,encode [--pattern mandelbrot]
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import shutil
import statistics
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
    from avion_ds.data.synthetic import EPIC_COLUMNS, format_timestamp

    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(EPIC_COLUMNS), extrasaction="ignore")
        w.writeheader()
        for i, (s, e) in enumerate(segs):
            w.writerow({"narration_id": f"P01_01_{i}", "video_id": "P01_01", "start_timestamp": format_timestamp(s),
                        "stop_timestamp": format_timestamp(e), "verb_class": 0, "noun_class": 0})


def clip_requests(csv_path: Path, entry, cfg, n: int) -> list[tuple[list[tuple[str, list[int]]], object]]:
    """[(chunk parts, crop box)] for the first ``n`` rows, drawn exactly as EpicDataset draws them."""
    from avion_ds.data.crop import clip_rng, random_resized_crop
    from avion_ds.data.sampling import (
        map_to_chunks,
        parse_timestamp,
        seconds_to_frames,
        segment_indices,
    )

    rows = list(csv.DictReader(csv_path.open()))[:n]
    out = []
    for i, r in enumerate(rows):
        f0, f1 = seconds_to_frames(parse_timestamp(r["start_timestamp"]), parse_timestamp(r["stop_timestamp"]), entry.fps)
        rng = clip_rng(0, 0, i, 0)
        idx = segment_indices(f0, f1, cfg.num_frames, train=True, rng=rng)
        box = random_resized_crop(entry.height, entry.width, tuple(cfg.crop_scale), tuple(cfg.crop_ratio), rng)
        out.append((map_to_chunks(idx, entry), box))
    return out


def reference(parts, box, size: int) -> torch.Tensor:
    """AVION-style: decord VideoReader per chunk, get_batch, torchvision resized_crop on uint8."""
    import decord
    from torchvision.transforms.v2 import functional as F

    out = []
    for path, local in parts:
        vr = decord.VideoReader(path, num_threads=1)
        x = torch.from_numpy(vr.get_batch(local).asnumpy()).permute(0, 3, 1, 2)
        x = F.resized_crop(x, box.top, box.left, box.height, box.width, [size, size],
                           interpolation=F.InterpolationMode.BILINEAR, antialias=True)
        out.append(x.permute(0, 2, 3, 1))
    return out[0] if len(out) == 1 else torch.cat(out)


def timed_rounds(paths: dict, n: int, repeats: int,
                 helper_cpu: dict | None = None) -> tuple[dict[str, list[float]], dict[str, float]]:
    """(wall seconds per clip of each path summed over ``repeats`` rounds, indexed by clip; total CPU seconds
    of each path: this process's ``process_time`` plus, for paths in ``helper_cpu``, their helper's).

    Interleaved at the clip level (clip i through every path, the order rotated per clip and round)
    so that load from other jobs on a shared machine hits every path alike. CPU time counts every
    thread (decord runs a decode thread of its own next to the caller's even at ``num_threads=1``).
    """
    helper_cpu = helper_cpu or {}
    names = list(paths)
    for name in names:  # warm-up: helper processes, library init, page cache
        paths[name](0)
    times: dict[str, list[float]] = {k: [0.0] * n for k in names}
    cpu = dict.fromkeys(names, 0.0)
    for r in range(repeats):
        for i in range(n):
            k = (i + r) % len(names)
            for name in names[k:] + names[:k]:
                helper = helper_cpu.get(name, lambda: 0.0)
                h0, c0, t0 = helper(), time.process_time(), time.perf_counter()
                paths[name](i)
                times[name][i] += time.perf_counter() - t0
                cpu[name] += time.process_time() - c0 + helper() - h0
    return times, cpu


def rate(ts: list[float], repeats: int) -> float:
    """Clips/s over all clips and rounds."""
    return len(ts) * repeats / sum(ts)


def ratio(a: list[float], b: list[float]) -> float:
    """Speed of ``a`` relative to ``b``: median over clips of time(b) / time(a) (robust to load spikes)."""
    return statistics.median(tb / ta for ta, tb in zip(a, b, strict=True))


def part_paths(a, work: Path, cfg, entry, csv_path: Path) -> None:
    from dataclasses import replace

    from avion_ds.data import build_dataset
    from avion_ds.data.decoders import available_backends, get_decoder

    S = cfg.size
    reqs = clip_requests(csv_path, entry, cfg, a.clips)
    default = build_dataset(cfg, "train")
    print(f"default recipe path: data.decoder=auto -> {default.decoder_name}, decode_timeout_s={cfg.decode_timeout_s:g}")
    paths = {"ref  AVION-style (decord get_batch + CPU resized_crop)": lambda i: reference(*reqs[i], S),
             "default recipe (auto + timeout helper)": lambda i: default[i]["frames"]}
    helper_cpu = {"default recipe (auto + timeout helper)": lambda: default.decoder.helper_cpu_s}
    backends = available_backends(cuda=True)  # torchcodec-cuda joins where a GPU exists
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
    print(f"\n16-frame training clips/s, 1 process, 1 decoder thread, 1 torch thread, {cfg.num_frames}x{S}x{S}; "
          f"{a.clips} clips x {a.repeats} rounds interleaved per clip; load average before: {load:.1f}, after: "
          f"{os.getloadavg()[0]:.1f}; ratios = median over clips of per-clip time ratios; CPU = all threads "
          f"(+ the helper's), 'per CPU-s vs ref' = clips per CPU second relative to the reference (totals)")
    print(f"{'path':<58} {'clips/s':>8} {'vs ref':>7} {'vs floor':>9} {'helper':>7} {'CPU ms/clip':>12} "
          f"{'per CPU-s vs ref':>17}")
    n_clips = a.clips * a.repeats
    for name, ts in times.items():
        b = max((x for x in backends if name.startswith((f"fused {x} ", f"floor {x}:")) or name == f"fused {x}"),
                key=len, default=None)
        if name.startswith("default"):
            b = default.decoder_name
        fl = f"{ratio(ts, times[floors[b]]):8.2f}x" if b in floors else f"{'':9}"
        hc = f"{1 - ratio(ts, times[f'fused {b}']):+7.1%}" if name.endswith("timeout helper") else ""
        print(f"{name:<58} {rate(ts, a.repeats):8.2f} {ratio(ts, ref):6.2f}x {fl} {hc:>7} "
              f"{cpu[name] / n_clips * 1e3:12.1f} {ref_cpu / cpu[name]:16.2f}x")
    d = default.decoder_name
    print("\ntargets (this run):")
    print(f"  default recipe >= 1.2x reference: {ratio(times['default recipe (auto + timeout helper)'], ref):.2f}x")
    for b in backends:
        fused, helper = times[f"fused {b}"], times[f"fused {b} + timeout helper"]
        print(f"  fused {b} >= 0.9x its floor: {ratio(fused, times[floors[b]]):.2f}x;  timeout helper "
              f"cost <= 3%: {1 - ratio(helper, fused):+.1%}")
    print(f"  (the default path runs {d} through the helper)")
    for ds in helpers.values():
        ds.decoder.close()
    default.decoder.close()


def part_scaling(a, cfg) -> None:
    from avion_ds.data import build_dataset
    from avion_ds.data.loader_bench import clips_per_s_loader

    ds = build_dataset(cfg, "train")
    print(f"\nDataLoader, default recipe path ({ds.decoder_name} + timeout helper), batch 4, {a.loader_batches} "
          f"batches after 2 warm-up, {os.cpu_count()} CPUs, load average before: {os.getloadavg()[0]:.1f}")
    print(f"{'workers':>8} {'clips/s':>9} {'per worker':>11}")
    for w in (1, 2):
        r = clips_per_s_loader(ds, w, 4, a.loader_batches)
        print(f"{w:>8} {r:9.2f} {r / w:11.2f}")


def fused_runner(cfg, entry, reqs):
    """``run(dec, i)``: clip ``i``'s chunks through decoder ``dec`` with the clip's crop (no dataset around it)."""
    from avion_ds.data.crop import CropSpec

    def run(dec, i: int) -> None:
        for p, loc in reqs[i][0]:
            dec.decode(p, loc, CropSpec(reqs[i][1], (cfg.size, cfg.size), entry.height, entry.width))

    return run


def warm_pair(name: str, run):
    """(in-process decoder, decoder through the timeout helper) for backend ``name``, each run once."""
    from avion_ds.data.decoders import get_decoder

    inproc, helper = get_decoder(name, exact=False), get_decoder(name, timeout_s=60, exact=False)
    run(inproc, 0)
    run(helper, 0)
    return inproc, helper


def part_helper_cpu(a, cfg, entry, csv_path: Path) -> None:
    """CPU seconds per clip in-process vs through the timeout helper (parent + helper), per backend.

    Wall-clock helper costs on a loaded machine include scheduler wake-up latency; this isolates the
    mechanism's own CPU cost: the parent's ``process_time`` plus the helper's own ``process_time``
    (all its threads, reported with every reply), per clip, interleaved, median of per-clip ratios.
    """
    from avion_ds.data.crop import CropSpec
    from avion_ds.data.decoders import available_backends, get_decoder

    reqs = clip_requests(csv_path, entry, cfg, a.clips)
    run = fused_runner(cfg, entry, reqs)
    print(f"\ntimeout helper CPU cost ({a.clips} clips x {a.repeats} rounds, interleaved; load average "
          f"{os.getloadavg()[0]:.1f})")
    for name in available_backends():
        inproc, helper = warm_pair(name, run)
        cpu_in, cpu_h = [0.0] * a.clips, [0.0] * a.clips
        for r in range(a.repeats):
            for i in range(a.clips):
                for first in ((inproc, helper) if (i + r) % 2 else (helper, inproc)):
                    t, c0 = time.process_time(), helper.helper_cpu_s
                    run(first, i)
                    if first is inproc:
                        cpu_in[i] += time.process_time() - t
                    else:
                        cpu_h[i] += time.process_time() - t + helper.helper_cpu_s - c0
        n = a.clips * a.repeats
        print(f"  {name:<11} in-process {sum(cpu_in) / n * 1e3:6.2f} ms CPU/clip, helper (parent + helper) "
              f"{sum(cpu_h) / n * 1e3:6.2f} ms: {1 - ratio(cpu_h, cpu_in):+.1%} (median per clip), "
              f"{sum(cpu_h) / sum(cpu_in) - 1:+.1%} (totals)")
        helper.close()
    # the mechanism alone: a backend that decodes nothing (bench/null_backend.py, loaded in the helper too)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, (str(Path(__file__).parent), os.environ.get("PYTHONPATH"))))
    os.environ["AVION_DS_DECODER_PLUGINS"] = ",".join(filter(None, (os.environ.get("AVION_DS_DECODER_PLUGINS"),
                                                                      "null_backend")))
    inproc, helper = get_decoder("null"), get_decoder("null", timeout_s=60)
    path, spec, calls = reqs[0][0][0][0], CropSpec(None, (cfg.size, cfg.size), entry.height, entry.width), 2000
    res = {}
    for dec in (inproc, helper, inproc, helper):  # warm-up pass, then the timed pass
        t, w, c0 = time.process_time(), time.perf_counter(), helper.helper_cpu_s
        for _ in range(calls):
            dec.decode(path, list(range(16)), spec)
        res[dec is helper] = (time.perf_counter() - w, time.process_time() - t + helper.helper_cpu_s - c0)
    (w_in, c_in), (w_h, c_h) = res[False], res[True]
    print(f"  mechanism only (null backend, {calls} calls): helper minus in-process per call: wall "
          f"{(w_h - w_in) / calls * 1e6:.0f} us, CPU (parent + helper) {(c_h - c_in) / calls * 1e6:.0f} us")
    helper.close()


def part_floor_ab(a, cfg, entry, csv_path: Path) -> None:
    """Fused vs the backend's own floor with nothing else in the comparison: per backend, the in-process
    dataset path (decode + crop + resize) vs the same clips' frames decoded uncropped, alternating clip by
    clip (in the 11-path ``paths`` table the other paths' decoder threads and helper processes share the
    two cores with whichever path runs next)."""
    from dataclasses import replace

    from avion_ds.data import build_dataset
    from avion_ds.data.decoders import available_backends, get_decoder

    reqs = clip_requests(csv_path, entry, cfg, a.clips)
    print(f"\nfused vs floor A/B, two paths only ({a.clips} clips x {a.repeats} rounds, interleaved; load average "
          f"{os.getloadavg()[0]:.1f})")
    for b in available_backends():
        ds = build_dataset(replace(cfg, decoder=b, decode_timeout_s=0.0), "train")
        dec = get_decoder(b, exact=False)
        paths = {"fused": lambda i, ds=ds: ds[i]["frames"],
                 "floor": lambda i, dec=dec: [dec.decode(p, loc) for p, loc in reqs[i][0]]}
        times, cpu = timed_rounds(paths, a.clips, a.repeats)
        n = a.clips * a.repeats
        print(f"  {b:<11} fused vs floor: wall {ratio(times['fused'], times['floor']):.2f}x (median per clip), "
              f"{sum(times['floor']) / sum(times['fused']):.2f}x (totals); CPU {cpu['floor'] / cpu['fused']:.2f}x "
              f"(totals: {cpu['floor'] / n * 1e3:.1f} -> {cpu['fused'] / n * 1e3:.1f} ms/clip)")


def part_faults(a, cfg, entry, csv_path: Path) -> None:
    """Minor page faults per clip (fresh memory touched), in-process and in the helper, per backend: run once
    as is and once with AVION_DS_MALLOC_TUNE=0 to see what the malloc thresholds save."""
    import resource

    from avion_ds.data.decoders import available_backends

    run = fused_runner(cfg, entry, clip_requests(csv_path, entry, cfg, a.clips))

    def faults(pid: int | None = None) -> int:
        if pid is None:
            return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[7])

    print(f"\nminor page faults per clip ({a.clips} clips; AVION_DS_MALLOC_TUNE="
          f"{os.environ.get('AVION_DS_MALLOC_TUNE', '1')})")
    for b in available_backends():
        inproc, helper = warm_pair(b, run)
        f0 = faults()
        for i in range(a.clips):
            run(inproc, i)
        f1, h0 = faults(), faults(helper.helper_pid)
        for i in range(a.clips):
            run(helper, i)
        h1 = faults(helper.helper_pid)
        print(f"  {b:<11} in-process {(f1 - f0) / a.clips:7.0f}   helper process {(h1 - h0) / a.clips:7.0f}   "
              f"(helper malloc tuned: {helper.helper_malloc_tuned})")
        helper.close()


def part_helper_ab(a, cfg) -> None:
    """The helper's cost with nothing else in the comparison: per backend, the same dataset in-process vs
    through the helper, clip by clip, alternating (in the 11-path ``paths`` table decord's helper row
    reads higher; this isolates the helper from whatever the other paths do to the process)."""
    from dataclasses import replace

    from avion_ds.data import build_dataset
    from avion_ds.data.decoders import available_backends

    print(f"\ntimeout helper A/B, two paths only ({a.clips} clips x {a.repeats} rounds, interleaved; load average "
          f"{os.getloadavg()[0]:.1f})")
    for b in available_backends():
        ds = build_dataset(replace(cfg, decoder=b, decode_timeout_s=0.0), "train")
        dsh = build_dataset(replace(cfg, decoder=b), "train")
        paths = {"in": lambda i, ds=ds: ds[i]["frames"], "helper": lambda i, ds=dsh: ds[i]["frames"]}
        times, cpu = timed_rounds(paths, a.clips, a.repeats, {"helper": lambda ds=dsh: ds.decoder.helper_cpu_s})
        n = a.clips * a.repeats
        print(f"  {b:<11} wall {1 - ratio(times['helper'], times['in']):+6.1%} (median per clip), CPU "
              f"{cpu['helper'] / cpu['in'] - 1:+6.1%} (totals: {cpu['in'] / n * 1e3:.1f} -> "
              f"{cpu['helper'] / n * 1e3:.1f} ms/clip)")
        dsh.decoder.close()


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
    "veryfast crf23 (old default)": {"preset": "veryfast", "crf": "23"},
    "veryfast crf23 fastdecode": {"preset": "veryfast", "crf": "23", "tune": "fastdecode"},
    "veryfast crf21 fastdecode": {"preset": "veryfast", "crf": "21", "tune": "fastdecode"},
    "veryfast crf19 fastdecode": {"preset": "veryfast", "crf": "19", "tune": "fastdecode"},
    "ultrafast crf21": {"preset": "ultrafast", "crf": "21"},
}


def part_encode(a, work: Path, src: Path, cfg, csv_path: Path, entry) -> None:
    from avion_ds.data.chunking import chunk_videos
    from avion_ds.data.crop import CropSpec
    from avion_ds.data.decoders import available_backends, get_decoder

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
                paths[(name, b)] = lambda i, m=remap: reference([(m[p], loc) for p, loc in reqs[i][0]], reqs[i][1], cfg.size)
            else:
                dec = get_decoder(b, exact=False)
                paths[(name, b)] = lambda i, m=remap, dec=dec: [
                    dec.decode(m[p], loc, CropSpec(reqs[i][1], (cfg.size, cfg.size), entry.height, entry.width))
                    for p, loc in reqs[i][0]]
    times, _ = timed_rounds(paths, a.clips, a.repeats)
    base = next(iter(ENCODE_SETTINGS))
    b = next(k[1] for k in paths if k[1] != "ref")
    print(f"\nchunk encoding (GOP 16, no B-frames, {len(files)} chunks; PSNR vs lossless chunks, RGB); decode clips/s, "
          f"{a.clips} clips x {a.repeats} rounds interleaved per clip; load average after: {os.getloadavg()[0]:.1f}")
    print(f"{'x264 setting':<30} {'MB':>7} {'bytes':>6} {'PSNR dB':>8} {'ref c/s':>8} {'vs':>6} {b + ' c/s':>15} {'vs':>6}")
    for name, (size, psnr, _) in rows.items():
        r, f = times[(name, "ref")], times[(name, b)]
        print(f"{name:<30} {size / 1e6:7.2f} {size / rows[base][0]:5.2f}x {psnr:8.2f} {rate(r, a.repeats):8.2f} "
              f"{ratio(r, times[(base, 'ref')]):5.2f}x {rate(f, a.repeats):15.2f} {ratio(f, times[(base, b)]):5.2f}x")


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
    p.add_argument("--parts", default="paths,scaling",
                   help="comma-separated: paths, scaling, encode, helpercpu, helperab, floorab, faults")
    p.add_argument("--workdir", default=None, help="keep files here (default: a temp dir, removed)")
    a = p.parse_args(argv)
    parts = set(a.parts.split(","))

    from avion_ds.config import DataConfig
    from avion_ds.data.chunking import chunk_videos
    from avion_ds.data.malloc import tune_malloc
    from avion_ds.data.manifest import load_manifest

    torch.set_num_threads(1)
    # in-process paths stand for a DataLoader worker, which tunes its malloc (the helper does too)
    print(f"malloc tuned as in DataLoader workers and the helper: {tune_malloc()}")
    work = Path(a.workdir) if a.workdir else Path(tempfile.mkdtemp(prefix="avion_bench_"))
    work.mkdir(parents=True, exist_ok=True)
    src = work / "src" / "P01_01.mp4"
    src.parent.mkdir(exist_ok=True)
    if not src.is_file():
        t = make_source(src, a.seconds, a.width, a.height, a.fps, a.gop_seconds, a.pattern)
        print(f"source: {a.seconds:g} s {a.width}x{a.height} @ {a.fps} fps, GOP {a.gop_seconds:g} s, {a.pattern}: "
              f"{src.stat().st_size / 1e6:.1f} MB, generated in {t:.1f} s")
    summary = chunk_videos(src.parent, work / "chunks", progress=False, workers=1)
    entry = load_manifest(work / "chunks")["P01_01"]
    c = entry.chunks[0]
    print(f"chunks: {len(entry.chunks)} x {c.frames} frames {c.width}x{c.height} @ {c.fps:g} fps (avion-ds chunk "
          f"defaults: {summary.seconds:.1f} s, {'up to date' if summary.skipped else 'encoded'})")
    if summary.failed:
        print(summary)
        return 1
    seconds = entry.num_frames / entry.fps
    csv_path = work / "segments.csv"
    write_csv(csv_path, segments(seconds, max(a.clips, 4 * a.loader_batches + 12), seed=0))
    cfg = DataConfig(dataset="epic", root=str(work / "chunks"), train_csv=str(csv_path), val_csv=str(csv_path),
                     num_frames=a.num_frames, size=a.size)
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
