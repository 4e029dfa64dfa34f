"""Shards at Ego4D's size: packing's peak memory, and per-rank start-up and memory, per-worker memory.

Inputs (generated once, kept under ``--out``): ``bench/data_scale.py``'s Ego4D-shaped chunk manifest
(``--videos`` videos x 40-140 chunks of 450 frames) and ``--rows`` narrations in AVION's pickle layout
(:func:`tests.helpers.index_oracle.write_scale_inputs`), each chunk file a hard link of one small blob (pack
copies and hashes bytes, it never decodes), a val pickle of up to 2,000 rows over the same videos, and a contrastive
recipe (ego4d train and val, the demo's tiny model) over them. Then, each in its own subprocess:

- ``pack``: ``avion-ds pack --config`` (annotation rows of 4M narrations, windows, litdata's writer): wall
  time and, sampled every 0.2 s over the pack and its writer processes, the peak anonymous memory (all
  together, the pack process, its largest writer) and the peak RSS with mapped files (the chunk tree's
  memory-mapped index: pages the kernel can drop);
- ``open``: one rank opening the shards as the recipe's dataset (``open_shards``) and taking its first
  sample: seconds and the process's RSS growth over the imports (anonymous / file-backed);
- ``worker``: a forked DataLoader worker iterating ``--worker-samples`` samples through litdata (shard
  mapping, the row's item, its meta parsed) with the clip decode left out (the decode is the chunk tree's
  own, measured by ``bench/loader.py``): its RSS growth and the pages it copied (``Private_Dirty``).

Targets: start-up <= 1 s per rank (the chunk tree's memory-mapped index: 1.98 s), <= 0.5 GiB per rank,
<= 128 MiB per worker, pack peak <= 1 GiB.

    python bench/shards_scale.py --out /tmp/ego4d_shards                      # full size (9,600 videos, 4M rows)
    python bench/shards_scale.py --out /tmp/s --videos 96 --rows 40000        # a quick look
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.data_scale import _private_dirty, _status

MiB = 1 << 20


def make_inputs(out: Path, videos: int, rows: int) -> dict[str, Path]:
    """The chunk tree (hard links), train / val narrations and the recipe under ``out`` (kept: reused)."""
    import yaml

    from tests.helpers.index_oracle import write_scale_inputs

    done = out / "inputs.json"
    if done.is_file():
        return {k: Path(v) for k, v in json.loads(done.read_text()).items()}
    root, pkl = write_scale_inputs(out, videos, rows)
    _, val_pkl = write_scale_inputs(out / "val", videos, min(rows, 2000))  # same seed: the same videos
    for k, line in enumerate((root / "manifest.jsonl").open()):
        blob = out / "blobs" / f"{k // 60000}.bin"  # a new blob every 60,000 links (ext4 allows 65,000)
        if not blob.exists():
            blob.parent.mkdir(exist_ok=True)
            blob.write_bytes(os.urandom(1024))
        path = root / json.loads(line)["path"]
        path.parent.mkdir(exist_ok=True)
        if not path.exists():
            os.link(blob, path)
    recipe = yaml.safe_load((REPO / "launch/recipes/contrastive_demo_cpu.yaml").read_text())
    recipe["data"].update(root=str(root), train_csv=str(pkl), val_dataset="ego4d", val_csv=str(val_pkl))
    recipe["data"].update(fps=30.0, decoder="pyav", workers=0)
    recipe.pop("epic_mir", None)
    recipe["output_dir"] = str(out / "run")
    (out / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    paths = {"root": root, "pkl": pkl, "recipe": out / "recipe.yaml"}
    done.write_text(json.dumps({k: str(v) for k, v in paths.items()}))
    return paths


def run_pack(paths: dict[str, Path], shards: Path, shard_mib: int) -> dict[str, Any]:
    """``avion-ds pack --config`` in a subprocess: seconds and peak RSS (MiB)."""
    cmd = [sys.executable, "-m", "avion_ds.cli", "pack", str(paths["root"]), str(shards), "--config"]
    cmd += [str(paths["recipe"]), "--shard-bytes", str(shard_mib * MiB)]
    import psutil

    t = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    peaks = {"parent_anon_mib": 0.0, "child_anon_mib": 0.0, "total_anon_mib": 0.0, "total_rss_mib": 0.0}
    parent = psutil.Process(proc.pid)
    while proc.poll() is None:  # every 0.2 s: anonymous (private) and whole RSS of the pack and its workers
        try:
            procs = [parent, *parent.children(recursive=True)]
            anon = [_status(q.pid).get("RssAnon", 0) / MiB for q in procs]
            rss = [_status(q.pid).get("VmRSS", 0) / MiB for q in procs]
        except (psutil.Error, OSError):
            continue
        peaks["parent_anon_mib"] = max(peaks["parent_anon_mib"], anon[0])
        peaks["child_anon_mib"] = max(peaks["child_anon_mib"], max(anon[1:], default=0.0))
        peaks["total_anon_mib"] = max(peaks["total_anon_mib"], sum(anon))
        peaks["total_rss_mib"] = max(peaks["total_rss_mib"], sum(rss))
        time.sleep(0.2)
    err = proc.stderr.read()
    if proc.returncode:
        raise RuntimeError(f"pack failed: {err[-2000:]}")
    return {"seconds": time.perf_counter() - t, **peaks}


def measure_open(shards: str, recipe_path: str, samples: int) -> dict[str, Any]:
    """In this process: open the shards as one rank (module doc), then a forked worker's figures."""
    import avion_ds.data.shards  # noqa: F401 - imports (torch, litdata, decoders) before the baseline
    from avion_ds.data.datasets.build import open_shards
    from avion_ds.tasks import load_recipe

    recipe = load_recipe(recipe_path, [])
    before = _status()
    t0 = time.perf_counter()
    ds = open_shards(shards, recipe.data, "train", seed=0, sections=recipe.sections)
    type(ds.clips).__getitem__ = lambda self, i: {"index": i}  # the decode left out (module doc)
    opened = time.perf_counter() - t0
    it = iter(ds)
    next(it)
    out: dict[str, Any] = {"open_s": opened, "first_sample_s": time.perf_counter() - t0, "rows": len(ds)}
    after = _status()
    out.update({f"rank_{k}_growth_mib": (after[k] - before[k]) / MiB for k in before})
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # a DataLoader worker: iterate, report
        os.close(r)
        base, t = _status(), time.perf_counter()
        for _ in range(samples):
            next(it, None)
        end = _status()
        rep = {"worker_s": time.perf_counter() - t, "worker_private_dirty_mib": _private_dirty() / MiB}
        rep.update({f"worker_{k}_growth_mib": (end[k] - base[k]) / MiB for k in base})
        os.write(w, json.dumps(rep).encode())
        os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        out.update(json.loads(f.read()))
    os.waitpid(pid, 0)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="inputs and shards (kept: a second run reuses the inputs)")
    p.add_argument("--videos", type=int, default=9600)
    p.add_argument("--rows", type=int, default=4_000_000)
    p.add_argument("--shard-mib", type=int, default=1024, help="--shard-bytes of the pack, MiB")
    p.add_argument("--worker-samples", type=int, default=2000)
    p.add_argument("--child-open", nargs=2, metavar=("SHARDS", "RECIPE"), help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child_open:
        print(json.dumps(measure_open(*a.child_open, a.worker_samples)))
        return 0
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    t = time.perf_counter()
    paths = make_inputs(out, a.videos, a.rows)
    print(f"inputs: {a.videos} videos, {a.rows} narrations under {out} ({time.perf_counter() - t:.0f} s)", flush=True)
    shards = out / f"shards_{a.shard_mib}"
    packed = run_pack(paths, shards, a.shard_mib)
    print(
        f"pack: {packed['seconds']:.0f} s; peak anonymous memory {packed['total_anon_mib']:.0f} MiB (pack process "
        f"{packed['parent_anon_mib']:.0f}, its largest writer {packed['child_anon_mib']:.0f}), RSS with mapped files "
        f"{packed['total_rss_mib']:.0f} MiB (target <= 1024)"
    )
    cmd = [sys.executable, __file__, "--out", str(out), "--worker-samples", str(a.worker_samples)]
    res = subprocess.run(
        [*cmd, "--child-open", str(shards), str(paths["recipe"])], capture_output=True, text=True, check=False
    )
    if res.returncode:
        raise RuntimeError(f"open failed: {res.stderr[-2000:]}")
    opened = json.loads(res.stdout.strip().splitlines()[-1])
    print(
        f"rank: open {opened['open_s']:.2f} s, first sample {opened['first_sample_s']:.2f} s (target <= 1 s), "
        f"RSS +{opened['rank_VmRSS_growth_mib']:.0f} MiB (anon +{opened['rank_RssAnon_growth_mib']:.0f}, file "
        f"+{opened['rank_RssFile_growth_mib']:.0f}; target <= 512)"
    )
    print(
        f"worker: {a.worker_samples} samples in {opened['worker_s']:.1f} s, RSS +{opened['worker_VmRSS_growth_mib']:.0f} "
        f"MiB, private dirty {opened['worker_private_dirty_mib']:.0f} MiB (target <= 128)"
    )
    print(json.dumps({"pack": packed, "open": opened}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
