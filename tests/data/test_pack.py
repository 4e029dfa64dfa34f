"""`avion-ds pack`: a chunk tree as litdata shards; every video once, its chunks byte-identical, in order,
with their manifest facts; a small shard size gives several shards without splitting a video."""

from __future__ import annotations

import hashlib
import json
import multiprocessing
from pathlib import Path

import pytest

pytest.importorskip("litdata")


@pytest.mark.parametrize("workers", ["1", "2"])  # litdata's writer here, or its optimize in 2 processes
def test_pack_keeps_each_video_whole_with_its_facts(tmp_path: Path, workers: str) -> None:
    from litdata import StreamingDataset

    from avion_ds.cli.pack import main
    from avion_ds.data.prep.manifest import MANIFEST_NAME, read_manifest_records
    from tests.helpers.data import tiny_epic_data

    tree = tiny_epic_data(tmp_path, num_videos=3)["root"]
    out = tmp_path / "shards"
    before = multiprocessing.get_start_method(allow_none=True)
    assert main([str(tree), str(out), "--shard-bytes", "20000", "--workers", workers]) == 0
    # litdata's optimize forces "spawn" process-wide; packing puts it back (later DataLoader workers fork)
    assert multiprocessing.get_start_method(allow_none=True) == before
    index = json.loads((out / "index.json").read_text())
    assert len(index["chunks"]) >= 2, index["chunks"]  # the small size split the videos over several shards
    rows = read_manifest_records(tree / MANIFEST_NAME)
    ds = StreamingDataset(str(out), shuffle=False)
    seen = []
    for item in ds:
        vid, chunks = item["video_id"], json.loads(item["meta"])["chunks"]
        seen.append(vid)
        expect = sorted((r for r in rows if r["video_id"] == vid), key=lambda r: r["start_frame"])
        assert [c["path"] for c in chunks] == [r["path"] for r in expect]
        offset = 0
        for c, r in zip(chunks, expect, strict=True):
            blob = item["data"][offset : offset + c["bytes"]]
            offset += c["bytes"]
            assert blob == (tree / r["path"]).read_bytes()
            assert c["sha256"] == hashlib.sha256(blob).hexdigest()
            assert (c["frames"], c["fps"], c["start_frame"]) == (r["frames"], r["fps"], r["start_frame"])
        assert offset == len(item["data"])
    assert sorted(seen) == sorted({r["video_id"] for r in rows})


def test_a_second_pack_in_one_process_reads_the_tree_as_it_is_now(tmp_path: Path) -> None:
    """Packing, changing the tree's manifest (a video re-chunked away), and packing again in the same process:
    the second pack holds the tree as it is then, not the first pack's view of it."""
    from avion_ds.cli.pack import main
    from avion_ds.data.prep.manifest import MANIFEST_NAME
    from tests.helpers.data import tiny_epic_data

    tree = tiny_epic_data(tmp_path, num_videos=3)["root"]
    assert main([str(tree), str(tmp_path / "a")]) == 0
    lines = (tree / MANIFEST_NAME).read_text().splitlines(keepends=True)
    gone = json.loads(lines[0])["video_id"]
    (tree / MANIFEST_NAME).write_text("".join(x for x in lines if json.loads(x)["video_id"] != gone))
    assert main([str(tree), str(tmp_path / "b")]) == 0
    sizes = {d: sum(int(c["chunk_size"]) for c in json.loads((tmp_path / d / "index.json").read_text())["chunks"])
             for d in ("a", "b")}  # fmt: skip
    assert sizes["b"] < sizes["a"], sizes


def test_labels_that_are_not_json_are_one_line_before_anything_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """A dataset whose row labels cannot go into a shard row's JSON (here: a tensor) is refused by `avion-ds
    pack` in one line naming the dataset, split and sample, exit 2, and no shard is written."""
    import torch

    from avion_ds.cli.pack import main
    from avion_ds.data.datasets.epic import EpicDataset
    from tests.helpers.data import tiny_epic_data

    data = tiny_epic_data(tmp_path, num_videos=2)
    monkeypatch.setattr(EpicDataset, "packed_label", lambda self, i: torch.zeros(2), raising=False)
    sets = [f"data.train_csv={data['train_csv']}", f"data.val_csv={data['val_csv']}", "model.heads={verb: 4, noun: 3}"]
    out = tmp_path / "shards"
    assert main([str(data["root"]), str(out), *[x for s in sets for x in ("--set", s)]]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "data.dataset='epic': train sample" in err and "packed_label" in err, err
    assert not list(out.glob("*.bin"))
