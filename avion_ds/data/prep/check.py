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

import logging
import os
from collections import Counter
from collections.abc import Mapping
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from multiprocessing import get_context
from pathlib import Path
from typing import Any

from avion_ds.config import DataConfig
from avion_ds.data.datasets.quarantine import row_key
from avion_ds.data.decode.select import get_decoder
from avion_ds.data.errors import DataError
from avion_ds.data.prep.chunk_source import count_frames
from avion_ds.data.prep.manifest import Chunk, check_chunk_file

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
    if not os.path.isfile(path):
        return "file not found"
    problem = check_chunk_file(Chunk(path, 0, frames, 0.0, 0, 0, size, mtime_ns))
    if problem:
        return problem.split(": ", 1)[1]
    if os.path.getsize(path) == 0:
        return "zero-byte file"
    if full:
        try:
            n = count_frames(path)
        except Exception as e:  # noqa: BLE001 - any library error is the file's problem
            return f"does not decode ({type(e).__name__}: {e})"
        return None if n >= frames else f"decoded {n} frames, manifest says {frames}"
    if _DECODER is None:
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


def check_rows(cfg: DataConfig, report: CheckReport, sections: Mapping[str, Any] | None = None) -> list:
    """Every annotation row of train/val: resolves, parses, span inside the video. Returns the videos used.
    ``sections``: the recipe's, holding the dataset's own keys."""
    from avion_ds.data.datasets.build import build_dataset  # lazy: loads torch; file-check workers import check

    used = {}
    plain = replace(cfg, quarantine="none", on_error="raise", rand_aug="", num_sample=1)
    for split, key in (("train", "train_csv"), ("val", "val_csv")):
        if not getattr(cfg, key):
            continue
        ds = build_dataset(plain, split, sections=sections)  # a file with no usable row at all is bad input (exit 2)
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
