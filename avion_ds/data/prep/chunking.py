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
import os
import time
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from fractions import Fraction
from itertools import pairwise
from multiprocessing import get_context
from pathlib import Path

from avion_ds.data.datasets.quarantine import QUARANTINE_NAME
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
TRUNCATED_FRACTION = 0.9  # a source decoding less than this share of its header's duration is reported
_TMP_SUFFIX = ".part"


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


def _even(x: float) -> int:
    return max(2, int(round(x / 2)) * 2)


def output_size(width: int, height: int, short_side: int | None, sar: Fraction | None = None) -> tuple[int, int]:
    """Square-pixel output size: the display size (width x SAR, as FFmpeg shows non-square pixels)
    scaled so the short side is ``short_side`` (never upscale); both sides even (yuv420p)."""
    display = width * float(sar) if sar and sar > 0 else float(width)
    short = min(display, height)
    if short_side and short > short_side:
        s = short_side / short
        return _even(display * s), _even(height * s)
    w = int(round(display))
    return max(2, w - w % 2), max(2, height - height % 2)


def _chunk_name(start_s: float) -> str:
    return f"{int(start_s)}" if float(start_s).is_integer() else f"{start_s:g}"


def count_frames(path: str | Path) -> int:
    """Number of frames that actually decode (never the header's count)."""
    import av

    with av.open(str(path)) as c:
        s = c.streams.video[0]
        s.thread_type = "AUTO"
        return sum(1 for _ in c.decode(s))


class _ChunkWriter:
    def __init__(
        self, path: Path, width: int, height: int, fps: Fraction, gop: int, crf: int, preset: str, tune: str = ""
    ):
        import av

        self.tmp = path.with_name(path.name + _TMP_SUFFIX)
        self.path = path
        self.c = av.open(str(self.tmp), mode="w", format="mp4")
        self.s = self.c.add_stream("libx264", rate=fps)
        self.s.width, self.s.height, self.s.pix_fmt = width, height, "yuv420p"
        self.s.options = {
            "crf": str(crf),
            "preset": preset,
            "g": str(gop),
            "keyint_min": str(gop),
            "sc_threshold": "0",
            "bf": "0",
            **({"tune": tune} if tune else {}),
        }
        self.s.codec_context.time_base = 1 / fps
        self.n = 0

    def write(self, frame) -> None:  # av.VideoFrame in yuv420p
        frame.pts, frame.time_base = self.n, self.s.codec_context.time_base
        # A decoded frame keeps its source picture type, and libx264 obeys it: an all-intra source (ProRes-style
        # intermediates, MJPEG, FFmpeg test sources) would give all-intra chunks, about 4x larger, with ``gop``
        # ignored. Clear it, so x264 alone decides (a keyframe every ``gop`` frames).
        frame.pict_type = 0  # AV_PICTURE_TYPE_NONE
        self.n += 1
        for p in self.s.encode(frame):
            self.c.mux(p)

    def finish(self) -> tuple[int, int]:
        """Flush, count decoded frames, rename into place; returns (frames, bytes)."""
        for p in self.s.encode(None):
            self.c.mux(p)
        self.c.close()
        frames = count_frames(self.tmp)
        os.replace(self.tmp, self.path)
        return frames, self.path.stat().st_size

    def abort(self) -> None:
        try:
            self.c.close()
        except Exception:  # noqa: BLE001, S110 - best effort cleanup of a failed chunk
            pass
        self.tmp.unlink(missing_ok=True)


def chunk_one(src: str, dst: str, video_id: str, params: dict) -> list[dict]:
    """Chunk one source video; returns its manifest records. Raises with a reason on failure."""
    import av
    import av.filter

    src_p, out_dir = Path(src), Path(dst) / video_id
    st = src_p.stat()
    if st.st_size == 0:
        raise ValueError("zero-byte file")
    try:
        container = av.open(str(src_p))
    except av.FFmpegError as e:
        raise ValueError(f"cannot open as video ({e})") from None
    writer: _ChunkWriter | None = None
    records: list[dict] = []
    try:
        if not container.streams.video:
            raise ValueError("no video stream")
        stream = container.streams.video[0]
        stream.thread_type = "AUTO"
        src_fps = stream.average_rate or stream.guessed_rate or Fraction(30)
        fps = Fraction(params["fps"]).limit_denominator(1001) if params["fps"] else Fraction(src_fps)
        sar = stream.sample_aspect_ratio  # container's, else the codec's (FFmpeg's guess); None: square
        width, height = output_size(stream.codec_context.width, stream.codec_context.height, params["short_side"], sar)
        per_chunk = max(1, int(round(params["chunk_seconds"] * fps)))
        graph = av.filter.Graph()
        nodes = [
            graph.add_buffer(template=stream),
            graph.add("fps", f"fps={fps.numerator}/{fps.denominator}"),
            graph.add("scale", f"{width}:{height}"),
            graph.add("setsar", "1"),
            graph.add("format", "pix_fmts=yuv420p"),
            graph.add("buffersink"),
        ]
        for a, b in pairwise(nodes):
            a.link_to(b)
        graph.configure()
        out_dir.mkdir(parents=True, exist_ok=True)
        for stale in out_dir.glob("*" + _TMP_SUFFIX):
            stale.unlink()
        expected_s = _header_seconds(container, stream)
        base = {
            "video_id": video_id,
            "fps": float(fps),
            "width": width,
            "height": height,
            "source": str(src_p),
            "source_size": st.st_size,
            "source_mtime_ns": st.st_mtime_ns,
            "params": params,
            "job": time.time_ns(),
        }
        k = 0

        def emit(frame) -> None:
            nonlocal writer, k
            if k % per_chunk == 0:
                if writer is not None:
                    records.append(_record(writer, base, k - writer.n, fps))
                start_s = float(k / fps)
                writer = _ChunkWriter(
                    out_dir / f"{_chunk_name(start_s)}.mp4",
                    width,
                    height,
                    fps,
                    params["gop"],
                    params["crf"],
                    params["preset"],
                    params.get("tune", ""),
                )
            writer.write(frame)
            k += 1

        def drain() -> None:
            while True:
                try:
                    emit(graph.pull())
                except (av.error.BlockingIOError, av.error.EOFError):
                    return

        try:
            for frame in container.decode(stream):
                graph.push(frame)
                drain()
        except av.FFmpegError as e:
            if k == 0:
                raise ValueError(f"decode error before the first frame ({e})") from None
            log.warning("%s: decode stopped early after %d output frames (%s); keeping what decoded", src, k, e)
        graph.push(None)
        drain()
        if writer is None:
            raise ValueError("no decodable video frames")
        records.append(_record(writer, base, k - writer.n, fps))
        writer = None
        decoded_s = float(k / fps)
        if expected_s and decoded_s < TRUNCATED_FRACTION * expected_s:
            log.warning(
                "%s: truncated source? decodes %.2fs of the %.2fs its header states", src, decoded_s, expected_s
            )
            for r in records:
                r["source_expected_s"], r["source_decoded_s"] = round(expected_s, 3), round(decoded_s, 3)
    except BaseException:
        if writer is not None:
            writer.abort()
        raise
    finally:
        container.close()
    keep = {Path(r["path"]).name for r in records}
    for old in out_dir.glob("*.mp4"):
        if old.name not in keep:
            old.unlink()
    return records


def _header_seconds(container, stream) -> float:
    """Duration the source's header states (stream, else container); 0.0 when it states none."""
    if stream.duration and stream.time_base:
        return float(stream.duration * stream.time_base)
    return (container.duration or 0) / 1e6


def _record(writer: _ChunkWriter, base: dict, start_frame: int, fps: Fraction) -> dict:
    frames, size = writer.finish()
    rel = f"{base['video_id']}/{writer.path.name}"
    return {
        **base,
        "path": rel,
        "start": float(start_frame / fps),
        "start_frame": start_frame,
        "frames": frames,
        "bytes": size,
        "mtime_ns": writer.path.stat().st_mtime_ns,
    }


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
    if chunk_seconds <= 0 or gop <= 0:
        raise ValueError(f"chunk_seconds ({chunk_seconds}) and gop ({gop}) must be positive")
    dst.mkdir(parents=True, exist_ok=True)
    params = {
        "chunk_seconds": float(chunk_seconds),
        "short_side": short_side,
        "fps": fps,
        "gop": int(gop),
        "crf": int(crf),
        "preset": preset,
        "tune": tune,
    }
    mpath = dst / MANIFEST_NAME
    old = dedupe_records(read_manifest_records(mpath)) if mpath.is_file() else []
    old_by_video: dict[str, list[dict]] = {}
    for r in old:
        old_by_video.setdefault(r["video_id"], []).append(r)

    summary = ChunkSummary(manifest=mpath)
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

    from tqdm import tqdm

    bar = tqdm(total=len(jobs), desc="chunk", unit="video", disable=not progress)
    with mpath.open("a") as journal:  # appended as videos finish: an interrupted run keeps its work

        def done(vid: str, path: Path, recs: list[dict] | None, err: BaseException | None) -> None:
            if err is not None:
                reason = f"{type(err).__name__}: {err}".replace("\n", " ").replace("\t", " ")
                summary.failed.append((str(path), reason))
                log.error("chunk %s failed: %s", path, reason)
            else:
                results[vid] = recs or []
                summary.ok.append(vid)
                if recs and "source_expected_s" in recs[0]:
                    summary.truncated.append((str(path), recs[0]["source_expected_s"], recs[0]["source_decoded_s"]))
                for r in recs or []:
                    journal.write(json.dumps(r, sort_keys=True) + "\n")
                journal.flush()
            bar.update(1)
            bar.set_postfix(failed=len(summary.failed))

        if workers <= 1 or len(jobs) <= 1:
            for path, vid in jobs:
                try:
                    done(vid, path, chunk_one(str(path), str(dst), vid, params), None)
                except Exception as e:  # noqa: BLE001 - reported per source, the rest go on
                    done(vid, path, None, e)
        else:
            with ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn")) as pool:
                pending: dict[Future, tuple[Path, str]] = {
                    pool.submit(_run_job, str(p), str(dst), v, params): (p, v) for p, v in jobs
                }
                while pending:
                    finished, _ = wait(pending, return_when=FIRST_COMPLETED)
                    for fut in finished:
                        path, vid = pending.pop(fut)
                        try:
                            done(vid, path, fut.result(), None)
                        except Exception as e:  # noqa: BLE001 - includes a crashed worker process
                            done(vid, path, None, e)
    bar.close()
    failed_ids = {Path(p).stem for p, _ in summary.failed}
    keep = [r for r in old if r["video_id"] not in results and r["video_id"] not in failed_ids]
    for vid in sorted(results):
        keep.extend(sorted(results[vid], key=lambda r: r["start_frame"]))
    write_manifest(mpath, keep)
    fpath = dst / FAILURES_NAME
    if summary.failed:
        fpath.write_text("".join(f"{p}\t{reason}\n" for p, reason in summary.failed))
    else:
        fpath.unlink(missing_ok=True)
    if summary.ok and (dst / QUARANTINE_NAME).is_file():
        summary.stale_quarantine = dst / QUARANTINE_NAME
        log.warning("%s predates this run's chunks: re-run `avion-ds check` before training", dst / QUARANTINE_NAME)
    summary.seconds = time.perf_counter() - t0
    return summary
