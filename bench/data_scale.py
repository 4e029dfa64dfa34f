"""Ego4D at its real size: the annotation index's start time, memory per rank and per worker, and rates.

Generates (once, kept under ``--out``) AVION-scale inputs without videos: ``--rows`` narrations
``(video_uid, start, end, narration)`` in AVION's pickle layout and a chunk manifest of ``--videos``
videos x 40-140 chunks of 450 frames (:func:`tests.helpers.index_oracle.write_scale_inputs`). Then,
each in its own subprocess (the object index alone takes ~3 GiB at full size: never two in one
process):

- ``old``: the Python-object index (one ``Chunk`` / tuple / string per row: the oracle of the tests);
- ``new cold``: the flat index with its cache files deleted first (parse + build + write);
- ``new cached``: the flat index mapped from the cache written by the cold run.

Each prints: build time; the process's peak RSS (``ru_maxrss``: imports + build; for ``new cold`` the cold
build's peak) and that peak over the RSS before the build; RSS growth of the process over the dataset
(VmRSS, anonymous / file-backed); ``sample_span`` rate on random rows (rows per CPU second of the process,
after 2 warm-up passes); and, for ``old`` and ``new cached``, a forked child (a DataLoader worker) that
runs ``check_row`` (``sample_span`` + the span check: ``avion-ds check``'s index part) over EVERY row
once and reports its ``Private_Dirty`` (/proc/self/smaps_rollup: pages copied on write) and the time of
that pass. Last, ``--ab-rows`` rows (default 1/10 size) in one process: old and new ``sample_span`` and
``check_row`` (``avion-ds check``'s per-row index work) timed A/B alternating (8 passes each, who goes
first alternating too) after 2 warm-ups, in CPU seconds, the ratios.

    python bench/data_scale.py --out /tmp/ego4d_scale            # full size (9,600 videos, 4M rows)
    python bench/data_scale.py --out /tmp/s --videos 96 --rows 40000 --ab-rows 40000   # a quick look
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

GiB, MiB = 1 << 30, 1 << 20
AB_ROWS = 10_000  # random rows timed per A/B pass


def _status(pid: int | str = "self") -> dict[str, int]:
    """VmRSS / RssAnon / RssFile of process ``pid`` (this one by default), bytes."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "RssAnon", "RssFile"):
                out[key] = int(rest.split()[0]) * 1024
    return out


def _private_dirty() -> int:
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            if line.startswith("Private_Dirty:"):
                return int(line.split()[1]) * 1024
    return -1


from avion_ds.data.errors import DataError
from avion_ds.data.sampling import segment_span


def _config(root: Path, pkl: Path):
    from avion_ds.config import DataConfig
    from avion_ds.data.datasets.registry import lookup, view_config

    cfg = DataConfig(dataset="ego4d", root=str(root), train_csv=str(pkl), num_frames=4, decoder="pyav")
    return view_config(cfg, lookup("ego4d"))  # with Ego4D's own keys (ego4d.aux_train)


def _dataset(path: str, root: Path, pkl: Path):
    """The training dataset over the new (flat) or old (object) index."""
    from avion_ds.data.datasets import ego4d, video_index

    cfg = _config(root, pkl)
    if path == "new":
        return ego4d.Ego4dDataset(cfg, "train")
    from tests.helpers.index_oracle import object_manifest, object_narrations

    saved = video_index.load_manifest, ego4d.read_narrations
    video_index.load_manifest = object_manifest
    ego4d.read_narrations = lambda c, split: object_narrations([c.train_csv, *c.aux_train])
    try:
        return ego4d.Ego4dDataset(cfg, "train")
    finally:
        video_index.load_manifest, ego4d.read_narrations = saved


def _span_pass(ds, rows) -> float:
    """CPU seconds of ``sample_span`` over ``rows`` (bad rows raise DataError, counted as done). CPU time,
    not wall: on a shared, oversubscribed machine the wall time of a pass is mostly other processes'."""
    t0 = time.process_time()
    for i in rows:
        try:
            ds.sample_span(i)
        except DataError:
            pass
    return time.process_time() - t0


def _touch(ds, k: int) -> None:
    """Read everything ``sample_span`` reads of row ``k`` (the clip draw aside): one worker epoch's index use."""
    t = ds.table
    t.where(k)
    if k in t.bad_times:
        return
    t.text[k]
    try:
        segment_span(float(t.start[k]), float(t.end[k]), ds.index.by_id(t.uids[int(t.vid[k])]), ds.cfg.fps)
    except DataError:
        pass


def _epoch_child(ds, write_fd: int) -> None:
    """In a forked child (a DataLoader worker): touch every row once, report Private_Dirty and the time."""
    t0 = time.perf_counter()
    for k in ds.rows.tolist():
        _touch(ds, k)
    out = {"epoch_s": time.perf_counter() - t0, "private_dirty": _private_dirty()}
    os.write(write_fd, json.dumps(out).encode())
    os._exit(0)


def measure(path: str, root: Path, pkl: Path, epoch: bool, span_rows: int) -> dict:
    """One path's figures (module doc), in this process."""
    import numpy as np

    import avion_ds.data.datasets.ego4d  # noqa: F401 - imports (torch, numpy, tokenizer) before the baseline
    from avion_ds.data.datasets.narration_tokens import check_tokenizer

    check_tokenizer()
    before = _status()
    t0 = time.perf_counter()
    ds = _dataset(path, root, pkl)
    out: dict = {"path": path, "build_s": time.perf_counter() - t0, "rows": len(ds)}
    after = _status()
    out["peak_rss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    out["peak_over_start"] = out["peak_rss"] - before["VmRSS"]
    out.update({f"{k}_growth": after[k] - before[k] for k in before})
    rows = np.random.default_rng(0).integers(0, len(ds), span_rows).tolist()
    for _ in range(2):
        _span_pass(ds, rows[:20_000])
    out["span_rows_per_s"] = len(rows) / _span_pass(ds, rows)
    if epoch:
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            _epoch_child(ds, w)
        os.close(w)
        with os.fdopen(r) as f:
            out.update(json.loads(f.read()))
        os.waitpid(pid, 0)
    return out


def _check_pass(ds, rows) -> float:
    """CPU seconds of ``check_row`` (``avion-ds check``'s per-row index work) over ``rows``."""
    t0 = time.process_time()
    for i in rows:
        ds.check_row(i)
    return time.process_time() - t0


def ab_rates(root: Path, pkl: Path, reps: int = 8) -> dict:
    """old / new ``sample_span`` and ``check_row`` rates on the same random rows in one process, A/B alternating."""
    import numpy as np

    new, old = _dataset("new", root, pkl), _dataset("old", root, pkl)
    rows = np.random.default_rng(1).integers(0, len(new), min(len(new), AB_ROWS)).tolist()
    out = {}
    for name, run in (("span", _span_pass), ("check", _check_pass)):
        for _ in range(2):  # warm-up
            run(old, rows[:5_000])
            run(new, rows[:5_000])
        t_old = t_new = 0.0
        for rep in range(reps):  # alternating, and which goes first alternates too
            first, second = (old, new) if rep % 2 == 0 else (new, old)
            a, b = run(first, rows), run(second, rows)
            t_old, t_new = (t_old + a, t_new + b) if first is old else (t_old + b, t_new + a)
        n = reps * len(rows)
        out.update({f"{name}_old_rows_per_s": n / t_old, f"{name}_new_rows_per_s": n / t_new})
        out[f"{name}_new_over_old"] = t_old / t_new
    return out


def _run(args: list[str]) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    res = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True, env=env, check=False)
    if res.returncode:
        raise SystemExit(f"{args}: exit {res.returncode}\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def _row(name: str, values: list, fmt: str) -> str:
    return f"{name:<34}" + "".join(f"{fmt.format(v) if v is not None else '-':>14}" for v in values)


def report(figures: dict, ab: dict) -> str:
    """A table: old | new cold | new cached."""
    cols = [figures["old"], figures["new_cold"], figures["new_cached"]]
    get = lambda k, scale=1.0: [c[k] / scale if k in c else None for c in cols]
    lines = [
        f"{'':<34}{'old':>14}{'new cold':>14}{'new cached':>14}",
        _row("build (s)", get("build_s"), "{:.2f}"),
        _row("peak RSS, build (GiB)", get("peak_rss", GiB), "{:.3f}"),
        _row("  over the RSS before it (GiB)", get("peak_over_start", GiB), "{:.3f}"),
        _row("RSS growth (GiB)", get("VmRSS_growth", GiB), "{:.3f}"),
        _row("  anonymous (GiB)", get("RssAnon_growth", GiB), "{:.3f}"),
        _row("  file-backed, shared (GiB)", get("RssFile_growth", GiB), "{:.3f}"),
        _row("sample_span (rows/CPU s)", get("span_rows_per_s"), "{:,.0f}"),
        _row("worker Private_Dirty, 1 epoch (MiB)", get("private_dirty", MiB), "{:.1f}"),
        _row("worker pass over every row (s)", get("epoch_s"), "{:.1f}"),
    ]
    for name, what in (("span", "sample_span"), ("check", "check_row")):
        lines.append(
            f"A/B in one process ({ab['rows']:,} rows): {what} old {ab[name + '_old_rows_per_s']:,.0f} rows/CPU s, "
            f"new {ab[name + '_new_rows_per_s']:,.0f}, new/old {ab[name + '_new_over_old']:.2f}x"
        )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="/tmp/ego4d_scale", help="where the generated inputs live (kept)")
    p.add_argument("--videos", type=int, default=9600)
    p.add_argument("--rows", type=int, default=4_000_000)
    p.add_argument("--ab-rows", type=int, default=0, help="rows of the A/B set (default: rows / 10)")
    p.add_argument("--span-rows", type=int, default=200_000, help="random rows of the sample_span rate")
    p.add_argument("--json", default="", help="also write the figures here")
    p.add_argument("--stage", choices=("generate", "measure", "ab"), default=None, help=argparse.SUPPRESS)
    p.add_argument("--path", default="new", help=argparse.SUPPRESS)
    p.add_argument("--epoch", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args()
    out = Path(a.out) / f"{a.videos}v_{a.rows}r"
    root, pkl = out / "chunks", out / "ego4d_train.pkl"
    if a.stage == "generate":
        from tests.helpers.index_oracle import write_scale_inputs

        t0 = time.perf_counter()
        write_scale_inputs(out, a.videos, a.rows)
        print(json.dumps({"generate_s": time.perf_counter() - t0}))
        return
    if a.stage == "measure":
        print(json.dumps(measure(a.path, root, pkl, a.epoch, a.span_rows)))
        return
    if a.stage == "ab":
        print(json.dumps({**ab_rates(root, pkl), "rows": a.rows}))
        return
    base = ["--out", a.out, "--videos", str(a.videos), "--rows", str(a.rows), "--span-rows", str(a.span_rows)]
    if not pkl.is_file():
        print(f"generating {a.videos} videos, {a.rows:,} rows under {out} ...", flush=True)
        print(_run([*base, "--stage", "generate"]), flush=True)
    figures = {"old": _run([*base, "--stage", "measure", "--path", "old", "--epoch"])}
    print("old", figures["old"], flush=True)
    for f in [*root.glob("manifest.jsonl.chunks-*.index"), *out.glob("ego4d_train.pkl.narrations-*.index")]:
        f.unlink()
    figures["new_cold"] = _run([*base, "--stage", "measure", "--path", "new"])
    print("new cold", figures["new_cold"], flush=True)
    figures["new_cached"] = _run([*base, "--stage", "measure", "--path", "new", "--epoch"])
    print("new cached", figures["new_cached"], flush=True)
    ab_rows = a.ab_rows or a.rows // 10
    ab_base = ["--out", a.out, "--videos", str(max(1, a.videos * ab_rows // a.rows)), "--rows", str(ab_rows)]
    ab_out = Path(a.out) / f"{ab_base[3]}v_{ab_rows}r"
    if not (ab_out / "ego4d_train.pkl").is_file():
        _run([*ab_base, "--stage", "generate"])
    ab = _run([*ab_base, "--stage", "ab"])
    print(report(figures, ab))
    if a.json:
        Path(a.json).write_text(json.dumps({"figures": figures, "ab": ab}, indent=2) + "\n")


if __name__ == "__main__":
    main()
