"""The streamed cold build of the annotation indexes gives exactly what reading every record as a Python
object gives (the manifest's dict records + ``dedupe_records``, the narration pickle's row tuples), holds
far less while it runs, and names bad input in the same one line."""

from __future__ import annotations

import json
import pickle
import random
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from avion_ds.data import index_cache as ic
from avion_ds.data.datasets import ego4d
from avion_ds.data.datasets.flat_index import build_narration_arrays
from avion_ds.data.prep import manifest_index as mi
from avion_ds.data.prep.manifest_index import load_manifest
from avion_ds.data.safe_pickle import load_pickle
from tests.helpers.index_oracle import object_manifest, write_scale_inputs

ODD_PATHS = ["./a//b.mp4", "a/./b.mp4", "/abs/c.mp4", "//two.mp4", "", ".", "d/", "x/.", "a/../b.mp4", "é/ü.mp4"]
ODD_PATHS += ["\ud800/lone.mp4", ".hidden/x.mp4", "a/.b/c.mp4", "..", "///three", "a.", "./", "/", "a//"]


def _same(got: tuple, want: tuple) -> None:
    assert got[1] == want[1] and list(got[0]) == list(want[0])
    for name, a in got[0].items():
        b = want[0][name]
        assert a.dtype == b.dtype and a.shape == b.shape, name
        assert np.array_equal(a, b, equal_nan=a.dtype.kind == "f"), name


def _record(rng: random.Random, video: str, start: int, job: int | None) -> dict:
    r = {"video_id": video, "path": f"{video}/{start}.mp4", "start_frame": start, "frames": rng.choice([0, 29, 30])}
    r.update(fps=rng.choice([25.0, 30.0]), width=rng.choice([8, 16]), height=6)
    if rng.random() < 0.7:
        r.update(bytes=rng.randrange(1, 99), mtime_ns=rng.randrange(1, 99))
    if job is not None:
        r["job"] = job
    if rng.random() < 0.15:
        r["path"] = rng.choice(ODD_PATHS)
    return r


def _random_manifest(path: Path, seed: int) -> None:
    """Videos with interleaved old and new jobs (some negative, some absent), repeated start frames, frames
    == 0 chunks, odd paths, torn lines (anywhere), blank lines, lines out of order."""
    rng = random.Random(seed)
    lines = []
    for v in range(rng.randrange(1, 7)):
        video = f"v{v}" if v % 3 else f"ü {v}"
        jobs = rng.choice([[None], [1, 2], [0, 5, 3], [-4, -2], [None, 7]])
        for _ in range(rng.randrange(1, 12)):
            lines.append(json.dumps(_record(rng, video, 30 * rng.randrange(4), rng.choice(jobs))))
    rng.shuffle(lines)
    for _ in range(rng.randrange(3)):
        k = rng.randrange(len(lines) + 1)
        lines.insert(k, rng.choice(['{"video_id": "v1", "path": "v1/0.mp4", "sta', "", "   ", "{]"]))
    path.write_text("\n".join(lines) + ("\n" if rng.random() < 0.5 else ""))


def test_streamed_manifest_equals_the_dict_records_on_random_edge_cases(tmp_path) -> None:
    mpath = tmp_path / "manifest.jsonl"
    for seed in range(300):
        _random_manifest(mpath, seed)
        got = mi._column_arrays(mpath)
        assert got is not None, seed  # plain records: never the dict reading
        _same(got, mi._record_arrays(mpath))
    rows = [
        {"video_id": "b", "path": "b/30.mp4", "start_frame": 30, "frames": 0, "fps": 30.0, "width": 8, "height": 6},
        {"video_id": "a", "path": "a/0.mp4", "start_frame": 0, "frames": 9, "fps": 30.0, "width": 8, "height": 6},
        {"video_id": "b", "path": "b/0.mp4", "start_frame": 0, "frames": 9, "fps": 30.0, "width": 4, "height": 6},
        {"video_id": "b", "path": "b/30x.mp4", "start_frame": 30, "frames": 8, "fps": 30.0, "width": 8, "height": 6},
    ]
    mpath.write_text("".join(json.dumps(r) + "\n" for r in rows))
    for where in (tmp_path, mpath):  # b's 30 is first seen before a, its last record is the one kept
        new, old = load_manifest(where), object_manifest(where)
        assert list(new) == list(old) == ["b", "a"]
        assert [list(new[v].chunks) for v in new] == [old[v].chunks for v in old]
        assert new["b"].width == old["b"].width == 4


def test_plain_paths_are_kept_as_path_would_write_them() -> None:
    rng = random.Random(0)
    cases = ODD_PATHS + ["".join(rng.choice("a./") for _ in range(rng.randrange(7))) for _ in range(3000)]
    for raw in cases:
        assert mi._norm(raw) == str(Path(raw)), raw


@pytest.mark.parametrize(
    ("extra", "bad"),
    [
        ({"video_id": 5}, False),  # numbers as ids: the dict reading's own keys
        ({"video_id": True}, False),
        ({"path": 7}, True),  # a path that is not a string
        ({"start_frame": "30"}, False),
        ({"start_frame": 30.7}, False),
        ({"job": "2"}, False),
        ({"job": 2**70}, False),
        ({"fps": "fast"}, True),
        ({"width": None}, True),
        ({"bytes": 2**70}, False),
    ],
)
def test_records_the_columns_cannot_hold_are_read_as_dicts(tmp_path, extra, bad) -> None:
    mpath = tmp_path / "manifest.jsonl"
    base = {"video_id": "v", "path": "v/0.mp4", "start_frame": 0, "frames": 3, "fps": 30.0, "width": 8, "height": 6}
    lines = [json.dumps(base), json.dumps({**base, "start_frame": 30, **extra}), "[1, 2]"[: 0 if bad else 6]]
    mpath.write_text("\n".join(lines) + "\n")
    assert mi._column_arrays(mpath) is None
    try:
        want = mi._record_arrays(mpath)
    except Exception as e:  # noqa: BLE001 - the exact error the dict reading gives, whatever it is
        with pytest.raises(type(e)) as got:
            mi.build_manifest_arrays(mpath)
        assert str(got.value) == str(e)
        return
    _same(mi.build_manifest_arrays(mpath), want)


def test_a_bad_record_of_an_older_job_does_not_fail_the_build(tmp_path) -> None:
    mpath = tmp_path / "manifest.jsonl"
    good = {"video_id": "v", "path": "v/0.mp4", "start_frame": 0, "frames": 3, "fps": 30.0, "width": 8, "height": 6}
    mpath.write_text(json.dumps({"video_id": "v", "path": "v/0.mp4", "job": 1}) + "\n" + json.dumps({**good, "job": 2}))
    _same(mi.build_manifest_arrays(mpath), mi._record_arrays(mpath))
    assert len(mi.build_manifest_arrays(mpath)[0]["fps"]) == 1


def _peak(fn) -> int:
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def _held(path):
    """A narration file's rows all held in a list (the reading the streamed build replaces)."""
    return list(ego4d._file_rows(path))


def test_cold_builds_hold_a_fraction_of_the_objects(tmp_path) -> None:
    root, pkl = write_scale_inputs(tmp_path, videos=400, rows=20_000)
    mpath = root / "manifest.jsonl"
    assert _peak(lambda: mi.build_manifest_arrays(mpath)) * 4 < _peak(lambda: mi._record_arrays(mpath))
    listed = _peak(lambda: load_pickle(pkl))
    assert _peak(lambda: build_narration_arrays([pkl], ego4d._file_rows)) < 1.25 * listed
    assert _peak(lambda: build_narration_arrays([pkl], _held)) > 1.25 * listed


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ([("v", 0.0, 1.0, "a"), ("v", 0.0, 1.0, "b"), ("v", 1.0)], r"x.pkl:3: expected a tuple"),
        ({"v": 1}, r"x.pkl: expected a list of \(video_uid"),
        ([], r"x.pkl: no narration rows"),
    ],
)
def test_bad_pickles_are_named_as_before_any_row_is_kept(tmp_path, content, message) -> None:
    pkl = tmp_path / "x.pkl"
    pkl.write_bytes(pickle.dumps(content))
    with pytest.raises(ValueError, match=message):
        build_narration_arrays([pkl], ego4d._file_rows)
    with pytest.raises(ValueError, match=message):
        build_narration_arrays([pkl], _held)


def test_tuple_pickles_and_several_files_stream_as_lists(tmp_path) -> None:
    rows = [("v", 0.0, 1.0, "a"), ("w", "x", 2.0, ["b", "c"]), ("v", 1.0, 2.0, None, "extra")]
    one, two = tmp_path / "one.pkl", tmp_path / "two.pkl"
    one.write_bytes(pickle.dumps(tuple(rows)))
    two.write_bytes(pickle.dumps(rows[::-1]))
    assert list(ego4d._pickle_rows(one)) == [(n, *r[:4]) for n, r in enumerate(rows, 1)]
    got = build_narration_arrays([one, two], ego4d._file_rows)
    _same(got, build_narration_arrays([one, two], _held))
    assert got[0]["src"].tolist() == [0, 0, 0, 1, 1, 1] and got[1] == {"one_string_each": False}


def test_string_packing_and_gathering() -> None:
    rng = random.Random(1)
    strings = ["", "a", "é", "\ud800x", "ab" * 40] + [
        "".join(rng.choice("xyzé") for _ in range(rng.randrange(5))) for _ in range(200)
    ]
    buf, off = ic.pack_strings(strings)
    encoded = [s.encode("utf-8", "surrogatepass") for s in strings]
    assert buf.tobytes() == b"".join(encoded) and off.tolist() == np.cumsum([0, *map(len, encoded)]).tolist()
    assert ic.Strings(buf, off).tolist() == strings
    rows = np.array([rng.randrange(len(strings)) for _ in range(300)])
    for block in (1, 7, 1 << 16):
        got = ic.take_strings(buf, off, rows, block)
        assert ic.Strings(*got).tolist() == [strings[k] for k in rows]
    empty = ic.take_strings(buf, off, np.empty(0, np.int64))
    assert empty[0].shape == (0,) and empty[1].tolist() == [0]
