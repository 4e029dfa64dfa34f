"""The chunk tool never serves wrong frames: kill during re-chunking, replaced files, odd sources."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import av
import pytest

from avion_ds.config import DataConfig
from avion_ds.data import build_dataset
from avion_ds.data.errors import DataError
from avion_ds.data.prep.chunking import chunk_videos
from avion_ds.data.prep.manifest import check_chunk_file
from avion_ds.data.prep.manifest_index import load_manifest
from avion_ds.data.prep.synthetic import read_frame_index, write_video

REPO = Path(__file__).resolve().parents[2]
KILL_AFTER_3_CHUNKS = """
import os, signal, sys
import avion_ds.data.prep.chunk_source as chunk_source
from avion_ds.cli import chunk as chunk_cli
real, done = chunk_source._ChunkWriter.finish, []
def finish(self):
    out = real(self)  # the new chunk has replaced the old file of the same name
    done.append(1)
    if len(done) == 3:
        os.kill(os.getpid(), signal.SIGKILL)
    return out
chunk_source._ChunkWriter.finish = finish
sys.exit(chunk_cli.main(sys.argv[1:]))
"""


@pytest.fixture()
def fifteen_fps_set(tmp_path) -> tuple[Path, Path]:
    src = write_video(tmp_path / "src" / "idx.mp4", 240, 96, 72, fps=30, gop=10)  # 8 s, frames carry their index
    dst = tmp_path / "chunks"
    assert not chunk_videos(src.parent, dst, chunk_seconds=2.0, fps=15, gop=8, progress=False).failed
    assert load_manifest(dst)["idx"].fps == 15.0
    return src, dst


def _rows_match_their_files(dst: Path) -> None:
    """Independent of the dataset: every row's file decodes to the row's frame count at the row's fps."""
    for entry in load_manifest(dst).values():
        for c in entry.chunks:
            with av.open(c.path) as f:
                s = f.streams.video[0]
                n = sum(1 for _ in f.decode(s))
                assert (n, float(s.average_rate)) == (c.frames, c.fps), c.path
            assert check_chunk_file(c) is None


def test_kill_during_rechunk_leaves_no_rows_for_replaced_files(fifteen_fps_set) -> None:
    src, dst = fifteen_fps_set
    cmd = [
        sys.executable,
        "-c",
        KILL_AFTER_3_CHUNKS,
        str(src.parent),
        str(dst),
        "--chunk-seconds",
        "2",
        "--fps",
        "30",
        "--gop",
        "8",
        "--workers",
        "1",
        "--no-progress",
    ]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == -9, proc.stderr[-2000:]  # killed midway
    replaced = [p for p in (dst / "idx").glob("*.mp4") if av.open(str(p)).streams.video[0].average_rate == 30]
    assert len(replaced) == 3  # files of the 15 fps set were replaced by 30 fps chunks
    _rows_match_their_files(dst)  # ... and no manifest row still describes them
    lst = dst.parent / "list.txt"
    lst.write_text("idx.mp4 0\n")
    cfg = DataConfig(
        dataset="kinetics",
        root=str(dst),
        train_csv=str(lst),
        val_csv=str(lst),
        num_frames=4,
        sampling="stride",
        stride=2,
        size=32,
        decode_timeout_s=0.0,
        on_error="raise",
    )
    assert "idx" not in load_manifest(dst)  # the video is absent until re-chunked, never wrong
    with pytest.raises(ValueError, match="lists no decodable chunks"):
        build_dataset(cfg, "val")
    # the next run re-chunks it completely at 30 fps, frames at the right times
    (dst / "quarantine.tsv").write_text("idx/0.mp4\tdecoded 3 frames\n")  # an older check's verdict
    s = chunk_videos(src.parent, dst, chunk_seconds=2.0, fps=30, gop=8, progress=False)
    assert s.ok == ["idx"] and not s.failed
    assert f"STALE {dst / 'quarantine.tsv'}: written before these chunks" in str(s)
    (dst / "quarantine.tsv").unlink()  # what re-running `avion-ds check` on the healthy set does
    _rows_match_their_files(dst)
    ds = build_dataset(cfg, "val")
    entry = load_manifest(dst)["idx"]
    assert entry.fps == 30.0 and entry.num_frames == 240
    frames = ds.decoder.decode(entry.chunks[2].path, [0, 59])
    assert [read_frame_index(f) for f in frames.numpy()] == [120, 179]


def test_dataset_refuses_a_row_whose_file_was_replaced(fifteen_fps_set) -> None:
    """The state a killed re-chunk left before the fix: 15 fps rows over 30 fps files."""
    src, dst = fifteen_fps_set
    old_rows = (dst / "manifest.jsonl").read_text()
    assert not chunk_videos(src.parent, dst, chunk_seconds=2.0, fps=30, gop=8, progress=False).failed
    (dst / "manifest.jsonl").write_text(old_rows)
    lst = dst.parent / "list.txt"
    lst.write_text("idx.mp4 0\n")
    cfg = DataConfig(
        dataset="kinetics",
        root=str(dst),
        train_csv=str(lst),
        val_csv=str(lst),
        num_frames=4,
        sampling="stride",
        stride=2,
        size=32,
        decode_timeout_s=0.0,
        on_error="raise",
    )
    with pytest.raises(DataError, match=r"idx/\d+\.mp4: file does not match its manifest row"):
        build_dataset(cfg, "val")[0]
    skip = build_dataset(replace(cfg, on_error="skip"), "val")
    with pytest.raises(DataError, match="bad samples in a row"):  # never served, even when skipping
        skip[0]


@pytest.mark.parametrize("kind", ["mkv", "streamable_mp4"])
def test_truncated_source_is_warned_and_recorded(kind, tmp_path, transcode) -> None:
    whole = write_video(tmp_path / "w.mp4", 120, 64, 48, fps=30, gop=10)
    if kind == "mkv":
        mkv = transcode(whole, tmp_path / "src" / "cut.mkv", "libx264", "matroska")
    else:  # moov (with the full duration) in front of the media data
        mkv = transcode(whole, tmp_path / "src" / "cut.mp4", "libx264", "mp4", options={"movflags": "faststart"})
    data = mkv.read_bytes()
    mkv.write_bytes(data[: len(data) // 2])  # a download that stopped halfway; the header still says 4 s
    s = chunk_videos(tmp_path / "src", tmp_path / "dst", chunk_seconds=1.0, fps=30, progress=False)
    assert s.ok == ["cut"] and len(s.truncated) == 1
    src, want, got = s.truncated[0]
    assert src == str(mkv) and want == pytest.approx(4.0, abs=0.05) and got < 3.0
    assert f"TRUNCATED {mkv}: decodes {got:.2f}s of the 4.00s" in str(s)
    decoded = load_manifest(tmp_path / "dst")["cut"].num_frames
    assert got == pytest.approx(decoded / 30, abs=0.01)
    from avion_ds.data.prep.manifest import read_manifest_records

    recs = read_manifest_records(tmp_path / "dst")
    assert all((r["source_expected_s"], r["source_decoded_s"]) == (want, got) for r in recs)
    # a complete source is not flagged
    s2 = chunk_videos(whole, tmp_path / "dst2", chunk_seconds=1.0, fps=30, progress=False)
    assert not s2.truncated and "source_expected_s" not in read_manifest_records(tmp_path / "dst2")[0]


def test_directory_named_like_a_video_is_listed(tmp_path) -> None:
    src = tmp_path / "src"
    write_video(src / "ok.mp4", 10, 32, 32, fps=10)
    (src / "frames.mp4").mkdir()
    (src / "frames.mp4" / "0001.jpg").write_bytes(b"x")
    s = chunk_videos(src, tmp_path / "dst", chunk_seconds=1.0, progress=False)
    assert s.ok == ["ok"] and s.not_videos == [str(src / "frames.mp4")]
    assert f"NOT A VIDEO {src / 'frames.mp4'}: a directory named like a video, skipped" in str(s)


@pytest.mark.parametrize("codec", ["libvpx-vp9", "libvpx"])
def test_webm_sources_are_reencoded_to_h264_with_the_right_frames(codec, tmp_path, index_video, transcode) -> None:
    webm = transcode(index_video, tmp_path / "src" / "12345.webm", codec, "webm")
    s = chunk_videos(webm, tmp_path / "dst", chunk_seconds=2.0, fps=30, gop=8, progress=False)
    assert s.ok == ["12345"] and not s.truncated
    entry = load_manifest(tmp_path / "dst")["12345"]
    assert entry.num_frames == 150
    with av.open(entry.chunks[1].path) as f:
        assert f.streams.video[0].codec_context.name == "h264"
    lst = tmp_path / "l.txt"
    lst.write_text("12345.webm 0\n")
    cfg = DataConfig(
        dataset="kinetics", root=str(tmp_path / "dst"), train_csv=str(lst), val_csv=str(lst), decode_timeout_s=0.0
    )
    ds = build_dataset(cfg, "val")
    got = ds.decoder.decode(entry.chunks[1].path, [0, 5, 59])
    assert [read_frame_index(f) for f in got.numpy()] == [60, 65, 119]
