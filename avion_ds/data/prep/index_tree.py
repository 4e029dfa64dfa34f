"""`avion-ds chunk --index-only SRC [DST]`: a manifest for an existing chunk tree, without re-encoding.

AVION's released chunk trees hold one directory per video, named like the video file, with chunks
named by their start second (what its ``video_loader`` opens)::

    Ego4D  video_320px_15sec/<video_uid>.mp4/0.mp4, 15.mp4, 30.mp4, ...
    EPIC   EK100_320p_15sec_30fps_libx264/P01/P01_01.MP4/0.MP4, 15.MP4, ...

Indexing writes ``DST/manifest.jsonl`` (default DST = SRC) with the same rows the chunker writes
(:mod:`avion_ds.data.prep.manifest`), so the datasets read the tree unchanged: ``video_id`` is the
directory's stem (``P01_01``, the Ego4D ``video_uid``), ``path`` the chunk relative to DST.

Per chunk: fps (the container's average rate, as AVION's decord ``get_avg_fps``), size, and the frame
count. MP4/MOV chunks take the count from the sample table in the header, verified against the
timestamp of the last packets (a seek + demux of a few packets, no decoding); any other container
(MKV, WebM, AVI, MPEG-TS: no reliable count in the header) and any MP4 whose last packet disagrees
with its header (edit lists, truncated data) is decoded and counted, as ``--decode-count`` does for
every chunk. Each row says which (``counted``: ``header`` / ``decoded``).

A chunk starting at second ``s`` starts at frame ``ceil(s * fps)`` (the first frame at or after
``s``; ``s * fps`` for AVION's 30 fps trees). The chunk length is read from the names: starts
``0, L, 2L, ...``; a gap or uneven starts names the directory in one line and leaves the video out.
An unreadable chunk is named once, counted, and left out of the manifest (clips that need it become
bad samples, named at load time); failures go to ``DST/chunk_failures.tsv`` and the exit code is 1.
Re-runs reuse the frame counts of chunks whose size and mtime are unchanged; rows are appended as
videos finish, so an interrupted run keeps its work.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import sys
import time
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from multiprocessing import get_context
from pathlib import Path

from tqdm import tqdm

from avion_ds.data.datasets.quarantine import QUARANTINE_NAME
from avion_ds.data.prep.manifest import (
    FAILURES_NAME,
    MANIFEST_NAME,
    VIDEO_EXTENSIONS,
    dedupe_records,
    read_manifest_records,
    write_manifest,
)
from avion_ds.data.sampling import MAX_CLAMP_FRAMES

log = logging.getLogger(__name__)
_START = re.compile(r"^\d+(\.\d+)?$")  # a chunk's file stem: its start second
_TAIL_PACKETS = 8  # packets demuxed at the end of an MP4 to verify its header's frame count
_FPS_TOLERANCE = 0.01  # chunks of one video whose rates differ by more are refused


@dataclass
class ChunkProbe:
    """What one chunk file holds: decodable frames (how counted), rate and size."""

    frames: int
    fps: float
    width: int
    height: int
    counted: str  # "header" (MP4 sample table, verified) or "decoded"


@dataclass
class VideoResult:
    """One chunk directory's outcome: manifest rows, unreadable chunks, short chunks, or a problem."""

    video_id: str
    directory: str
    records: list[dict] = field(default_factory=list)
    bad: list[tuple[str, str]] = field(default_factory=list)  # (chunk path, reason)
    short: list[tuple[str, int, int]] = field(default_factory=list)  # (chunk path, frames, slot frames)
    problem: str = ""  # the directory cannot be indexed (gap, uneven starts, mixed rates, no chunk files)
    reused: int = 0


@dataclass
class IndexSummary:
    """What an index run found: videos and chunks indexed, how frames were counted, and the culprits."""

    videos: list[str] = field(default_factory=list)
    chunks: int = 0
    reused: int = 0
    counted: dict[str, int] = field(default_factory=dict)
    bad_chunks: list[tuple[str, str]] = field(default_factory=list)
    bad_dirs: list[tuple[str, str]] = field(default_factory=list)
    short: list[tuple[str, int, int]] = field(default_factory=list)
    chunk_seconds: float | None = None
    whole_videos: int = 0
    stale_quarantine: Path | None = None
    manifest: Path | None = None
    seconds: float = 0.0

    @property
    def failed(self) -> bool:
        return bool(self.bad_chunks or self.bad_dirs)

    def __str__(self) -> str:
        counted = ", ".join(f"{n} {how}" for how, n in sorted(self.counted.items())) or "none"
        lengths = "?" if self.chunk_seconds is None else f"{self.chunk_seconds:g}"
        head = (
            f"indexed {len(self.videos)} videos, {self.chunks} chunks ({self.reused} unchanged since the last run; "
            f"frames counted: {counted}; chunks every {lengths} s), unreadable chunks {len(self.bad_chunks)}, "
            f"directories left out {len(self.bad_dirs)} in {self.seconds:.1f}s; manifest: {self.manifest}"
        )
        lines = [head]
        lines += [f"UNREADABLE {p}: {reason}" for p, reason in self.bad_chunks]
        lines += [f"LEFT OUT {d}: {reason}" for d, reason in self.bad_dirs]
        lines += [
            f"SHORT {p}: {got} frames where its slot holds {want} (clips in the missing frames will be skipped)"
            for p, got, want in self.short
        ]
        if self.whole_videos:
            lines.append(f"NOTE {self.whole_videos} whole video files under the tree were not indexed")
        if self.stale_quarantine:
            lines.append(f"STALE {self.stale_quarantine}: written before this index; re-run `avion-ds check`")
        return "\n".join(lines)


def _why(e: Exception) -> str:
    """An FFmpeg error's reason without the file name it repeats (the summary names the file)."""
    return str(getattr(e, "strerror", None) or e)


def count_decoded(path: str | Path) -> int:
    """Frames that decode, counted; ValueError naming the frame where decoding failed."""
    import av  # lazy: PyAV is heavy to import, loaded when a video is decoded or written

    n = 0
    try:
        with av.open(str(path)) as c:
            s = c.streams.video[0]
            s.thread_type = "AUTO"
            for _ in c.decode(s):
                n += 1
    except av.FFmpegError as e:
        raise ValueError(f"decode error after {n} frames ({_why(e)})") from None
    return n


def _header_frames(container, stream, fps) -> int | None:
    """The MP4/MOV sample table's frame count when the last packets' timestamps agree with it, else None."""
    import av  # lazy: PyAV is heavy to import, loaded when a video is decoded or written

    n = int(stream.frames or 0)
    if n <= 0 or "mp4" not in container.format.name.split(",") or not stream.time_base:
        return None
    first = stream.start_time or 0
    target = first + int(max(0, n - _TAIL_PACKETS) / fps / stream.time_base)
    try:
        container.seek(target, stream=stream, backward=True, any_frame=True)
        pts = [p.pts for p in container.demux(stream) if p.size and p.pts is not None]
    except av.FFmpegError:
        return None
    if not pts:
        return None
    last = int(round(float((max(pts) - first) * stream.time_base * fps)))
    return n if last + 1 == n else None


def probe_chunk(path: str | Path, decode: bool = False) -> ChunkProbe:
    """Frame count, rate and size of one chunk file (see the module doc); ValueError with the reason."""
    import av  # lazy: PyAV is heavy to import, loaded when a video is decoded or written

    path = Path(path)
    if path.stat().st_size == 0:
        raise ValueError("zero-byte file")
    try:
        container = av.open(str(path))
    except av.FFmpegError as e:
        raise ValueError(f"cannot open as video ({_why(e)})") from None
    with container:
        if not container.streams.video:
            raise ValueError("no video stream")
        s = container.streams.video[0]
        fps = s.average_rate or s.guessed_rate
        if not fps or fps <= 0:
            raise ValueError("no frame rate in the header")
        width, height = s.codec_context.width, s.codec_context.height
        frames = None if decode else _header_frames(container, s, fps)
    counted = "header"
    if frames is None:
        frames, counted = count_decoded(path), "decoded"
    if frames <= 0 or width <= 0:
        raise ValueError("no decodable frames")
    return ChunkProbe(frames, float(fps), width, height, counted)


def chunk_files(directory: Path) -> list[tuple[float, Path]]:
    """(start second, file) of the chunks in ``directory``: video files named ``<number>.<ext>``, sorted."""
    found = []
    for entry in os.scandir(directory):
        stem, ext = os.path.splitext(entry.name)
        if ext.lower() in VIDEO_EXTENSIONS and _START.match(stem) and entry.is_file():
            found.append((float(stem), Path(entry.path)))
    return sorted(found)


def tree_chunk_length(starts_by_dir: list[list[float]]) -> float | None:
    """The tree's chunk length: the most common spacing of the first two starts (None: single chunks only)."""
    spacings = [round(st[1] - st[0], 6) for st in starts_by_dir if len(st) > 1]
    if not spacings:
        return None
    return max(sorted(set(spacings)), key=spacings.count)


def check_starts(starts: list[float], length: float | None) -> None:
    """ValueError saying what is wrong unless the sorted ``starts`` are ``0, L, 2L, ...`` (L = ``length``)."""
    if starts[0] != 0:
        raise ValueError(f"the first chunk starts at {starts[0]:g} s, not 0 (missing chunks before it?)")
    if len(starts) > 1 and length is None:
        raise ValueError("several chunks but no chunk length")
    for k, s in enumerate(starts[1:], 1):
        if abs(s - k * length) > 1e-6:
            raise ValueError(
                f"chunk starts are not every {length:g} s from 0: {starts[k - 1]:g} is followed by {s:g} "
                f"(a gap, a missing chunk, or another chunk length)"
            )


def _rel(path: Path, out: Path) -> str:
    """A chunk's manifest path: relative to DST when under it, else absolute (symlinks kept as named)."""
    p, o = os.path.abspath(path), os.path.abspath(out)
    return os.path.relpath(p, o) if os.path.commonpath([p, o]) == o else p


def _probe_files(
    files: list[tuple[float, Path]], out: Path, decode: bool, reuse: dict[str, dict], res: VideoResult
) -> list[tuple[float, str, ChunkProbe, os.stat_result]]:
    """(start, manifest path, probe, stat) per readable chunk; unreadable ones go to ``res.bad``."""
    probes = []
    for start, path in files:
        rel, st = _rel(path, out), path.stat()
        old = reuse.get(rel)
        if (
            old
            and (old.get("bytes"), old.get("mtime_ns")) == (st.st_size, st.st_mtime_ns)
            and (not decode or old.get("counted") == "decoded")
        ):
            fields = (int(old["frames"]), float(old["fps"]), int(old["width"]), int(old["height"]))
            probe = ChunkProbe(*fields, old.get("counted", "header"))
            res.reused += 1
        else:
            try:
                probe = probe_chunk(path, decode)
            except (OSError, ValueError) as e:
                res.bad.append((str(path), str(e).replace("\n", " ").replace("\t", " ")))
                continue
        probes.append((start, rel, probe, st))
    return probes


def index_video(
    directory: str, out: str, video_id: str, length: float | None, decode: bool, reuse: dict[str, dict]
) -> VideoResult:
    """Manifest rows of one chunk directory with chunks every ``length`` seconds (``reuse``: earlier rows by
    path, whose frame counts are reused for unchanged files)."""
    d, out_p = Path(directory), Path(out)
    res = VideoResult(video_id, directory)
    files = chunk_files(d)
    if not files:
        res.problem = "no chunk files (<start_second>.<ext>) in a directory named like a video"
        return res
    try:
        check_starts([s for s, _ in files], length)
    except ValueError as e:
        res.problem = str(e)
        return res
    probes = _probe_files(files, out_p, decode, reuse, res)
    if not probes or probes[0][0] != 0:  # frames before the first readable chunk would map to no chunk
        res.problem = f"its first chunk {files[0][1].name} is unreadable"
        return res
    fps = probes[0][2].fps
    odd = [(Path(rel).name, pr.fps) for _, rel, pr, _ in probes if abs(pr.fps - fps) > _FPS_TOLERANCE * fps]
    if odd:
        res.problem = (
            f"chunks at different frame rates ({files[0][1].name}: {fps:g} fps, {odd[0][0]}: {odd[0][1]:g} fps)"
        )
        return res
    job = time.time_ns()
    params = {"index_only": True, "chunk_seconds": length, "count": "decode" if decode else "header"}
    for start, rel, probe, st in probes:
        res.records.append(
            {
                "video_id": video_id,
                "path": rel,
                "start": start,
                "start_frame": int(math.ceil(start * fps - 1e-6)),
                "frames": probe.frames,
                "fps": fps,
                "width": probe.width,
                "height": probe.height,
                "bytes": st.st_size,
                "mtime_ns": st.st_mtime_ns,
                "counted": probe.counted,
                "source": directory,
                "params": params,
                "job": job,
            }
        )
    if length is not None:  # a chunk short of its slot leaves frames no chunk holds
        for r in res.records[:-1]:
            slot = int(math.ceil((r["start"] + length) * fps - 1e-6)) - r["start_frame"]
            if r["frames"] < slot - MAX_CLAMP_FRAMES:
                res.short.append((str(out_p / r["path"]), r["frames"], slot))
    return res


def _video_named(name: str) -> bool:
    return os.path.splitext(name)[1].lower() in VIDEO_EXTENSIONS and not name.startswith(".")


def find_chunk_dirs(src: Path) -> tuple[list[Path], int]:
    """Directories under ``src`` named like videos (one per video; ``src`` itself when it is one), and
    the number of plain video files outside them (whole videos: not indexed)."""
    if _video_named(src.name):
        return [src], 0
    dirs, whole = [], 0
    for root, subdirs, files in os.walk(src):
        named = [n for n in subdirs if _video_named(n)]
        dirs += [Path(root) / n for n in named]
        subdirs[:] = sorted(n for n in subdirs if n not in named)  # chunk directories are not descended into
        whole += sum(1 for f in files if _video_named(f))
    return sorted(dirs), whole


def _read_old(mpath: Path) -> dict[str, dict[str, dict]]:
    """Rows of an earlier index run by video and path; refuses a manifest written by re-encoding."""
    if not mpath.is_file():
        return {}
    old = dedupe_records(read_manifest_records(mpath))
    foreign = [r for r in old if not (r.get("params") or {}).get("index_only")]
    if foreign:
        raise ValueError(
            f"{mpath}: written by a re-encoding `avion-ds chunk` run (video {foreign[0].get('video_id')!r}); "
            f"write the index to another directory (DST)"
        )
    by_video: dict[str, dict[str, dict]] = {}
    for r in old:
        by_video.setdefault(str(r["video_id"]), {})[str(r["path"])] = r
    return by_video


def _jobs(dirs: list[Path], summary: IndexSummary) -> list[tuple[Path, str]]:
    seen: dict[str, Path] = {}
    jobs = []
    for d in dirs:
        vid = Path(d.name).stem
        if vid in seen:
            summary.bad_dirs.append((str(d), f"duplicate video_id {vid!r} (also {seen[vid]})"))
            continue
        seen[vid] = d
        jobs.append((d, vid))
    return jobs


def _collect(res: VideoResult, summary: IndexSummary) -> list[dict]:
    """Fold one video's result into the summary; returns the rows to keep."""
    summary.bad_chunks += res.bad
    if res.problem:
        summary.bad_dirs.append((res.directory, res.problem))
        return []
    summary.videos.append(res.video_id)
    summary.chunks += len(res.records)
    summary.reused += res.reused
    summary.short += res.short
    for r in res.records:
        summary.counted[r["counted"]] = summary.counted.get(r["counted"], 0) + 1
    return res.records


def index_tree(
    src: str | Path,
    dst: str | Path | None = None,
    chunk_seconds: float | None = None,
    decode_count: bool = False,
    workers: int = 1,
    progress: bool = True,
) -> IndexSummary:
    """Write ``dst/manifest.jsonl`` (default ``src``) for the chunk tree under ``src`` (see the module doc).

    ``chunk_seconds``: the chunk length (default: the most common spacing of the names in the tree); a video
    whose chunks start elsewhere than ``0, L, 2L, ...`` is left out and named. Raises ValueError (one line)
    for a missing source, a tree without chunk directories, or a ``dst`` manifest written by re-encoding.
    """
    t0 = time.perf_counter()
    src = Path(src)
    out = Path(dst) if dst else src
    if not src.is_dir():
        raise ValueError(f"{src}: not a directory (--index-only reads a tree of <video>.<ext>/<start_second>.<ext>)")
    dirs, whole = find_chunk_dirs(src)
    if not dirs:
        hint = f"; it holds {whole} whole video files: chunk them with `avion-ds chunk SRC DST`" if whole else ""
        raise ValueError(
            f"{src}: no chunk directories (<video>.<ext>/<start_second>.<ext>, e.g. P01/P01_01.MP4/0.MP4){hint}"
        )
    out.mkdir(parents=True, exist_ok=True)
    mpath = out / MANIFEST_NAME
    reuse = _read_old(mpath)
    summary = IndexSummary(manifest=mpath, whole_videos=whole)
    jobs = _jobs(dirs, summary)
    listing = {d: [start for start, _ in chunk_files(d)] for d, _ in jobs}
    summary.chunk_seconds = chunk_seconds or tree_chunk_length(list(listing.values()))
    kept: dict[str, list[dict]] = {}
    bar = tqdm(total=len(jobs), desc="index", unit="video", disable=not progress)
    with mpath.open("a") as journal:  # appended as videos finish: an interrupted run keeps its work

        def done(res: VideoResult) -> None:
            rows = _collect(res, summary)
            if rows:
                kept[res.video_id] = rows
                journal.write("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))
                journal.flush()
            bar.update(1)

        length = summary.chunk_seconds
        args = [(str(d), str(out), vid, length, decode_count, reuse.get(vid, {})) for d, vid in jobs]
        if workers <= 1 or len(jobs) <= 1:
            for a in args:
                done(index_video(*a))
        else:
            with ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn")) as pool:
                pending: dict[Future, tuple] = {pool.submit(index_video, *a): a for a in args}
                while pending:
                    finished, _ = wait(pending, return_when=FIRST_COMPLETED)
                    for fut in finished:
                        a = pending.pop(fut)
                        try:
                            done(fut.result())
                        except Exception as e:  # noqa: BLE001 - a crashed worker: its directory is named
                            done(VideoResult(a[2], a[0], problem=f"{type(e).__name__}: {e}"))
    bar.close()
    write_manifest(mpath, [r for vid in sorted(kept) for r in sorted(kept[vid], key=lambda r: r["start_frame"])])
    failures = summary.bad_dirs + summary.bad_chunks
    fpath = out / FAILURES_NAME
    if failures:
        fpath.write_text("".join(f"{p}\t{reason}\n" for p, reason in failures))
    else:
        fpath.unlink(missing_ok=True)
    if summary.chunks > summary.reused and (out / QUARANTINE_NAME).is_file():
        summary.stale_quarantine = out / QUARANTINE_NAME
    summary.seconds = time.perf_counter() - t0
    return summary


def run_index(
    src: str, dst: str | None, chunk_seconds: float | None, decode_count: bool, workers: int, progress: bool
) -> int:
    """``avion-ds chunk --index-only`` body: 0 done, 1 something left out (listed), 2 bad input (one line)."""
    try:
        s = index_tree(src, dst, chunk_seconds, decode_count, workers, progress)
    except (OSError, ValueError) as e:
        print(f"avion-ds chunk: error: {e}", file=sys.stderr)
        return 2
    print(s)
    if s.failed:
        print(f"failures listed in {Path(dst or src) / FAILURES_NAME}", file=sys.stderr)
        return 1
    return 0
