"""Shared pieces of the loader benchmarks (bench/loader.py, bench/loader_ab.py): the clips every path
decodes, interleaved timing, and the ratios reported."""

from __future__ import annotations

import csv
import statistics
import time
from pathlib import Path


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
        f0, f1 = seconds_to_frames(
            parse_timestamp(r["start_timestamp"]), parse_timestamp(r["stop_timestamp"]), entry.fps
        )
        rng = clip_rng(0, 0, i, 0)
        idx = segment_indices(f0, f1, cfg.num_frames, train=True, rng=rng)
        box = random_resized_crop(entry.height, entry.width, tuple(cfg.crop_scale), tuple(cfg.crop_ratio), rng)
        out.append((map_to_chunks(idx, entry), box))
    return out


def timed_rounds(
    paths: dict, n: int, repeats: int, helper_cpu: dict | None = None
) -> tuple[dict[str, list[float]], dict[str, float]]:
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


def fused_runner(cfg, entry, reqs):
    """``run(dec, i)``: clip ``i``'s chunks through decoder ``dec`` with the clip's crop (no dataset around it)."""
    from avion_ds.data.crop import CropSpec

    def run(dec, i: int) -> None:
        for p, loc in reqs[i][0]:
            dec.decode(p, loc, CropSpec(reqs[i][1], (cfg.size, cfg.size), entry.height, entry.width))

    return run


def warm_pair(name: str, run):
    """(in-process decoder, decoder through the timeout helper) for backend ``name``, each run once."""
    from avion_ds.data.decode.select import get_decoder

    inproc, helper = get_decoder(name, exact=False), get_decoder(name, timeout_s=60, exact=False)
    run(inproc, 0)
    run(helper, 0)
    return inproc, helper


def chosen_backends(a) -> list[str]:
    """The installed CPU backends, narrowed to ``--backends`` when given."""
    from avion_ds.data.decode.select import available_backends

    return [b for b in available_backends() if not a.backends or b in a.backends.split(",")]
