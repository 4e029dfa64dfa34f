"""A/B comparisons for bench/loader.py (``--parts helpercpu,helperab,floorab,faults``): each compares
two ways of getting the same clips, alternating clip by clip, with nothing else in the process.

Run the helper A/B pinned to one CPU (``--cpu K``; the helper processes inherit it). Unpinned, the
scheduler put every in-process decode on one CPU and every helper decode on the other (``helperab``
prints where each path ran), and the bench VM's two vCPUs differ in speed by up to 41%, by the
minute: an unpinned A/B then measures the two vCPUs, not the helper.
"""

from __future__ import annotations

import collections
import os
import time
from collections.abc import Callable
from pathlib import Path

from loader_common import (
    chosen_backends,
    clip_requests,
    fused_runner,
    ratio,
    timed_rounds,
    warm_pair,
)


def part_helper_cpu(a, cfg, entry, csv_path: Path) -> None:
    """CPU seconds per clip in-process vs through the timeout helper (parent + helper), per backend.

    Wall-clock helper costs on a loaded machine include scheduler wake-up latency; this isolates the
    mechanism's own CPU cost: the parent's ``process_time`` plus the helper's own ``process_time``
    (all its threads, reported with every reply), per clip, interleaved, median of per-clip ratios.
    """
    from avion_ds.data.crop import CropSpec
    from avion_ds.data.decode.select import get_decoder

    reqs = clip_requests(csv_path, entry, cfg, a.clips)
    run = fused_runner(cfg, entry, reqs)
    print(
        f"\ntimeout helper CPU cost ({a.clips} clips x {a.repeats} rounds, interleaved; load average "
        f"{os.getloadavg()[0]:.1f})"
    )
    for name in chosen_backends(a):
        inproc, helper = warm_pair(name, run)
        cpu_in, cpu_h = [0.0] * a.clips, [0.0] * a.clips
        for r in range(a.repeats):
            for i in range(a.clips):
                for first in (inproc, helper) if (i + r) % 2 else (helper, inproc):
                    t, c0 = time.process_time(), helper.helper_cpu_s
                    run(first, i)
                    if first is inproc:
                        cpu_in[i] += time.process_time() - t
                    else:
                        cpu_h[i] += time.process_time() - t + helper.helper_cpu_s - c0
        n = a.clips * a.repeats
        print(
            f"  {name:<11} in-process {sum(cpu_in) / n * 1e3:6.2f} ms CPU/clip, helper (parent + helper) "
            f"{sum(cpu_h) / n * 1e3:6.2f} ms: {1 - ratio(cpu_h, cpu_in):+.1%} (median per clip), "
            f"{sum(cpu_h) / sum(cpu_in) - 1:+.1%} (totals)"
        )
        helper.close()
    # the mechanism alone: a backend that decodes nothing (bench/null_backend.py, loaded in the helper too)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, (str(Path(__file__).parent), os.environ.get("PYTHONPATH"))))
    os.environ["AVION_DS_DECODER_PLUGINS"] = ",".join(
        filter(None, (os.environ.get("AVION_DS_DECODER_PLUGINS"), "null_backend"))
    )
    inproc, helper = get_decoder("null"), get_decoder("null", timeout_s=60)
    path, spec, calls = reqs[0][0][0][0], CropSpec(None, (cfg.size, cfg.size), entry.height, entry.width), 2000
    res = {}
    for dec in (inproc, helper, inproc, helper):  # warm-up pass, then the timed pass
        t, w, c0 = time.process_time(), time.perf_counter(), helper.helper_cpu_s
        for _ in range(calls):
            dec.decode(path, list(range(16)), spec)
        res[dec is helper] = (time.perf_counter() - w, time.process_time() - t + helper.helper_cpu_s - c0)
    (w_in, c_in), (w_h, c_h) = res[False], res[True]
    print(
        f"  mechanism only (null backend, {calls} calls): helper minus in-process per call: wall "
        f"{(w_h - w_in) / calls * 1e6:.0f} us, CPU (parent + helper) {(c_h - c_in) / calls * 1e6:.0f} us"
    )
    helper.close()


def busy_ticks() -> list[int]:
    """user + nice + system clock ticks so far, per CPU (/proc/stat)."""
    with open("/proc/stat") as f:
        return [sum(map(int, line.split()[1:4])) for line in f if line.startswith("cpu") and line[3] != " "]


def placed(fn: Callable[[int], object], where: collections.Counter) -> Callable[[int], None]:
    """``fn`` that also counts, in ``where``, the CPU busiest while it ran (which CPU did the work)."""

    def run(i: int) -> None:
        t0 = busy_ticks()
        fn(i)
        busy = [b - a for a, b in zip(t0, busy_ticks(), strict=True)]
        where[max(range(len(busy)), key=busy.__getitem__)] += 1

    return run


def part_helper_ab(a, cfg) -> None:
    """The helper's cost with nothing else in the comparison: per backend, the same dataset in-process and
    through two identical helpers A and B (separate processes), clip by clip, order rotated. A vs B is the
    control: two processes doing the same work differ by this much on this machine, so a helper cost
    smaller than that spread cannot be read off a single run (pool the runs; BENCHMARKS.md)."""
    from dataclasses import replace

    from avion_ds.data import build_dataset

    print(
        f"\ntimeout helper A/B, in-process vs two identical helpers ({a.clips} clips x {a.repeats} rounds, "
        f"interleaved; load average {os.getloadavg()[0]:.1f}); wall = median per clip, CPU = totals (+ helper's)"
    )
    for b in chosen_backends(a):
        ds = build_dataset(replace(cfg, decoder=b, decode_timeout_s=0.0), "train")
        helpers = {k: build_dataset(replace(cfg, decoder=b), "train") for k in ("A", "B")}
        where = {k: collections.Counter() for k in ("in", *helpers)}
        paths = {"in": placed(lambda i, ds=ds: ds[i]["frames"], where["in"])}
        paths.update({k: placed(lambda i, ds=h: ds[i]["frames"], where[k]) for k, h in helpers.items()})
        times, cpu = timed_rounds(
            paths, a.clips, a.repeats, {k: (lambda ds=h: ds.decoder.helper_cpu_s) for k, h in helpers.items()}
        )
        n = a.clips * a.repeats
        print(
            f"  {b:<11} wall: helper A {1 - ratio(times['A'], times['in']):+6.1%}, B {1 - ratio(times['B'], times['in']):+6.1%}"
            f" (control A vs B {1 - ratio(times['A'], times['B']):+6.1%});  CPU: A {cpu['A'] / cpu['in'] - 1:+6.1%}, "
            f"B {cpu['B'] / cpu['in'] - 1:+6.1%} (in-process {cpu['in'] / n * 1e3:.1f} ms/clip)\n{'':14}busiest CPU "
            f"while each path ran (clips): "
            + "; ".join(f"{k} " + ", ".join(f"CPU {c}: {m}" for c, m in sorted(v.items())) for k, v in where.items())
        )
        for h in helpers.values():
            h.decoder.close()


def part_floor_ab(a, cfg, entry, csv_path: Path) -> None:
    """Fused vs the backend's own floor with nothing else in the comparison: per backend, the in-process
    dataset path (decode + crop + resize) vs the same clips' frames decoded uncropped, alternating clip by
    clip (in the 11-path ``paths`` table the other paths' decoder threads and helper processes share the
    two cores with whichever path runs next)."""
    from dataclasses import replace

    from avion_ds.data import build_dataset
    from avion_ds.data.decode.select import get_decoder

    reqs = clip_requests(csv_path, entry, cfg, a.clips)
    print(
        f"\nfused vs floor A/B, two paths only ({a.clips} clips x {a.repeats} rounds, interleaved; load average "
        f"{os.getloadavg()[0]:.1f})"
    )
    for b in chosen_backends(a):
        ds = build_dataset(replace(cfg, decoder=b, decode_timeout_s=0.0), "train")
        dec = get_decoder(b, exact=False)
        paths = {
            "fused": lambda i, ds=ds: ds[i]["frames"],
            "floor": lambda i, dec=dec: [dec.decode(p, loc) for p, loc in reqs[i][0]],
        }
        times, cpu = timed_rounds(paths, a.clips, a.repeats)
        n = a.clips * a.repeats
        print(
            f"  {b:<11} fused vs floor: wall {ratio(times['fused'], times['floor']):.2f}x (median per clip), "
            f"{sum(times['floor']) / sum(times['fused']):.2f}x (totals); CPU {cpu['floor'] / cpu['fused']:.2f}x "
            f"(totals: {cpu['floor'] / n * 1e3:.1f} -> {cpu['fused'] / n * 1e3:.1f} ms/clip)"
        )


def part_faults(a, cfg, entry, csv_path: Path) -> None:
    """Minor page faults per clip (fresh memory touched), in-process and in the helper, per backend: run once
    as is and once with AVION_DS_MALLOC_TUNE=0 to see what the malloc thresholds save."""
    import resource

    run = fused_runner(cfg, entry, clip_requests(csv_path, entry, cfg, a.clips))

    def faults(pid: int | None = None) -> int:
        if pid is None:
            return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[7])

    print(
        f"\nminor page faults per clip ({a.clips} clips; AVION_DS_MALLOC_TUNE="
        f"{os.environ.get('AVION_DS_MALLOC_TUNE', '1')})"
    )
    for b in chosen_backends(a):
        inproc, helper = warm_pair(b, run)
        f0 = faults()
        for i in range(a.clips):
            run(inproc, i)
        f1, h0 = faults(), faults(helper.helper_pid)
        for i in range(a.clips):
            run(helper, i)
        h1 = faults(helper.helper_pid)
        print(
            f"  {b:<11} in-process {(f1 - f0) / a.clips:7.0f}   helper process {(h1 - h0) / a.clips:7.0f}   "
            f"(helper malloc tuned: {helper.helper_malloc_tuned})"
        )
        helper.close()
