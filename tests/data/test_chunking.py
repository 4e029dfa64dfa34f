"""Chunking tool: layout, counted frames, scaling, incremental re-runs, failures."""

from __future__ import annotations

import json
import os
import shutil

from avion_ds.cli import chunk as chunk_cli
from avion_ds.data.prep.chunk_source import output_size
from avion_ds.data.prep.chunking import FAILURES_NAME, chunk_videos
from avion_ds.data.prep.manifest import read_manifest_records
from avion_ds.data.prep.manifest_index import load_manifest
from avion_ds.data.prep.synthetic import read_frame_index, write_video


def test_layout_and_manifest(index_chunks, decode_all) -> None:
    names = sorted(p.name for p in (index_chunks / "idx").iterdir())
    assert names == ["0.mp4", "1.mp4", "2.mp4", "3.mp4", "4.mp4"]
    recs = sorted(read_manifest_records(index_chunks), key=lambda r: r["start_frame"])
    assert [r["start_frame"] for r in recs] == [0, 30, 60, 90, 120]
    for r in recs:
        assert r["frames"] == len(decode_all(index_chunks / r["path"])) == 30  # counted by decoding
        assert (r["fps"], r["width"], r["height"], r["video_id"]) == (30.0, 96, 72, "idx")
        assert r["source_size"] > 0 and r["source_mtime_ns"] > 0
    # every frame lands in the chunk its time says, in order
    frames = decode_all(index_chunks / "idx" / "2.mp4")
    assert [read_frame_index(f) for f in frames.numpy()] == list(range(60, 90))
    assert not list(index_chunks.rglob("*.part"))


def test_output_size_never_upscales() -> None:
    assert output_size(1920, 1080, 320) == (568, 320)
    assert output_size(1080, 1920, 320) == (320, 568)
    assert output_size(96, 72, 320) == (96, 72)
    assert output_size(97, 73, None) == (96, 72)  # even sizes for yuv420p, never up


def _sar_source(path, width: int, height: int, sar, band: tuple[int, int]):
    """A source whose stream stores non-square pixels (``sar``): a white band over columns ``band``."""
    import av
    import numpy as np

    with av.open(str(path), "w") as c:
        s = c.add_stream("libx264", rate=10)
        s.width, s.height, s.pix_fmt = width, height, "yuv420p"
        s.codec_context.sample_aspect_ratio = sar
        img = np.zeros((height, width, 3), np.uint8)
        img[:, band[0] : band[1]] = 255
        for _ in range(10):
            for pkt in s.encode(av.VideoFrame.from_ndarray(img, format="rgb24")):
                c.mux(pkt)
        for pkt in s.encode(None):
            c.mux(pkt)
    return path


def test_non_square_pixels_are_chunked_at_the_display_aspect(tmp_path, decode_all) -> None:
    """176x144 with SAR 128:117 displays 192.5x144 (FFmpeg's reading): chunks are 192x144 square pixels
    (not 176x144, 8.6% narrower than the display), and the picture is stretched to match."""
    from fractions import Fraction

    import av

    (tmp_path / "src").mkdir()
    src = _sar_source(tmp_path / "src" / "cif.mp4", 176, 144, Fraction(128, 117), (44, 88))
    s = chunk_videos(src.parent, tmp_path / "out", chunk_seconds=10.0, short_side=320, fps=10, progress=False)
    assert s.ok == ["cif"] and not s.failed
    entry = load_manifest(tmp_path / "out")["cif"]
    assert (entry.width, entry.height) == (192, 144)
    with av.open(entry.chunks[0].path) as c:
        assert c.streams.video[0].sample_aspect_ratio in (None, Fraction(0), Fraction(1))  # square pixels
    cols = decode_all(entry.chunks[0].path)[0].float().mean(dim=(0, 2)) > 128  # the band's columns
    lit = cols.nonzero().flatten()
    assert abs(int(lit.min()) - 48) <= 2 and abs(int(lit.max()) - 95) <= 2  # 1/4..1/2 of the display width
    # scaled down: the short side of the display size
    s = chunk_videos(src.parent, tmp_path / "small", chunk_seconds=10.0, short_side=72, fps=10, progress=False)
    assert (load_manifest(tmp_path / "small")["cif"].width, load_manifest(tmp_path / "small")["cif"].height) == (96, 72)
    assert output_size(720, 480, 320, Fraction(8, 9)) == (426, 320)  # anamorphic NTSC: 640x480 display
    assert output_size(176, 144, 320, Fraction(1)) == output_size(176, 144, 320) == (176, 144)


def test_fps_conversion_and_scaling(tmp_path, index_video, decode_all) -> None:
    s = chunk_videos(index_video, tmp_path / "out", chunk_seconds=2.0, short_side=36, fps=15, gop=4, progress=False)
    assert s.ok == ["idx"] and not s.failed
    entry = load_manifest(tmp_path / "out")["idx"]
    assert (entry.width, entry.height, entry.fps) == (48, 36, 15.0)
    assert [c.frames for c in entry.chunks] == [30, 30, 15]  # 5 s at 15 fps in 2 s chunks
    first = decode_all(entry.chunks[1].path)[0]
    assert first.shape == (36, 48, 3)


def test_incremental_rerun_and_failures(tmp_path, index_video) -> None:
    src = tmp_path / "src"
    src.mkdir()
    shutil.copy(index_video, src / "a.mp4")
    write_video(src / "b.mp4", 20, 32, 32, fps=10)
    (src / "empty.mp4").write_bytes(b"")
    (src / "notes.mp4").write_text("this is not a video\n" * 10)
    dst = tmp_path / "dst"
    (dst / "a").mkdir(parents=True)
    (dst / "a" / "0.mp4.part").write_bytes(b"half a chunk from an interrupted run")

    s = chunk_videos(src, dst, chunk_seconds=1.0, fps=30, workers=2, progress=False)
    assert sorted(s.ok) == ["a", "b"] and not s.skipped
    failed = dict(s.failed)
    assert failed[str(src / "empty.mp4")] == "ValueError: zero-byte file"
    assert "cannot open as video" in failed[str(src / "notes.mp4")]
    lines = (dst / FAILURES_NAME).read_text().splitlines()
    assert sorted(line.split("\t")[0] for line in lines) == sorted([str(src / "empty.mp4"), str(src / "notes.mp4")])
    assert not list(dst.rglob("*.part"))
    videos = load_manifest(dst)
    assert set(videos) == {"a", "b"} and videos["b"].num_frames == 60  # 2 s resampled 10 -> 30 fps

    # re-run: nothing to do; then change one source -> only it is redone
    (src / "empty.mp4").unlink()
    (src / "notes.mp4").unlink()
    s2 = chunk_videos(src, dst, chunk_seconds=1.0, fps=30, progress=False)
    assert sorted(s2.skipped) == ["a", "b"] and not s2.ok and not s2.failed
    assert not (dst / FAILURES_NAME).exists()
    write_video(src / "b.mp4", 40, 32, 32, fps=10)
    st = os.stat(src / "b.mp4")
    os.utime(src / "b.mp4", ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    s3 = chunk_videos(src, dst, chunk_seconds=1.0, fps=30, progress=False)
    assert s3.ok == ["b"] and s3.skipped == ["a"]
    assert load_manifest(dst)["b"].num_frames == 120
    lines = [json.loads(x) for x in (dst / "manifest.jsonl").read_text().splitlines()]
    assert len(lines) == len({(r["video_id"], r["start_frame"]) for r in lines})  # compacted
    # a deleted chunk makes its video stale again
    (dst / "a" / "2.mp4").unlink()
    assert chunk_videos(src, dst, chunk_seconds=1.0, fps=30, progress=False).ok == ["a"]


def test_cli_exit_code(tmp_path, capsys) -> None:
    src = tmp_path / "src"
    src.mkdir()
    write_video(src / "ok.mp4", 10, 32, 32, fps=10)
    assert chunk_cli.main([str(src), str(tmp_path / "d1"), "--chunk-seconds", "1", "--no-progress"]) == 0
    (src / "bad.mp4").write_bytes(b"\x00" * 100)
    assert (
        chunk_cli.main([str(src), str(tmp_path / "d2"), "--chunk-seconds", "1", "--no-progress", "--workers", "1"]) == 1
    )
    captured = capsys.readouterr()
    assert "FAILED" in captured.out and str(src / "bad.mp4") in captured.out
    assert chunk_cli.main([str(tmp_path / "missing"), str(tmp_path / "d3")]) == 2


def test_avion_ds_cli_dispatches_synth_and_chunk(tmp_path) -> None:
    from avion_ds.cli import main as cli

    assert cli(["synth", str(tmp_path / "syn"), "--num-videos", "1", "--segments-per-video", "2"]) == 0
    assert (
        cli(
            [
                "chunk",
                str(tmp_path / "syn" / "videos"),
                str(tmp_path / "chunks"),
                "--chunk-seconds",
                "2",
                "--no-progress",
            ]
        )
        == 0
    )
    entry = load_manifest(tmp_path / "chunks")["P01_101"]
    assert entry.num_frames == 4 * 30 and (entry.width, entry.height) == (96, 72)  # 4 s at 30 fps, not upscaled


def test_manifest_after_an_interrupted_rerun(tmp_path) -> None:
    """Old + new job lines for one video (journal of an interrupted re-run) and a torn last line."""
    from avion_ds.data.prep.manifest import dedupe_records

    def rec(vid, start, frames, job):
        return {
            "video_id": vid,
            "path": f"{vid}/{start}.mp4",
            "start_frame": start,
            "frames": frames,
            "fps": 30.0,
            "width": 64,
            "height": 48,
            "job": job,
        }

    old = [rec("a", 0, 450, 1), rec("a", 450, 450, 1), rec("a", 900, 10, 1), rec("b", 0, 30, 1)]
    new = [rec("a", 0, 450, 2), rec("a", 450, 449, 2)]  # the re-run of "a" got two chunks in before dying
    text = "".join(json.dumps(r) + "\n" for r in old + new) + '{"video_id": "a", "pa'
    (tmp_path / "manifest.jsonl").write_text(text)
    recs = dedupe_records(read_manifest_records(tmp_path))
    assert sorted((r["video_id"], r["start_frame"], r["frames"]) for r in recs) == [
        ("a", 0, 450),
        ("a", 450, 449),
        ("b", 0, 30),
    ]
    videos = load_manifest(tmp_path)
    assert videos["a"].num_frames == 899 and videos["b"].num_frames == 30


def _keyframes(path) -> list[int]:
    """Positions of the keyframe packets of a video (demuxed, not decoded)."""
    import av

    with av.open(str(path)) as c:
        s = c.streams.video[0]
        return [i for i, p in enumerate(p for p in c.demux(s) if p.size) if p.is_keyframe]


def test_gop_is_the_chunk_tools_not_the_sources(tmp_path) -> None:
    # An all-intra source (ProRes-style intermediates, MJPEG, FFmpeg's test sources): decoded frames keep their
    # picture type I, and libx264 obeys a frame's type, so chunks came out all-intra with --gop ignored.
    src = write_video(tmp_path / "src" / "intra.mp4", 60, 64, 48, fps=30, gop=1)
    assert _keyframes(src) == list(range(60))
    chunk_videos(src, tmp_path / "out", chunk_seconds=1.0, fps=30, gop=8, progress=False)
    for c in load_manifest(tmp_path / "out")["intra"].chunks:
        assert _keyframes(c.path) == [0, 8, 16, 24]
