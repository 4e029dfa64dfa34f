"""Shards (``data.shards``) against the loose chunk tree, and a loopback S3 server against local shards, one process.

Three parts (``--parts``, default all):

* ``local``: clips/s of one training epoch read from local shards vs from the chunk tree they were packed
  from (the same rows, the same clips), 0 workers, A/B alternating, order flipped each round;
* ``s3``: clips/s of an epoch from ``s3://`` (moto's standalone server as a subprocess, behind a proxy
  adding ``--latency-ms`` before every request: index, HEAD checks, shard GETs; the proxy is a process of its
  own, as a real endpoint is out of the reader's process, or with ``--proxy thread`` threads of the bench
  process, copying every body under the reader's GIL) vs local shards; each
  s3 round opens the location afresh with an empty cache, so every shard download is in the timed epoch;
  opening (the start-up check's GET + HEADs, litdata's index) is timed apart; the S3 clients are built once
  per process (a run's first epoch), so the timed rounds are later epochs of a run with a cold cache, or with
  ``--fresh-clients`` every round builds them in its epoch as a run's first epoch does;
* ``pack``: the peak RSS of ``avion-ds pack`` (a subprocess, ``os.wait4``'s ``ru_maxrss``) over a tree of
  ``--pack-mib`` MiB of chunk files (hard links of a few random blobs: pack copies and hashes bytes, it
  never decodes) for each ``--pack-shard-mib``; pack's writer spools the shard being filled to disk, so the
  peak follows neither the shard size nor the tree size.

Printed: medians over ``--rounds`` timed rounds after ``--warmup`` rounds, and the ratios (targets: local
shards / tree >= 1.0, s3 / local shards >= 0.9, pack peak <= 1 GiB).

    python bench/shards.py                       # moderate: 8 videos, 112 px clips, 512 MiB pack tree (~5 min)
    python bench/shards.py --tiny                # the suite's smoke size (seconds)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.helpers.s3_server import Proxy, moto_server, proxy_process, s3_env, upload

PARTS = ("local", "s3", "pack")
BUCKET, PREFIX = "avion-bench", "shards"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=None, help="scratch directory (default: a temporary one, removed)")
    p.add_argument("--parts", default=",".join(PARTS), help=f"comma list of {', '.join(PARTS)}")
    p.add_argument("--videos", type=int, default=8)
    p.add_argument("--segments", type=int, default=24, help="annotated segments per video")
    p.add_argument("--width", type=int, default=160)
    p.add_argument("--height", type=int, default=120)
    p.add_argument("--size", type=int, default=112, help="clip crop size")
    p.add_argument("--frames", type=int, default=8, help="frames per clip")
    p.add_argument("--shard-kib", type=int, default=512, help="--shard-bytes of the timed shards, KiB")
    p.add_argument("--latency-ms", type=float, default=20.0, help="added before every request to the S3 server")
    p.add_argument("--proxy", choices=("process", "thread"), default="process", help="where the latency proxy runs")
    p.add_argument(
        "--fresh-clients",
        action="store_true",
        help="s3: new S3 clients every round (a run's first epoch); default: the process's, as a run's later epochs",
    )
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--pack-mib", type=int, default=512, help="size of the tree packed for the RSS figure")
    p.add_argument("--pack-shard-mib", default="64,256", help="comma list of --shard-bytes for the RSS figure, MiB")
    p.add_argument("--tiny", action="store_true", help="smoke size: 2 small videos, 8 MiB pack tree, 1 round")
    a = p.parse_args(argv)
    if a.tiny:
        a.videos, a.segments, a.width, a.height, a.size, a.frames = 2, 6, 64, 48, 32, 4
        a.shard_kib, a.warmup, a.rounds, a.pack_mib, a.pack_shard_mib = 32, 2, 1, 16, "2"
    a.parts = [x for x in a.parts.split(",") if x]
    bad = [x for x in a.parts if x not in PARTS]
    if bad:
        p.error(f"--parts: unknown {bad}; choose from {', '.join(PARTS)}")
    return a


def make_data(a: argparse.Namespace, work: Path) -> dict[str, Any]:
    """A synthetic EPIC tree, a recipe over it and its shards."""
    from avion_ds.cli.pack import main as pack_main
    from avion_ds.data.prep.chunking import chunk_videos
    from avion_ds.data.prep.synthetic import make_synthetic_epic
    from avion_ds.tasks import load_recipe
    from tests.helpers.recipes import write_recipe

    info = make_synthetic_epic(
        work / "synth", num_videos=a.videos, segments_per_video=a.segments, segment_seconds=1.0,
        width=a.width, height=a.height, fps=12, seed=1, val_fraction=0.25,
    )  # fmt: skip
    summary = chunk_videos(
        info["videos"], work / "chunks", chunk_seconds=4, short_side=a.height, fps=12, progress=False
    )
    if summary.failed:
        raise RuntimeError(f"chunking failed: {summary}")
    data = {"root": work / "chunks", "train_csv": info["train_csv"], "val_csv": info["val_csv"]}
    sections = {"data": {"decode_timeout_s": 0.0, "size": a.size, "num_frames": a.frames, "decoder": "pyav"}}
    recipe_path = write_recipe(work / "recipe.yaml", data, work / "run", **sections)
    shards = work / "shards"
    argv = [str(data["root"]), str(shards), "--shard-bytes", str(a.shard_kib << 10), "--config", str(recipe_path)]
    if pack_main(argv) != 0:
        raise RuntimeError("avion-ds pack failed")
    return {"recipe": load_recipe(recipe_path, []), "shards": shards, "work": work}


def epoch_seconds(make: Any, epoch: int) -> tuple[float, float, int]:
    """(seconds to build the dataset with ``make()``, seconds to read one training epoch of it, clips)."""
    t = time.perf_counter()
    ds = make()
    t_open = time.perf_counter() - t
    t = time.perf_counter()
    if hasattr(ds, "set_clip_epoch"):
        ds.set_clip_epoch(epoch)
        n = sum(1 for _ in ds)
    else:
        ds.set_epoch(epoch)
        n = sum(1 for i in range(len(ds)) if ds[i] is not None)
    return t_open, time.perf_counter() - t, n


def ab(name_a: str, make_a: Any, name_b: str, make_b: Any, a: argparse.Namespace) -> dict[str, Any]:
    """A/B alternating (order flipped each round): clips/s of an epoch (the dataset opened before the clock
    starts; its opening timed apart) after the warm-up rounds, and the B/A ratios of clips/s."""
    rates: dict[str, list[float]] = {name_a: [], name_b: []}
    opens: dict[str, list[float]] = {name_a: [], name_b: []}
    ratios = []
    for r in range(a.warmup + a.rounds):
        order = [(name_a, make_a), (name_b, make_b)][:: 1 if r % 2 == 0 else -1]
        got = {}
        for name, make in order:
            t_open, s, n = epoch_seconds(make, r)
            got[name] = n / s
            if r >= a.warmup:
                opens[name].append(t_open)
        if r >= a.warmup:
            for k, v in got.items():
                rates[k].append(v)
            ratios.append(got[name_b] / got[name_a])
        rows = ", ".join(f"{k} {v:.1f} clips/s" for k, v in got.items())
        print(f"  round {r}{' (warm-up)' if r < a.warmup else ''}: {rows}")
    out: dict[str, Any] = {k: statistics.median(v) for k, v in rates.items()}
    out["open_s"] = {k: statistics.median(v) for k, v in opens.items()}
    out["ratio"] = statistics.median(ratios)
    out["ratios"] = ratios
    print("  opening (median s): " + ", ".join(f"{k} {v:.2f}" for k, v in out["open_s"].items()))
    return out


def part_local(d: dict, a: argparse.Namespace) -> dict[str, Any]:
    from avion_ds.data.datasets.build import build_dataset, open_shards

    r = d["recipe"]
    return ab(
        "tree", lambda: build_dataset(r.data, "train", seed=0, sections=r.sections),
        "shards", lambda: open_shards(str(d["shards"]), r.data, "train", seed=0, sections=r.sections),
        a,
    )  # fmt: skip


def part_s3(d: dict, a: argparse.Namespace) -> dict[str, Any]:
    from avion_ds.data.datasets.build import open_shards
    from avion_ds.data.prep import shard_index
    from avion_ds.data.shard_downloads import clear_shared_clients

    r = d["recipe"]
    caches = iter(range(1 << 30))
    with moto_server() as endpoint:
        upload(endpoint, BUCKET, PREFIX, d["shards"])
        in_process = a.proxy == "thread"
        with (Proxy if in_process else proxy_process)(endpoint, delay_s=a.latency_ms / 1000) as proxy:
            os.environ.update(s3_env(proxy.url))

            def remote() -> Any:
                cache = d["work"] / f"s3cache{next(caches)}"  # empty: every round downloads
                shard_index._CHECKED.clear()  # every round runs the start-up check, as a new run does
                if a.fresh_clients:  # and builds its S3 clients (the opening's boto3, the epoch's obstore)
                    clear_shared_clients()
                return open_shards(
                    f"s3://{BUCKET}/{PREFIX}", r.data, "train", seed=0, sections=r.sections, cache_dir=str(cache)
                )

            out = ab(
                "local", lambda: open_shards(str(d["shards"]), r.data, "train", seed=0, sections=r.sections),
                "s3", remote, a,
            )  # fmt: skip
            out["requests"] = proxy.requests
    return out


def fake_tree(root: Path, mib: int) -> Path:
    """A chunk tree of ``mib`` MiB: videos of 4 chunks of 4 MiB each, hard links of 4 random blobs."""
    root.mkdir(parents=True)
    blobs = []
    for k in range(4):
        b = root / f"blob{k}"
        b.write_bytes(os.urandom(4 << 20))
        blobs.append(b)
    rows = []
    for v in range(max(1, mib // 16)):
        vid = f"V{v:05d}"
        (root / vid).mkdir()
        for c in range(4):
            os.link(blobs[c], root / vid / f"{c * 4}.mp4")
            rows.append({"video_id": vid, "path": f"{vid}/{c * 4}.mp4", "start_frame": c * 48, "frames": 48,
                         "fps": 12.0, "width": 64, "height": 48, "bytes": 4 << 20, "start": c * 4.0})  # fmt: skip
    (root / "manifest.jsonl").write_text("".join(json.dumps(x) + "\n" for x in rows))
    return root


def part_pack(d: dict, a: argparse.Namespace) -> dict[str, Any]:
    """Peak RSS (MiB) of `avion-ds pack` per shard size over a ``--pack-mib`` tree."""
    tree = fake_tree(d["work"] / "packtree", a.pack_mib)
    out: dict[str, Any] = {"tree_mib": sum(p.stat().st_size for p in tree.rglob("*.mp4")) >> 20}
    for mib in (int(x) for x in str(a.pack_shard_mib).split(",") if x):
        dest = d["work"] / f"packed{mib}"
        cmd = [sys.executable, "-m", "avion_ds.cli", "pack", str(tree), str(dest), "--shard-bytes", str(mib << 20)]
        t = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode:
            raise RuntimeError(f"pack --shard-bytes {mib} MiB failed: {proc.stderr.read().decode()[-2000:]}")
        proc.stderr.close()
        seconds = time.perf_counter() - t
        peak = usage.ru_maxrss / 1024  # KiB on Linux
        out[f"shard_{mib}_mib"] = {"peak_rss_mib": peak, "seconds": seconds}
        print(f"  pack {out['tree_mib']} MiB tree, --shard-bytes {mib} MiB: peak RSS {peak:.0f} MiB, {seconds:.1f} s")
        shutil.rmtree(dest)
    return out


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    work = Path(a.out) if a.out else Path(tempfile.mkdtemp(prefix="bench_shards_"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        results: dict[str, Any] = {}
        d = make_data(a, work) if {"local", "s3"} & set(a.parts) else {"work": work}
        if "local" in a.parts:
            print("local shards vs chunk tree (clips/s, one training epoch, 0 workers):")
            res = results["local"] = part_local(d, a)
            print(f"local shards / chunk tree: {res['ratio']:.2f}x (target >= 1.0x)")
        if "s3" in a.parts:
            print(
                f"s3 (moto + {a.latency_ms:g} ms per request, proxy in a {a.proxy}) vs local shards "
                "(clips/s of an epoch, empty cache each round):"
            )
            res = results["s3"] = part_s3(d, a)
            print(f"s3 / local shards: {res['ratio']:.2f}x (target >= 0.9x)")
        if "pack" in a.parts:
            print("pack peak RSS:")
            res = results["pack"] = part_pack(d, a)
            worst = max(v["peak_rss_mib"] for k, v in res.items() if k.startswith("shard_"))
            print(f"pack peak RSS: {worst:.0f} MiB at most (target <= 1024 MiB)")
        print(json.dumps(results, default=float))
    finally:
        if not a.out:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
