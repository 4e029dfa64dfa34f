"""Shard items as windows of a video's chunks: bounded size, one shared chunk between neighbours, every row
in exactly one window that holds all the frames it may read."""

from __future__ import annotations

import itertools
import random

import pytest

from avion_ds.data.prep.pack_windows import chunk_windows, row_chunks


def _video(n: int, frames: int = 30, seed: int = 0) -> tuple[list[int], list[int]]:
    rng = random.Random(seed)
    starts, sizes, at = [], [], 0
    for _ in range(n):
        starts.append(at)
        at += frames
        sizes.append(rng.randint(1, 10))
    return starts, sizes


def _frames_in(starts: list[int], total: int, a: int, b: int) -> range:
    end = starts[b + 1] if b + 1 < len(starts) else total
    return range(starts[a], end)


def test_row_chunks_are_the_chunks_its_frames_touch() -> None:
    starts = [0, 30, 60]
    assert row_chunks(starts, [0, 30]) == (0, 0)  # end exclusive: frame 29 is chunk 0's last
    assert row_chunks(starts, [29, 31]) == (0, 1)
    assert row_chunks(starts, [30, 30]) == (1, 1)  # an empty span reads its start frame
    assert row_chunks(starts, [61, 500]) == (2, 2)  # past the video's end: the last chunk


@pytest.mark.parametrize("seed", range(40))
def test_windows_cover_every_row_once_within_the_limit(seed: int) -> None:
    rng = random.Random(seed)
    n = rng.randint(1, 12)
    starts, sizes = _video(n, seed=seed)
    total = 30 * n
    rows: dict[str, list[list]] = {"train": [], "val": []}
    for k in range(rng.randint(0, 25)):
        start = rng.randrange(total)
        length = rng.choice([1, 5, 30, 45, 90, total])  # inside one chunk, across one or two boundaries, whole
        rows[rng.choice(["train", "val"])].append([start, min(total + 10, start + length), "x", f"r{k}", k])
    limit = rng.choice([1, 8, 15, 40, 1000])
    windows = chunk_windows(starts, sizes, rows, limit)
    assert windows[0][0] == 0 and windows[-1][1] == n - 1
    for (s0, e0, _), (s1, _, _) in itertools.pairwise(windows):
        assert s1 == e0 and e0 > s0  # neighbours share one chunk; every window moves on
    for s, e, mine in windows:
        over = sum(sizes[s : e + 1]) > limit
        needed = any(row_chunks(starts, r)[1] > s + 1 for rs in mine.values() for r in rs)
        assert not over or e <= s + 1 or needed, (s, e, limit)  # over the limit only when two chunks or a row need it
        for rs in mine.values():
            for r in rs:  # every frame the row may read is in the window's chunks
                a, b = row_chunks(starts, r)
                held = _frames_in(starts, total, s, e)
                assert s <= a and b <= e
                assert min(int(r[0]), total - 1) in held and min(max(int(r[0]), int(r[1]) - 1), total - 1) in held
    for split, rs in rows.items():  # each row exactly once, in order within its window
        got = [r for _, _, mine in windows for r in mine[split]]
        assert sorted(map(id, got)) == sorted(map(id, rs)) and len(got) == len(rs)
        for _, _, mine in windows:
            assert mine[split] == [r for r in rs if any(r is m for m in mine[split])]


def test_a_whole_video_row_gets_one_window_and_small_rows_small_windows() -> None:
    starts, sizes = _video(10)
    sizes = [4] * 10
    whole = chunk_windows(starts, sizes, {"train": [[0, 300, 0, "v", 0]]}, limit=8)
    assert [(s, e) for s, e, _ in whole] == [(0, 9)]
    small = chunk_windows(starts, sizes, {"train": [[i * 30 + 3, i * 30 + 20, 0, "r", i] for i in range(10)]}, 8)
    assert [(s, e) for s, e, _ in small] == [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5), (5, 6), (6, 7), (7, 8), (8, 9)]
    assert [len(m["train"]) for _, _, m in small] == [1] * 8 + [2]  # the last window takes its last chunk's rows
    assert chunk_windows([], [], {"train": []}, 8) == []
    assert chunk_windows([0], [100], {"train": [[0, 5, 0, "r", 0]]}, 8) == [(0, 0, {"train": [[0, 5, 0, "r", 0]]})]


def test_windowed_items_give_the_chunk_tree_clips(tmp_path) -> None:
    """Packed with items of two chunks (``--item-bytes 1``), each video is several items, rows spanning a
    chunk boundary included; the shards give the chunk tree's clips and labels, every row once."""
    pytest.importorskip("litdata")
    import json as json_mod

    from avion_ds.cli.pack import main
    from avion_ds.data.prep.chunking import chunk_videos
    from avion_ds.data.prep.synthetic import make_synthetic_epic
    from avion_ds.tasks import load_recipe
    from tests.helpers.recipes import write_recipe
    from tests.helpers.shard_checks import assert_shards_give_tree_clips

    info = make_synthetic_epic(
        tmp_path / "synth", num_videos=2, segments_per_video=8, segment_seconds=1.0, width=64, height=48, fps=12, seed=2
    )
    summary = chunk_videos(
        info["videos"], tmp_path / "chunks", chunk_seconds=1.5, short_side=48, fps=12, progress=False
    )
    assert not summary.failed, summary
    data = {"root": tmp_path / "chunks", "train_csv": info["train_csv"], "val_csv": info["val_csv"]}
    recipe_path = write_recipe(tmp_path / "recipe.yaml", data, tmp_path / "run", data={"decode_timeout_s": 0.0})
    out = tmp_path / "shards"
    assert main([str(data["root"]), str(out), "--item-bytes", "1", "--config", str(recipe_path)]) == 0
    index = json_mod.loads((out / "index.json").read_text())
    items = sum(int(c["chunk_size"]) for c in index["chunks"])
    chunks = sum(1 for _ in (tmp_path / "chunks").rglob("*.mp4"))
    assert items == chunks - 2, (items, chunks)  # windows of two chunks, neighbours sharing one: n - 1 per video
    assert_shards_give_tree_clips(out, load_recipe(recipe_path, []))
