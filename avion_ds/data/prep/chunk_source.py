"""Chunking ONE source video: decode through an FFmpeg filter graph, encode chunks, count their frames.

The run over a whole tree (incremental re-runs, workers, the manifest) is :mod:`avion_ds.data.prep.chunking`.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from fractions import Fraction
from itertools import pairwise
from pathlib import Path

from avion_ds.data.prep.x264 import x264_options

log = logging.getLogger(__name__)
TRUNCATED_FRACTION = 0.9  # a source decoding less than this share of its header's duration is reported
_TMP_SUFFIX = ".part"


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
    import av  # lazy: PyAV is heavy to import, loaded when a video is decoded or written

    with av.open(str(path)) as c:
        s = c.streams.video[0]
        s.thread_type = "AUTO"
        return sum(1 for _ in c.decode(s))


class _ChunkWriter:
    def __init__(
        self, path: Path, width: int, height: int, fps: Fraction, gop: int, crf: int, preset: str, tune: str = ""
    ):
        import av  # lazy: PyAV is heavy to import, loaded when a video is decoded or written

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
            **x264_options(),  # reproducible bytes: no AVX-512 code in x264 (see x264.py)
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


@dataclass
class _SourceGeometry:
    """Output frame rate, size and frames per chunk of one source video under ``params``."""

    fps: Fraction
    width: int
    height: int
    per_chunk: int


def _open_source(src_p: Path, st: os.stat_result):
    """The source opened with PyAV; ValueError with a reason for a zero-byte or non-video file."""
    import av  # lazy: PyAV is heavy to import; `avion-ds chunk` workers import it when they chunk

    if st.st_size == 0:
        raise ValueError("zero-byte file")
    try:
        return av.open(str(src_p))
    except av.FFmpegError as e:
        raise ValueError(f"cannot open as video ({e})") from None


def _geometry(stream, params: dict) -> _SourceGeometry:
    """Output fps (``params["fps"]`` or the source's), square-pixel size and frames per chunk."""
    src_fps = stream.average_rate or stream.guessed_rate or Fraction(30)
    fps = Fraction(params["fps"]).limit_denominator(1001) if params["fps"] else Fraction(src_fps)
    sar = stream.sample_aspect_ratio  # container's, else the codec's (FFmpeg's guess); None: square
    width, height = output_size(stream.codec_context.width, stream.codec_context.height, params["short_side"], sar)
    return _SourceGeometry(fps, width, height, max(1, int(round(params["chunk_seconds"] * fps))))


def _filter_graph(stream, geo: _SourceGeometry):
    """FFmpeg filters from the source stream to chunk frames: fps, scale, square pixels, yuv420p."""
    import av.filter  # lazy: PyAV is heavy to import

    graph = av.filter.Graph()
    nodes = [
        graph.add_buffer(template=stream),
        graph.add("fps", f"fps={geo.fps.numerator}/{geo.fps.denominator}"),
        graph.add("scale", f"{geo.width}:{geo.height}"),
        graph.add("setsar", "1"),
        graph.add("format", "pix_fmts=yuv420p"),
        graph.add("buffersink"),
    ]
    for a, b in pairwise(nodes):
        a.link_to(b)
    graph.configure()
    return graph


class _ChunkSequence:
    """Frames in, chunk files out: a new chunk every ``per_chunk`` frames, one manifest record each."""

    def __init__(self, out_dir: Path, geo: _SourceGeometry, params: dict, base: dict) -> None:
        self.out_dir, self.geo, self.params, self.base = out_dir, geo, params, base
        self.writer: _ChunkWriter | None = None
        self.records: list[dict] = []
        self.k = 0  # output frames so far

    def emit(self, frame) -> None:
        """Append one output frame, closing the current chunk when it is full."""
        geo, params = self.geo, self.params
        if self.k % geo.per_chunk == 0:
            if self.writer is not None:
                self.records.append(_record(self.writer, self.base, self.k - self.writer.n, geo.fps))
            start_s = float(self.k / geo.fps)
            self.writer = _ChunkWriter(
                self.out_dir / f"{_chunk_name(start_s)}.mp4",
                geo.width,
                geo.height,
                geo.fps,
                params["gop"],
                params["crf"],
                params["preset"],
                params.get("tune", ""),
            )
        self.writer.write(frame)
        self.k += 1

    def drain(self, graph) -> None:
        """Emit every frame the filter graph has ready."""
        import av  # lazy: PyAV is heavy to import

        while True:
            try:
                self.emit(graph.pull())
            except (av.error.BlockingIOError, av.error.EOFError):
                return

    def close(self) -> None:
        """Finish the last chunk; ValueError when no frame was written at all."""
        if self.writer is None:
            raise ValueError("no decodable video frames")
        self.records.append(_record(self.writer, self.base, self.k - self.writer.n, self.geo.fps))
        self.writer = None

    def abort(self) -> None:
        """Remove the chunk being written (a failed source)."""
        if self.writer is not None:
            self.writer.abort()


def _decode_into(container, stream, graph, chunks: _ChunkSequence, src: str) -> None:
    """Decode the source through ``graph`` into ``chunks``; a decode error after the first frame keeps
    what decoded (logged), before it is a ValueError."""
    import av  # lazy: PyAV is heavy to import

    try:
        for frame in container.decode(stream):
            graph.push(frame)
            chunks.drain(graph)
    except av.FFmpegError as e:
        if chunks.k == 0:
            raise ValueError(f"decode error before the first frame ({e})") from None
        log.warning("%s: decode stopped early after %d output frames (%s); keeping what decoded", src, chunks.k, e)
    graph.push(None)
    chunks.drain(graph)


def _note_truncation(src: str, records: list[dict], expected_s: float, decoded_s: float) -> None:
    """Log a source decoding less than TRUNCATED_FRACTION of its header's duration; both go into its records."""
    if expected_s and decoded_s < TRUNCATED_FRACTION * expected_s:
        log.warning("%s: truncated source? decodes %.2fs of the %.2fs its header states", src, decoded_s, expected_s)
        for r in records:
            r["source_expected_s"], r["source_decoded_s"] = round(expected_s, 3), round(decoded_s, 3)


def _chunk_stream(
    container, src_p: Path, st: os.stat_result, out_dir: Path, video_id: str, params: dict
) -> _ChunkSequence:
    """Chunk the opened source's first video stream into ``out_dir``; the chunks written (records)."""
    if not container.streams.video:
        raise ValueError("no video stream")
    stream = container.streams.video[0]
    stream.thread_type = "AUTO"
    geo = _geometry(stream, params)
    graph = _filter_graph(stream, geo)
    out_dir.mkdir(parents=True, exist_ok=True)
    for stale in out_dir.glob("*" + _TMP_SUFFIX):
        stale.unlink()
    expected_s = _header_seconds(container, stream)
    base = {
        "video_id": video_id,
        "fps": float(geo.fps),
        "width": geo.width,
        "height": geo.height,
        "source": str(src_p),
        "source_size": st.st_size,
        "source_mtime_ns": st.st_mtime_ns,
        "params": params,
        "job": time.time_ns(),
    }
    chunks = _ChunkSequence(out_dir, geo, params, base)
    try:
        _decode_into(container, stream, graph, chunks, str(src_p))
        chunks.close()
    except BaseException:
        chunks.abort()
        raise
    _note_truncation(str(src_p), chunks.records, expected_s, float(chunks.k / geo.fps))
    return chunks


def chunk_one(src: str, dst: str, video_id: str, params: dict) -> list[dict]:
    """Chunk one source video; returns its manifest records. Raises with a reason on failure."""
    src_p, out_dir = Path(src), Path(dst) / video_id
    st = src_p.stat()
    container = _open_source(src_p, st)
    try:
        records = _chunk_stream(container, src_p, st, out_dir, video_id, params).records
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
