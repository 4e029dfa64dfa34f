"""`avion-ds chunk --index-only`: AVION's chunk trees (EPIC and Ego4D layouts) indexed without re-encoding."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import av
import pytest

from avion_ds.cli import chunk as chunk_cli
from avion_ds.config import DataConfig
from avion_ds.data.datasets.build import build_dataset
from avion_ds.data.datasets.video_index import VideoIndex
from avion_ds.data.errors import DataError
from avion_ds.data.prep import chunking
from avion_ds.data.prep.index_tree import index_tree, probe_chunk
from avion_ds.data.prep.manifest import read_manifest_records
from avion_ds.data.prep.manifest_index import load_manifest
from avion_ds.data.prep.synthetic import EPIC_COLUMNS, format_timestamp, read_frame_index, write_video

FPS, CHUNK_S, W, H = 10, 2, 32, 32
UID = "000786a7-3f9d-4fe6-bfb3-045b368f7d44"
# layout -> {video directory (relative to the tree): total frames}; chunks of CHUNK_S seconds named by start second
LAYOUTS = {
    "epic": {"P01/P01_01.MP4": 53, "P02/P02_03.MP4": 15, "P02/P02_04.MP4": 25},
    "ego4d": {f"{UID}.mp4": 45, "0a1b2c3d-0000-4000-8000-000000000000.mp4": 20},
}


def n_chunks(layout: str) -> int:
    return sum(-(-total // (FPS * CHUNK_S)) for total in LAYOUTS[layout].values())


def make_tree(root: Path, layout: str) -> Path:
    """AVION's layout: ``<video dir>/<start_second>.<ext>``, frames barcoded with the VIDEO's frame numbers."""
    per = FPS * CHUNK_S
    for rel, total in LAYOUTS[layout].items():
        ext = Path(rel).suffix
        for start in range(0, total, per):
            write_video(root / rel / f"{start // FPS}{ext}", min(per, total - start), W, H, fps=FPS, first_index=start)
    return root


@pytest.fixture(scope="module", params=sorted(LAYOUTS))
def tree(request, tmp_path_factory) -> tuple[str, Path]:
    return request.param, make_tree(tmp_path_factory.mktemp(request.param) / "chunks", request.param)


def _epic_csv(path: Path, rows: list[tuple[str, float, float]]) -> Path:
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(EPIC_COLUMNS))
        w.writeheader()
        for n, (vid, start, stop) in enumerate(rows):
            w.writerow(
                {
                    **dict.fromkeys(EPIC_COLUMNS, ""),
                    "narration_id": f"{vid}_{n}",
                    "video_id": vid,
                    "start_timestamp": format_timestamp(start),
                    "stop_timestamp": format_timestamp(stop),
                    "verb_class": 0,
                    "noun_class": 0,
                }
            )
    return path


def _dataset(root: Path, csv_path: Path):
    cfg = DataConfig(
        dataset="epic",
        root=str(root),
        train_csv=str(csv_path),
        val_csv=str(csv_path),
        num_frames=8,
        size=32,
        decoder="pyav",
        decode_timeout_s=0.0,
        on_error="raise",
    )
    return build_dataset(cfg, "val")


def test_index_reads_the_right_frames(tree, tmp_path) -> None:
    layout, root = tree
    s = index_tree(root, progress=False)
    assert not s.failed and s.chunks == n_chunks(layout) and s.chunk_seconds == CHUNK_S
    assert s.counted == {"header": s.chunks}  # MP4: the sample table's count, verified by the last packets
    recs = read_manifest_records(root)
    for r in recs:  # the header count is what decodes
        with av.open(str(root / r["path"])) as c:
            assert r["frames"] == sum(1 for _ in c.decode(video=0))
        assert r["start_frame"] == int(r["start"] * FPS) and r["fps"] == FPS
        assert r["bytes"] == (root / r["path"]).stat().st_size and r["counted"] == "header"
    vids = {Path(rel).stem: total for rel, total in LAYOUTS[layout].items()}
    index = VideoIndex(root, chunked=True)
    for vid, total in vids.items():
        assert index.by_id(vid).num_frames == total and index.by_id(vid).fps == FPS
    first = next(iter(vids))  # 53 or 45 frames: chunks [0, 20), [20, 40), [40, ...)
    rows = [(first, 1.5, 2.6), (first, 3.2, 4.4), (first, 0.0, 0.9)]  # the first two span two chunks
    ds = _dataset(root, _epic_csv(tmp_path / "val.csv", rows))
    crossed = 0
    for i in range(len(rows)):
        entry, start, end, _ = ds.sample_span(i)
        idx = ds.clip_indices(start, end, None, 0)
        frames = ds.read_clip(entry, idx, None)  # whole frames, as decoded
        assert [read_frame_index(f) for f in frames.numpy()] == idx
        crossed += len({j // (FPS * CHUNK_S) for j in idx}) > 1
    assert crossed == 2
    assert ds[0]["frames"].shape == (8, 32, 32, 3)


def test_rerun_reuses_counts_and_cli(tree, tmp_path, capsys) -> None:
    layout, src = tree
    root = tmp_path / "copy"
    shutil.copytree(src, root)
    assert chunk_cli.main(["--index-only", str(root), "--no-progress"]) == 0
    first = {(r["path"], r["frames"], r["start_frame"]) for r in read_manifest_records(root)}
    s = index_tree(root, progress=False)
    assert s.reused == s.chunks == n_chunks(layout)  # nothing probed again
    assert {(r["path"], r["frames"], r["start_frame"]) for r in read_manifest_records(root)} == first
    # a rewritten chunk (new size and mtime) is probed again, the rest reused
    path, frames, start = min(first)
    write_video(root / path, frames, W, H, fps=FPS, gop=2, first_index=start)
    s = index_tree(root, progress=False)
    assert s.reused == s.chunks - 1
    assert {(r["path"], r["frames"], r["start_frame"]) for r in read_manifest_records(root)} == first
    # elsewhere (and in worker processes): paths relative to DST still resolve
    assert chunk_cli.main(["--index-only", str(root), str(tmp_path / "out"), "--no-progress", "--workers", "2"]) == 0
    assert sum(e.num_frames for e in load_manifest(tmp_path / "out").values()) == sum(LAYOUTS[layout].values())
    assert f"indexed {len(LAYOUTS[layout])} videos, {n_chunks(layout)} chunks" in capsys.readouterr().out
    # the chunk length in the names must match --chunk-seconds when given
    assert chunk_cli.main(["--index-only", str(root), "--chunk-seconds", "15", "--no-progress"]) == 1
    assert "chunk starts are not every 15 s from 0: 0 is followed by 2" in capsys.readouterr().out


def test_corrupt_chunk_is_named_counted_and_left_out(tmp_path, capsys) -> None:
    root = make_tree(tmp_path / "chunks", "epic")
    bad = root / "P01/P01_01.MP4/2.MP4"
    bad.write_bytes(b"\x00" * 300)
    assert chunk_cli.main(["--index-only", str(root), "--no-progress"]) == 1
    out = capsys.readouterr()
    assert out.out.count(str(bad)) == 1 and f"UNREADABLE {bad}: cannot open as video" in out.out
    assert "unreadable chunks 1," in out.out
    assert (root / chunking.FAILURES_NAME).read_text() == f"{bad}\t{out.out.split(f'UNREADABLE {bad}: ')[1]}"
    entry = load_manifest(root)["P01_01"]
    assert [c.start_frame for c in entry.chunks] == [0, 40] and entry.num_frames == 53  # a gap at [20, 40)
    rows = [("P01_01", 0.2, 1.8), ("P01_01", 4.2, 5.2), ("P01_01", 2.5, 3.5)]
    ds = _dataset(root, _epic_csv(tmp_path / "val.csv", rows))
    for i in (0, 1):  # clips outside the missing chunk read their frames
        entry, start, end, _ = ds.sample_span(i)
        idx = ds.clip_indices(start, end, None, 0)
        assert [read_frame_index(f) for f in ds.read_clip(entry, idx, None).numpy()] == idx
    with pytest.raises(DataError, match="past the last decodable frame"):  # a clip in the missing chunk
        ds[2]
    # an unreadable FIRST chunk leaves its video out (earlier frames would map to no chunk)
    first = root / "P02/P02_04.MP4/0.MP4"
    first.write_bytes(b"")
    s = index_tree(root, progress=False)
    assert s.bad_chunks == [(str(bad), s.bad_chunks[0][1]), (str(first), "zero-byte file")]
    assert s.bad_dirs == [(str(first.parent), "its first chunk 0.MP4 is unreadable")]
    assert set(load_manifest(root)) == {"P01_01", "P02_03"}


def test_truncated_or_headerless_chunks_are_decoded(tmp_path, transcode) -> None:
    """An MP4 whose data ends early, or whose edit list hides frames, fails the last-packet check: it is decoded
    and counted (unreadable when decoding fails); a container without a frame count in its header (MKV) too."""
    src = write_video(tmp_path / "a.mp4", 30, W, H, fps=FPS, gop=5)
    assert probe_chunk(src).counted == "header" and probe_chunk(src, decode=True).counted == "decoded"
    fast = transcode(src, tmp_path / "fast.mp4", "libx264", "mp4", options={"movflags": "faststart"})
    assert probe_chunk(fast).frames == 30
    data = fast.read_bytes()
    cut = tmp_path / "cut.mp4"
    cut.write_bytes(data[: len(data) * 9 // 10])  # header intact (30 frames), the last frames' data gone
    short = probe_chunk(cut)
    assert short.counted == "decoded" and 0 < short.frames < 30  # what decodes, not the header's 30
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="decode error after"):
        probe_chunk(cut)
    # an edit list hiding the first 3 frames (a stream-copied cut): the header lists 30 samples, 27 decode
    edited = tmp_path / "edit.mp4"
    with av.open(str(src)) as inp, av.open(str(edited), "w", format="mp4") as out:
        s_in = inp.streams.video[0]
        s_out = out.add_stream_from_template(s_in)
        shift = 3 * int(1 / FPS / s_in.time_base)
        for p in inp.demux(s_in):
            if p.dts is not None:
                p.pts, p.dts, p.stream = p.pts - shift, p.dts - shift, s_out
                out.mux(p)
    with av.open(str(edited)) as c:
        assert c.streams.video[0].frames == 30
    got = probe_chunk(edited)
    assert (got.frames, got.counted) == (27, "decoded")
    mkv = probe_chunk(transcode(src, tmp_path / "a.mkv", "libx264", "matroska"))
    assert (mkv.frames, mkv.counted) == (30, "decoded")


def test_gaps_and_empty_trees(tmp_path, capsys) -> None:
    root = make_tree(tmp_path / "chunks", "epic")
    gap = root / "P01/P01_01.MP4"
    (gap / "2.MP4").unlink()
    s = index_tree(root, progress=False)
    why = "chunk starts are not every 2 s from 0: 0 is followed by 4 (a gap, a missing chunk, or another chunk length)"
    assert s.bad_dirs == [(str(gap), why)] and "LEFT OUT" in str(s)
    assert set(load_manifest(root)) == {"P02_03", "P02_04"}
    # a gap the names cannot show (the only multi-chunk video): its first chunk is short of its slot
    alone = tmp_path / "alone"
    shutil.copytree(gap, alone / "P01_01.MP4")
    s = index_tree(alone, progress=False)
    assert s.chunk_seconds == 4 and s.short == [(str(alone / "P01_01.MP4" / "0.MP4"), 20, 40)]
    assert "SHORT" in str(s) and not s.failed
    (tmp_path / "flat").mkdir()
    write_video(tmp_path / "flat" / "x.mp4", 4, W, H)
    assert chunk_cli.main(["--index-only", str(tmp_path / "flat"), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no chunk directories" in err and "1 whole video files" in err
    assert chunk_cli.main([str(tmp_path / "flat")]) == 2  # without --index-only, DST is required
    capsys.readouterr()
    # a DST holding a re-encoding run's manifest is not overwritten
    (tmp_path / "enc").mkdir()
    (tmp_path / "enc" / "manifest.jsonl").write_text(json.dumps({"video_id": "v", "start_frame": 0}) + "\n")
    assert chunk_cli.main(["--index-only", str(root), str(tmp_path / "enc"), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "written by a re-encoding `avion-ds chunk` run (video 'v')" in err
