"""`avion-ds chunk SRC DST`: re-encode long videos into short, cheap-to-seek chunks + manifest.

Layout (AVION's): ``DST/<video_id>/<start_second>.mp4`` with ``video_id`` the source file's stem,
plus ``DST/manifest.jsonl`` (see :mod:`avion_ds.data.prep.manifest`). Each source is decoded once by
PyAV (its bundled FFmpeg libraries: no system ffmpeg needed) through an FFmpeg filter graph
``fps -> scale -> setsar -> format`` (constant frame rate; square pixels at the display aspect, i.e. a
source with non-square pixels (SAR != 1) is stretched to width x SAR as players show it; short side
scaled down to ``short_side``, never up), and encoded with libx264 (``crf``, keyframe every ``gop`` frames, no B-frames) into chunks
of ``chunk_seconds``. Each chunk is written under a temporary name, decoded again to COUNT its
frames, then renamed: an interrupted run never leaves a half chunk that looks complete.

Any source FFmpeg reads is re-encoded the same way, e.g. SSv2's VP8/VP9 ``.webm`` (seeking in
webm is unreliable in decord; the H.264 chunks are not).

Re-runs are incremental: a source whose size, mtime and chunking parameters match its manifest
records, and whose chunk files are all present with the recorded sizes and mtimes, is skipped.
A video to re-chunk loses its manifest rows BEFORE any of its files is replaced, so a run killed
midway never leaves rows that describe replaced files (the dataset also refuses a chunk whose
size/mtime differs from its row). A source that decodes to less than 90% of the duration its
header states (truncated download) is chunked as far as it decodes, warned about, and listed in
the summary; its rows record ``source_expected_s`` / ``source_decoded_s``. Directories named like
videos (``x.mp4/``) are listed in the summary, not silently skipped. Sources run
in parallel worker processes (``workers``); a failing source is reported with its reason in the
summary and in ``DST/chunk_failures.tsv`` while the others finish; the CLI then exits with 1.

``--index-only`` writes the manifest for an existing chunk tree instead (AVION's released layout,
no re-encoding): :mod:`avion_ds.data.prep.index_tree`.

Defaults: 15 s chunks, short side 320 px, 30 fps, GOP 16, CRF 23, x264 ``tune=fastdecode`` (AVION
used 15 s / 288-320 px / 30 fps; the short GOP makes a random 16-frame read decode at most ~16 extra
frames; fastdecode (no CABAC, no deblocking) decoded 1.5x faster with torchcodec at the same PSNR
within 0.1 dB for 15% more bytes: BENCHMARKS.md, chunk encoding table; ``--tune ""`` turns it off).
"""

from __future__ import annotations

import json
import logging
import time
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from multiprocessing import get_context
from pathlib import Path

from tqdm import tqdm

from avion_ds.data.datasets.quarantine import QUARANTINE_NAME
from avion_ds.data.prep.chunk_source import chunk_one
from avion_ds.data.prep.manifest import (
    FAILURES_NAME,
    MANIFEST_NAME,
    dedupe_records,
    find_videos,
    read_manifest_records,
    video_named_dirs,
    write_manifest,
)

log = logging.getLogger(__name__)


@dataclass
class ChunkSummary:
    """What a chunking run did: video ids chunked / already up to date, and failed sources."""

    ok: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)  # (source path, reason)
    truncated: list[tuple[str, float, float]] = field(default_factory=list)  # (source, header s, decoded s)
    not_videos: list[str] = field(default_factory=list)  # directories named like videos (x.mp4/)
    stale_quarantine: Path | None = None  # an avion-ds check result older than chunks written now
    manifest: Path | None = None
    seconds: float = 0.0

    def __str__(self) -> str:
        head = (
            f"chunked {len(self.ok)}, up to date {len(self.skipped)}, failed {len(self.failed)} "
            f"in {self.seconds:.1f}s; manifest: {self.manifest}"
        )
        lines = [head]
        lines += [f"FAILED {src}: {reason}" for src, reason in self.failed]
        lines += [
            f"TRUNCATED {src}: decodes {got:.2f}s of the {want:.2f}s its header states (chunked what "
            f"decoded; expected/decoded seconds are in the manifest)"
            for src, want, got in self.truncated
        ]
        lines += [
            f"NOT A VIDEO {d}: a directory named like a video, skipped (chunks named by start second? "
            f"index that tree with `avion-ds chunk --index-only`)"
            for d in self.not_videos
        ]
        if self.stale_quarantine:
            lines.append(f"STALE {self.stale_quarantine}: written before these chunks; re-run `avion-ds check`")
        return "\n".join(lines)


def _up_to_date(records: list[dict], src: Path, dst: Path, params: dict) -> bool:
    if not records:
        return False
    st = src.stat()
    for r in records:
        if (r.get("source_size"), r.get("source_mtime_ns"), r.get("params")) != (st.st_size, st.st_mtime_ns, params):
            return False
        p = dst / r["path"]
        if not p.is_file() or p.stat().st_size != r.get("bytes") or p.stat().st_mtime_ns != r.get("mtime_ns"):
            return False
    return True


def _run_job(src: str, dst: str, video_id: str, params: dict) -> list[dict]:
    """Worker entry point (top level so it pickles)."""
    return chunk_one(src, dst, video_id, params)


def _chunk_params(
    chunk_seconds: float, short_side: int | None, fps: float | None, gop: int, crf: int, preset: str, tune: str
) -> dict:
    """The encoding parameters a manifest record keeps (a change re-chunks the video); ValueError when invalid."""
    if chunk_seconds <= 0 or gop <= 0:
        raise ValueError(f"chunk_seconds ({chunk_seconds}) and gop ({gop}) must be positive")
    return {
        "chunk_seconds": float(chunk_seconds),
        "short_side": short_side,
        "fps": fps,
        "gop": int(gop),
        "crf": int(crf),
        "preset": preset,
        "tune": tune,
    }


def _plan_jobs(
    src: Path, dst: Path, params: dict, old_by_video: dict[str, list[dict]], summary: ChunkSummary
) -> list[tuple[Path, str]]:
    """(source, video id) of every video under ``src`` to chunk; duplicates go to ``summary.failed``,
    videos whose chunks are up to date to ``summary.skipped``."""
    jobs: list[tuple[Path, str]] = []
    seen: dict[str, Path] = {}
    for path in find_videos(src):
        vid = path.stem
        if vid in seen:
            summary.failed.append((str(path), f"duplicate video_id {vid!r} (also {seen[vid]})"))
            continue
        seen[vid] = path
        if _up_to_date(old_by_video.get(vid, []), path, dst, params):
            summary.skipped.append(vid)
        else:
            jobs.append((path, vid))
    return jobs


class _Journal:
    """Each finished video: its records appended to the manifest (an interrupted run keeps its work),
    or its failure named once; the progress bar advanced."""

    def __init__(self, journal, summary: ChunkSummary, results: dict[str, list[dict]], bar) -> None:
        self.journal, self.summary, self.results, self.bar = journal, summary, results, bar

    def done(self, vid: str, path: Path, recs: list[dict] | None, err: BaseException | None) -> None:
        """Record one finished source: its records, or ``err``."""
        summary = self.summary
        if err is not None:
            reason = f"{type(err).__name__}: {err}".replace("\n", " ").replace("\t", " ")
            summary.failed.append((str(path), reason))
            log.error("chunk %s failed: %s", path, reason)
        else:
            self.results[vid] = recs or []
            summary.ok.append(vid)
            if recs and "source_expected_s" in recs[0]:
                summary.truncated.append((str(path), recs[0]["source_expected_s"], recs[0]["source_decoded_s"]))
            for r in recs or []:
                self.journal.write(json.dumps(r, sort_keys=True) + "\n")
            self.journal.flush()
        self.bar.update(1)
        self.bar.set_postfix(failed=len(summary.failed))


def _run_jobs(jobs: list[tuple[Path, str]], dst: Path, params: dict, workers: int, journal: _Journal) -> None:
    """Chunk every job, in this process or in ``workers`` spawned ones; each result goes to ``journal``."""
    if workers <= 1 or len(jobs) <= 1:
        for path, vid in jobs:
            try:
                journal.done(vid, path, chunk_one(str(path), str(dst), vid, params), None)
            except Exception as e:  # noqa: BLE001 - reported per source, the rest go on
                journal.done(vid, path, None, e)
        return
    with ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn")) as pool:
        pending: dict[Future, tuple[Path, str]] = {
            pool.submit(_run_job, str(p), str(dst), v, params): (p, v) for p, v in jobs
        }
        while pending:
            finished, _ = wait(pending, return_when=FIRST_COMPLETED)
            for fut in finished:
                path, vid = pending.pop(fut)
                try:
                    journal.done(vid, path, fut.result(), None)
                except Exception as e:  # noqa: BLE001 - includes a crashed worker process
                    journal.done(vid, path, None, e)


def _write_outcome(dst: Path, old: list[dict], results: dict[str, list[dict]], summary: ChunkSummary) -> None:
    """The final manifest (kept rows + this run's, per video by start frame), failures.tsv, the stale
    quarantine warning."""
    failed_ids = {Path(p).stem for p, _ in summary.failed}
    keep = [r for r in old if r["video_id"] not in results and r["video_id"] not in failed_ids]
    for vid in sorted(results):
        keep.extend(sorted(results[vid], key=lambda r: r["start_frame"]))
    write_manifest(dst / MANIFEST_NAME, keep)
    fpath = dst / FAILURES_NAME
    if summary.failed:
        fpath.write_text("".join(f"{p}\t{reason}\n" for p, reason in summary.failed))
    else:
        fpath.unlink(missing_ok=True)
    if summary.ok and (dst / QUARANTINE_NAME).is_file():
        summary.stale_quarantine = dst / QUARANTINE_NAME
        log.warning("%s predates this run's chunks: re-run `avion-ds check` before training", dst / QUARANTINE_NAME)


def chunk_videos(
    src: str | Path,
    dst: str | Path,
    chunk_seconds: float = 15.0,
    short_side: int | None = 320,
    fps: float | None = 30,
    gop: int = 16,
    crf: int = 23,
    workers: int = 1,
    progress: bool = True,
    preset: str = "veryfast",
    tune: str = "fastdecode",
) -> ChunkSummary:
    """Chunk every video under ``src`` into ``dst`` (see module doc); never raises for one bad source."""
    t0 = time.perf_counter()
    src, dst = Path(src), Path(dst)
    if not src.exists():
        raise FileNotFoundError(f"source {src} does not exist")
    params = _chunk_params(chunk_seconds, short_side, fps, gop, crf, preset, tune)
    dst.mkdir(parents=True, exist_ok=True)
    mpath = dst / MANIFEST_NAME
    old = dedupe_records(read_manifest_records(mpath)) if mpath.is_file() else []
    old_by_video: dict[str, list[dict]] = {}
    for r in old:
        old_by_video.setdefault(r["video_id"], []).append(r)
    summary = ChunkSummary(manifest=mpath)
    jobs = _plan_jobs(src, dst, params, old_by_video, summary)
    results: dict[str, list[dict]] = {vid: old_by_video[vid] for vid in summary.skipped}
    summary.not_videos = [str(d) for d in video_named_dirs(src)]
    for d in summary.not_videos:
        log.warning("%s: a directory named like a video; skipped", d)
    redo = {vid for _, vid in jobs}
    if any(vid in old_by_video for vid in redo):
        # a video's old rows go BEFORE any of its files is replaced: a run killed midway leaves the
        # video absent from the manifest (re-chunked next run), never rows describing replaced files
        old = [r for r in old if r["video_id"] not in redo]
        write_manifest(mpath, old)
    bar = tqdm(total=len(jobs), desc="chunk", unit="video", disable=not progress)
    with mpath.open("a") as journal:  # appended as videos finish: an interrupted run keeps its work
        _run_jobs(jobs, dst, params, workers, _Journal(journal, summary, results, bar))
    bar.close()
    _write_outcome(dst, old, results, summary)
    summary.seconds = time.perf_counter() - t0
    return summary
