"""`avion-ds check RECIPE_OR_DATA`: integrity pass over a prepared dataset; writes ``quarantine.tsv``.

Checks, each failure one ``file<TAB>reason`` line in ``quarantine.tsv`` (see
:mod:`avion_ds.data.datasets.quarantine`):

- every chunk in the manifest (or, for whole videos, every video the annotations name): the file
  exists, still has the size/mtime its manifest row recorded, and decodes the frame count the
  row says: sampled (default: first, middle and last frame through the recipe's decoder) or
  ``--full`` (every frame decoded and counted with PyAV);
- with a recipe: every annotation row of the train and val files resolves to a video, its fields
  parse, and its time span lies inside the video.

A summary is printed and written to ``check_summary.json`` next to the quarantine file (default:
the data root, where training finds it: ``data.quarantine: auto``). Exit 0 when nothing was
quarantined, 1 when something was, 2 on bad input (one line).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from multiprocessing import get_context
from pathlib import Path

from avion_ds.cli.args import Parser, add_positional_alias, alias_positional
from avion_ds.config import ConfigError, DataConfig, add_override_option
from avion_ds.data.datasets.quarantine import QUARANTINE_NAME, row_key, write_quarantine
from avion_ds.tasks import load_recipe

log = logging.getLogger(__name__)
SUMMARY_NAME = "check_summary.json"
_DECODER = None


@dataclass
class CheckReport:
    """What a check found: counts and the quarantined files/rows with their reasons."""

    root: str
    mode: str
    chunks: int = 0
    rows: dict[str, int] = field(default_factory=dict)
    quarantine: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0
    training_reads: Path | None = None  # the quarantine file training reads (data.quarantine), None: none
    quarantine_setting: str = "auto"

    def summary(self) -> dict:
        kinds = Counter(_kind(r) for r in self.quarantine.values())
        return {
            "root": self.root,
            "mode": self.mode,
            "chunks_checked": self.chunks,
            "annotation_rows": self.rows,
            "quarantined": len(self.quarantine),
            "by_reason": dict(kinds),
            "seconds": round(self.seconds, 2),
        }

    def __str__(self) -> str:
        rows = ", ".join(f"{k} {v}" for k, v in self.rows.items()) or "none"
        lines = [
            (
                f"checked {self.chunks} video files ({self.mode}) and annotation rows ({rows}) under {self.root} "
                f"in {self.seconds:.1f}s: {len(self.quarantine)} quarantined"
            )
        ]
        lines += [f"QUARANTINED {k}: {v}" for k, v in sorted(self.quarantine.items())[:20]]
        if len(self.quarantine) > 20:
            lines.append(f"... and {len(self.quarantine) - 20} more")
        return "\n".join(lines)


def _kind(reason: str) -> str:
    for key in (
        "not found",
        "does not match",
        "zero-byte",
        "decodable frames",
        "decoded",
        "could not decode",
        "outside the video",
        "timestamp",
        "label",
        "class",
    ):
        if key in reason:
            return key
    return "other"


def _check_file(job: tuple[str, int, int, int, bool, str, float]) -> str | None:
    """Why one chunk/video file is bad, or None. ``job`` = (path, frames, bytes, mtime_ns, full, decoder, timeout)."""
    global _DECODER
    path, frames, size, mtime_ns, full, decoder, timeout = job
    from avion_ds.data.errors import DataError
    from avion_ds.data.prep.manifest import Chunk, check_chunk_file

    if not os.path.isfile(path):
        return "file not found"
    problem = check_chunk_file(Chunk(path, 0, frames, 0.0, 0, 0, size, mtime_ns))
    if problem:
        return problem.split(": ", 1)[1]
    if os.path.getsize(path) == 0:
        return "zero-byte file"
    if full:
        from avion_ds.data.prep.chunking import count_frames

        try:
            n = count_frames(path)
        except Exception as e:  # noqa: BLE001 - any library error is the file's problem
            return f"does not decode ({type(e).__name__}: {e})"
        return None if n >= frames else f"decoded {n} frames, manifest says {frames}"
    if _DECODER is None:
        from avion_ds.data.decode.select import get_decoder

        _DECODER = get_decoder(decoder, 1, timeout)
    try:
        _DECODER.decode(path, sorted({0, frames // 2, frames - 1}))
    except DataError as e:
        return str(e).replace(f"{path}: ", "", 1)
    return None


def _file_jobs(cfg: DataConfig, full: bool, entries) -> list[tuple]:
    # data.decoder=auto: get_decoder takes the first backend that imports (no probe on the data being checked)
    return [
        (c.path, c.frames, c.bytes, c.mtime_ns, full, cfg.decoder, cfg.decode_timeout_s)
        for e in entries
        for c in e.chunks
    ]


def check_files(cfg: DataConfig, entries, full: bool, workers: int, report: CheckReport) -> None:
    """Decode-check every file of ``entries`` (VideoEntry); bad ones go into the report's quarantine."""
    jobs = _file_jobs(cfg, full, entries)
    report.chunks += len(jobs)
    if workers > 1 and len(jobs) > 1:
        with ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn")) as pool:
            results = list(pool.map(_check_file, jobs, chunksize=max(1, len(jobs) // (workers * 8))))
    else:
        results = [_check_file(j) for j in jobs]
    for job, reason in zip(jobs, results, strict=True):
        if reason:
            report.quarantine[os.path.relpath(job[0], cfg.root)] = reason


def check_rows(cfg: DataConfig, report: CheckReport) -> list:
    """Every annotation row of train/val: resolves, parses, span inside the video. Returns the videos used."""
    from avion_ds.data.datasets.build import build_dataset

    used = {}
    plain = replace(cfg, quarantine="none", on_error="raise", rand_aug="", num_sample=1)
    for split, key in (("train", "train_csv"), ("val", "val_csv")):
        if not getattr(cfg, key):
            continue
        ds = build_dataset(plain, split)  # a file with no usable row at all is bad input (exit 2)
        report.rows[split] = len(ds) + len(ds.missing)
        for (path, line), text in zip(ds.missing_where, ds.missing, strict=True):
            report.quarantine[row_key(path, line)] = text.split("): ", 1)[-1]
        for i in range(len(ds)):
            problem, entry = ds.check_row(i)
            if problem:
                path, line = ds.row_where(i)
                report.quarantine[row_key(path, line)] = problem
            elif entry is not None:
                used[entry.video_id] = entry
    return list(used.values())


def run_check(target: str, overrides: list[str], full: bool, workers: int, out: str | None) -> CheckReport:
    """Check a recipe's dataset (annotations + files) or a chunk directory (files); write the outputs."""
    from avion_ds.data.prep.manifest import MANIFEST_NAME
    from avion_ds.data.prep.manifest_index import load_manifest

    t0 = time.perf_counter()
    path = Path(target)
    if path.is_dir():
        if not (path / MANIFEST_NAME).is_file():
            raise ConfigError(f"{path}: no {MANIFEST_NAME} (pass a recipe YAML, or a directory made by avion-ds chunk)")
        cfg = load_recipe(None, ["data.dataset=kinetics", f"data.root={path}", *overrides]).data
        report = CheckReport(str(path), "full" if full else "sampled")
        check_files(cfg, load_manifest(path).values(), full, workers, report)
    elif path.is_file():
        cfg = load_recipe(path, overrides).data
        if not cfg.root or not Path(cfg.root).is_dir():
            raise ConfigError(f"data.root: directory not found: {cfg.root!r}")
        report = CheckReport(cfg.root, "full" if full else "sampled")
        used = check_rows(cfg, report)
        if cfg.chunked:
            check_files(cfg, load_manifest(cfg.root).values(), full, workers, report)
        else:
            check_files(cfg, used, full, workers, report)
    else:
        raise ConfigError(f"{path}: neither a recipe file nor a chunk directory")
    report.seconds = time.perf_counter() - t0
    report.quarantine_setting = cfg.quarantine
    if cfg.quarantine not in ("", "none"):
        report.training_reads = Path(cfg.root) / QUARANTINE_NAME if cfg.quarantine == "auto" else Path(cfg.quarantine)
    out_dir = Path(out) if out else Path(report.root)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_quarantine(out_dir / QUARANTINE_NAME, report.quarantine)
    (out_dir / SUMMARY_NAME).write_text(json.dumps(report.summary(), indent=2) + "\n")
    return report


def main(argv: list[str] | None = None) -> int:
    """``avion-ds check --config RECIPE_OR_DATA``: exit 0 clean, 1 something quarantined, 2 bad input."""
    p = Parser(prog="avion-ds check", description=__doc__.splitlines()[0])
    p.add_argument(
        "--config", dest="target", default=None, help="a recipe YAML (annotations + videos) or a chunk directory"
    )
    add_positional_alias(p, "--config", "target")
    add_override_option(p, "data.root=/data/k400/chunks")
    p.add_argument("--full", action="store_true", help="decode and count every frame (default: first/middle/last)")
    p.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) // 2), help="parallel processes")
    p.add_argument("--out", default=None, help="where quarantine.tsv and check_summary.json go (default: data root)")
    a = p.parse_args(argv)
    alias_positional(a, "--config", "target", "avion-ds check", note=Path(a.target_positional or "").is_file())
    logging.basicConfig(level=logging.ERROR, format="%(levelname)s %(name)s: %(message)s")
    try:
        report = run_check(a.target, a.overrides, a.full, a.workers, a.out)
    except (ConfigError, OSError, ValueError) as e:
        print(f"avion-ds check: error: {e}", file=sys.stderr)
        return 2
    print(report)
    where = Path(a.out) if a.out else Path(report.root)
    if report.quarantine:
        print(
            f"quarantine list: {where / QUARANTINE_NAME} ({_training_note(report, where / QUARANTINE_NAME)}; "
            f"summary {where / SUMMARY_NAME})"
        )
        return 1
    return 0


def _training_note(report: CheckReport, written: Path) -> str:
    """Whether training reads the list just written (``data.quarantine`` decides which file it reads)."""
    reads = report.training_reads
    if reads is not None and reads.resolve() == written.resolve():
        return "training skips these rows"
    now = (
        f"training reads {reads} (data.quarantine: {report.quarantine_setting})"
        if reads is not None
        else "training reads no quarantine list (data.quarantine: none)"
    )
    return f"{now}, not this file: to skip these rows, train with --set data.quarantine={written}"


if __name__ == "__main__":
    sys.exit(main())
