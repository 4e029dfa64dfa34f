"""The flat, memory-mapped annotation index equals the Python-object index it replaces, and its cache
is rebuilt (never trusted) when stale or corrupt, falls back when the data directory is read-only."""

from __future__ import annotations

import errno
import logging
import pickle
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from avion_ds.config import DataConfig
from avion_ds.data import build_dataset
from avion_ds.data import index_cache as ic
from avion_ds.data.crop import clip_rng
from avion_ds.data.datasets import ego4d
from avion_ds.data.datasets.registry import dataset_config
from avion_ds.data.errors import DataError
from avion_ds.data.prep.manifest_index import join_path, load_manifest
from avion_ds.data.sampling import map_to_chunks
from tests.data.test_ego4d import ROWS, write_rows
from tests.helpers.index_oracle import object_dataset, object_manifest, object_narrations, write_scale_inputs


def _span(ds, i: int):
    """sample_span of row i as plain values (or its error message), plus the chunk reads of its draw."""
    try:
        entry, start, end, text = ds.sample_span(i)
        reads = map_to_chunks(ds.clip_indices(start, end, clip_rng(ds.seed, ds.epoch, i, 0), 0), entry)
    except DataError as e:
        return ("error", str(e))
    return (entry.video_id, entry.fps, entry.num_frames, entry.width, entry.height, start, end, text, reads)


def _same_entries(new, old, ids) -> None:
    for v in ids:
        a, b = new[v], old[v]
        assert (a.video_id, a.fps, a.num_frames, a.width, a.height) == (
            b.video_id,
            b.fps,
            b.num_frames,
            b.width,
            b.height,
        )
        assert list(a.chunks) == b.chunks and a.chunks[-1] == b.chunks[-1] and a.chunks[1:3] == b.chunks[1:3]
        for frame in (-5, 0, 449, 450, a.num_frames - 1, a.num_frames + 3):
            assert a.locate(frame) == b.locate(frame) and a.chunk_at(frame + 0.5) == b.chunk_at(frame + 0.5)


@pytest.fixture()
def large(tmp_path_factory) -> tuple[Path, Path]:
    return write_scale_inputs(tmp_path_factory.mktemp("large"), videos=120, rows=20_000, mixed=True)


def test_generated_large_set_gives_identical_sample_span_on_random_rows(large, tmp_path) -> None:
    root, pkl = large
    aux = write_rows(tmp_path / "aux.csv", [(load_manifest(root).ids[0], 1.0, 2.5, "c aux row")])
    cfg = dataset_config("ego4d", root=str(root), train_csv=str(pkl), aux_train=[str(aux)], num_frames=4)
    new = build_dataset(cfg, "train")
    old = object_dataset(new, [pkl, aux])
    assert len(old.table) == len(new.table) and old.table.uids == new.table.uids and old.table.files == new.table.files
    for col in ("src", "line", "vid"):
        assert np.array_equal(getattr(old.table, col), getattr(new.table, col))
    assert np.array_equal(old.table.start, new.table.start, equal_nan=True)
    assert dict(old.table.bad_times).keys() == dict(new.table.bad_times).keys()
    assert list(old.index.videos) == list(new.index.videos)
    _same_entries(new.index.videos, old.index.videos, list(old.index.videos)[:20])
    rows = np.random.default_rng(3).choice(len(new), 10_000, replace=False).tolist()
    errors = 0
    for epoch in (0, 1):
        new.set_epoch(epoch)  # the epoch tensor is shared with the copy: both see it
        for i in rows[:: 1 + 4 * epoch]:
            got, want = _span(new, i), _span(old, i)
            assert got == want, i
            errors += got[0] == "error"
    assert errors > 100  # the bad rows are drawn too, with the same messages
    assert new.sample_span(len(new) - 1)[3] == "c aux row"


def test_synthetic_set_gives_identical_samples(index_chunks, tmp_path) -> None:
    rows = [*ROWS, ("idx", "soon", 2.0, "x"), ("idx", 1.0, 2.0, ["a", ""]), ("missing", 1.0, 2.0, "gone")]
    pkl = write_rows(tmp_path / "train.pkl", rows)
    aux = write_rows(tmp_path / "narrator.jsonl", [("idx", 0.5, 1.5, ["n1", "n2", "n3"]), ("idx", 2.0, 2.2, "n4")])
    cfg = dataset_config("ego4d", root=str(index_chunks), train_csv=str(pkl), val_csv=str(aux), aux_train=[str(aux)])
    cfg = replace(cfg, num_frames=4, size=32, decoder="pyav", decode_timeout_s=0.0, on_error="skip")
    for split, files in (("train", [pkl, aux]), ("val", [aux])):
        new = build_dataset(cfg, split)
        old = object_dataset(new, files)
        assert len(new) == len(old) and new.missing == old.missing
        for epoch in (0, 2):
            new.set_epoch(epoch)
            for i in range(len(new)):
                a, b = new[i], old[i]
                assert torch.equal(a["frames"], b["frames"]) and torch.equal(a["label"]["tokens"], b["label"]["tokens"])
                assert (a["index"], a["skipped"], a["failed_reason"]) == (b["index"], b["skipped"], b["failed_reason"])


def test_manifest_index_equals_the_object_manifest(tmp_path) -> None:
    root = tmp_path / "m"
    root.mkdir()
    lines = [
        '{"video_id": "b", "path": "b/30.mp4", "start_frame": 30, "frames": 30, "fps": 30.0, "width": 8, "height": 6}',
        '{"video_id": "b", "path": "./b//0.mp4", "start_frame": 0, "frames": 29, "fps": 30.0, "width": 8, "height": 6}',
        '{"video_id": "a", "path": "a/0.mp4", "start_frame": 0, "frames": 0, "fps": 25.0, "width": 8, "height": 6}',
        (
            '{"video_id": "c", "path": "/abs/c.mp4", "start_frame": 0, "frames": 9, "fps": 25.0, "width": 8,'
            ' "height": 6, "bytes": 5, "mtime_ns": 7, "job": 2}'
        ),
        (
            '{"video_id": "c", "path": "c/old.mp4", "start_frame": 0, "frames": 9, "fps": 25.0, "width": 8,'
            ' "height": 6, "job": 1}'
        ),
        '{"video_id": "b", "path": "b/30b.mp4", "start_frame": 30, "frames": 28, "fps": 30.0, "width": 8, "hei',
    ]
    (root / "manifest.jsonl").write_text("\n".join(lines) + "\n")
    for where in (root, root / "manifest.jsonl", Path(str(root) + "/")):
        new, old = load_manifest(where), object_manifest(where)
        assert list(new) == list(old) == ["b", "c"] and len(new) == 2 and "a" not in new
        _same_entries(new, old, old)
    for base in (".", "/", "/d", "d/e"):
        for rel in ("x.mp4", "a/b.mp4", "/abs/y.mp4", "//two", "."):
            assert join_path(base, str(Path(rel))) == str(Path(base) / rel)


def test_cache_is_reused_and_rebuilt_when_stale_or_corrupt(large, caplog, monkeypatch) -> None:
    pkl = large[1]
    first = ego4d.read_narration_files([pkl])
    ego4d._read_cached.cache_clear()
    beside, _ = ic.index_paths("narrations", [pkl])
    assert beside.parent == pkl.parent and beside.read_bytes()[:8] == ic.MAGIC
    builds = []
    real = ic.write_index
    monkeypatch.setattr(ic, "write_index", lambda *a: builds.append(a[0]) or real(*a))
    again = ego4d.read_narration_files([pkl])  # mapped from the cache, not rebuilt
    assert builds == [] and again.text[5] == first.text[5] and isinstance(again.start.base, (np.ndarray, memoryview))
    data = bytearray(beside.read_bytes())
    data[-100] ^= 0xFF
    beside.write_bytes(bytes(data))
    for damage in ("flip", "truncate", "touch"):
        if damage == "truncate":
            beside.write_bytes(beside.read_bytes()[:-64])
        if damage == "touch":
            pkl.write_bytes(pickle.dumps(pickle.loads(pkl.read_bytes())[:100]))
        ego4d._read_cached.cache_clear()
        with caplog.at_level(logging.INFO, logger="avion_ds.data.index_cache"):
            table = ego4d.read_narration_files([pkl])
        want = {"flip": "data checksum", "truncate": "size", "touch": "stale"}[damage]
        assert want in caplog.text and len(builds) == 1 + ["flip", "truncate", "touch"].index(damage)
        assert list(map(repr, table.text[:100])) == list(map(repr, object_narrations([pkl]).text[:100]))
        caplog.clear()
    assert len(table) == 100


def test_read_only_data_dir_falls_back_to_the_user_cache(large, tmp_path, monkeypatch, caplog) -> None:
    root, _ = large
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    real = ic._Lock.__init__

    def refuse(self, path: Path) -> None:
        if path.parent == root:
            raise PermissionError(errno.EROFS, "Read-only file system", str(path))
        real(self, path)

    monkeypatch.setattr(ic._Lock, "__init__", refuse)
    monkeypatch.setattr(ic.os, "access", lambda p, mode: Path(p) != root)
    with caplog.at_level(logging.WARNING):
        videos = load_manifest(root)
    assert f"{root} is not writable: caching the chunks index in {tmp_path / 'xdg'}" in caplog.text
    assert videos.index.path.parent == tmp_path / "xdg" / "avion_ds" / "index"
    assert list(load_manifest(root)) == list(object_manifest(root))  # found in the fallback next time


def test_index_survives_pickling_and_holds_no_objects(large) -> None:
    root, pkl = large
    videos = load_manifest(root)
    copy = pickle.loads(pickle.dumps(videos))
    assert len(pickle.dumps(videos)) < 10_000 + 200 * len(videos)  # the path and the ids, not the arrays
    _same_entries(copy, videos, list(videos)[:5])
    table = ego4d.read_narration_files([pkl])
    assert len(pickle.dumps(table)) < 10_000
    back = pickle.loads(pickle.dumps(table))
    assert list(map(repr, back.text)) == list(map(repr, table.text)) and np.array_equal(back.vid, table.vid)
    assert all(a.dtype != object for a in videos.index.arrays.values())
    assert isinstance(table.text, ego4d.Sequence) and not isinstance(table.text, list)
    with pytest.raises(TypeError, match="numbers only"):
        ic.write_index(root / "x.index", "t", [], {"o": np.array([None], object)}, {})


def test_bad_input_is_named_in_one_line_and_never_cached(tmp_path, caplog) -> None:
    bad = tmp_path / "bad.pkl"
    bad.write_bytes(pickle.dumps([("v", 1.0, 2.0, "ok"), ("v", 1.0)]))
    with caplog.at_level(logging.INFO), pytest.raises(ValueError, match=r"bad.pkl:2: expected a tuple"):
        ego4d.read_narration_files([bad])
    assert not list(tmp_path.glob("*.index")) and "not writable" not in caplog.text
    (tmp_path / "manifest.jsonl").write_text('{"video_id": "v", "path": "v/0.mp4", "start_frame": 0, "frames": 3}\n')
    with pytest.raises(ValueError, match=r"manifest.jsonl: bad manifest record for video 'v': 'fps'"):
        load_manifest(tmp_path)
    assert not list(tmp_path.glob("*.index"))


def test_plain_string_rows_take_the_direct_path_and_agree(tmp_path) -> None:
    root, pkl = write_scale_inputs(tmp_path, videos=12, rows=3_000)
    new = build_dataset(DataConfig(dataset="ego4d", root=str(root), train_csv=str(pkl), num_frames=4), "train")
    old = object_dataset(new, [pkl])
    assert new.table.text.one_string_each
    assert [_span(new, i) for i in range(len(new))] == [_span(old, i) for i in range(len(old))]


@pytest.mark.parametrize("first_list_at", [0, 1, 2500, None])
def test_spilled_text_and_mixed_rows_read_as_the_objects(tmp_path, monkeypatch, first_list_at) -> None:
    """The cached build spills its text buffer to a temporary file (here every ~1 KiB) and records row
    string starts only from the first row that is not one plain string: the index file is byte-identical
    to the in-memory build's, and the rows read back as the object oracle's (lists, unreadable values)."""
    from avion_ds.data.datasets.flat_index import build_narration_arrays

    monkeypatch.setattr(ic, "_SPILL_BYTES", 1000)
    rows = [("v", float(k), k + 1.0, f"#C C does thing {k}") for k in range(3000)]
    if first_list_at is not None:
        rows[first_list_at] = ("v", 0.0, 1.0, ["c a", "c b"])
        rows[2900] = ("w", 1.0, 2.0, {"not": "text"})  # read back as Unreadable
    pkl = write_rows(tmp_path / "mixed.pkl", rows)
    table = ego4d.read_narration_files([pkl])
    assert list(map(repr, table.text)) == list(map(repr, object_narrations([pkl]).text))
    assert table.text.one_string_each == (first_list_at is None)
    files = {}
    for spill in (False, True):
        arrays, meta = build_narration_arrays([pkl], ego4d._file_rows, spill=spill)
        assert isinstance(arrays["text_buf"], ic.SpilledBytes) == spill
        ic.write_index(tmp_path / f"{spill}.index", "narrations/t", [], arrays, meta)
        files[spill] = (tmp_path / f"{spill}.index").read_bytes()
    assert files[True] == files[False]


def test_no_writable_place_keeps_the_spilled_index_in_memory(tmp_path, monkeypatch, caplog) -> None:
    monkeypatch.setattr(ic, "_SPILL_BYTES", 1000)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))

    def refuse(self, path: Path) -> None:
        raise PermissionError(errno.EROFS, "Read-only file system", str(path))

    monkeypatch.setattr(ic._Lock, "__init__", refuse)
    monkeypatch.setattr(ic.os, "access", lambda p, mode: False)
    rows = [("v", float(k), k + 1.0, f"#C C does thing {k}") for k in range(2000)]
    pkl = write_rows(tmp_path / "ro.pkl", rows)
    with caplog.at_level(logging.WARNING):
        table = ego4d.read_narration_files([pkl])
    assert "keeping it in memory for this run" in caplog.text and table.index.path is None
    assert isinstance(table.index.arrays["text_buf"], np.ndarray)
    assert list(table.text) == [r[3] for r in rows]
