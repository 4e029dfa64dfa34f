"""The spooling shard writer (``avion_ds.data.prep.shard_writer``): the same files as litdata's own writer, byte
for byte (chunk files, their names, ``index.json``), read back by litdata, and at most one item in memory while
litdata's writer holds a shard."""

from __future__ import annotations

import inspect
import json
import os
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("litdata")

KiB, MiB = 1 << 10, 1 << 20


def _items(sizes: list[int]) -> list[dict[str, Any]]:
    """pack's item shape: a video id, a JSON meta (non-ASCII text: litdata counts its characters, not bytes,
    toward the shard size) and the data bytes."""
    out = []
    for k, size in enumerate(sizes):
        meta = json.dumps({"k": k, "rows": list(range(k % 7)), "text": "é" * (k % 5)}, ensure_ascii=False)
        out.append({"video_id": f"v{k // 3}", "meta": meta, "data": bytes([k % 251]) * size})
    return out


def _write(writer_cls: type, out: Path, items: list[dict], **size: int) -> Path:
    out.mkdir()
    writer = writer_cls(str(out), **size)
    for k, item in enumerate(items):
        writer.add_item(k, item)
    writer.done()
    writer.merge(1)
    return out


def _files(out: Path) -> dict[str, Any]:
    """Every file under ``out`` (names and bytes; ``index.json`` parsed, without the time it was written)."""
    files: dict[str, Any] = {}
    for path in sorted(out.rglob("*")):
        name = str(path.relative_to(out))
        if path.name == "index.json":
            index = json.loads(path.read_text())
            assert index.pop("updated_at")  # the one field that differs: when it was written
            files[name] = index
        else:
            files[name] = path.read_bytes() if path.is_file() else "dir"
    return files


SIZES = [3 * KiB, 700, 9 * KiB, 40, 2 * KiB, 2 * KiB, 20 * KiB, 1, 5 * KiB, 5 * KiB, 30 * KiB, 64, 4 * KiB]


@pytest.mark.filterwarnings("ignore:An item was larger than the target chunk size")
@pytest.mark.parametrize(
    "size",
    [
        {"chunk_bytes": 1 * KiB},  # every item larger than a shard
        {"chunk_bytes": 8 * KiB},  # some larger, some several to a shard
        {"chunk_bytes": 10 * KiB + 70},
        {"chunk_bytes": 24 * KiB},  # several shards, the last partial
        {"chunk_bytes": 1 * MiB},  # one partial shard
        {"chunk_size": 4},  # items per shard instead of bytes
        {"chunk_bytes": "first 4"},  # the 4 first items to the byte as litdata counts them (not serialized)
    ],
)
def test_same_files_as_litdata_writer(tmp_path: Path, size: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    from litdata.streaming import item_loader
    from litdata.streaming.writer import BinaryWriter

    from avion_ds.data.prep.shard_writer import SpoolingWriter

    # litdata's pytree chunks: with pyarrow installed its writer would add an Arrow footer to these rows
    monkeypatch.setattr(item_loader, "_PYARROW_AVAILABLE", False)
    items = _items(SIZES)
    if size.get("chunk_bytes") == "first 4":  # litdata counts a row's leaves: characters of str, bytes of bytes
        size = {"chunk_bytes": sum(len(i["video_id"]) + len(i["meta"]) + len(i["data"]) for i in items[:4])}
    ours = _files(_write(SpoolingWriter, tmp_path / "ours", items, **size))
    theirs = _files(_write(BinaryWriter, tmp_path / "theirs", items, **size))
    assert ours.keys() == theirs.keys()
    for name in theirs:
        assert ours[name] == theirs[name], name
    chunks = theirs["index.json"]["chunks"]
    assert sum(c["chunk_size"] for c in chunks) == len(items)
    if "chunk_bytes" in size and size["chunk_bytes"] < MiB:
        assert len(chunks) > 2, chunks
    if size.get("chunk_bytes") == sum(len(i["video_id"]) + len(i["meta"]) + len(i["data"]) for i in items[:4]):
        assert chunks[0]["chunk_size"] == 4, chunks


def test_item_left_over_at_a_boundary_counts_as_litdata_counts_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The item that crossed a shard's size starts the next shard and is counted again there, by litdata's rule
    (a row's leaves: characters of str), not by its serialized size: shards of exactly items 1 and 2 stay one."""
    from litdata.streaming import item_loader
    from litdata.streaming.writer import BinaryWriter

    from avion_ds.data.prep.shard_writer import SpoolingWriter

    monkeypatch.setattr(item_loader, "_PYARROW_AVAILABLE", False)
    items = _items([1500, 1000, 1000, 1000, 1000])
    counted = [len(i["video_id"]) + len(i["meta"]) + len(i["data"]) for i in items]
    size = {"chunk_bytes": counted[1] + counted[2]}
    ours = _files(_write(SpoolingWriter, tmp_path / "ours", items, **size))
    theirs = _files(_write(BinaryWriter, tmp_path / "theirs", items, **size))
    assert [c["chunk_size"] for c in theirs["index.json"]["chunks"]][:2] == [1, 2]
    assert ours == theirs


@pytest.mark.filterwarnings("ignore:An item was larger than the target chunk size")
def test_read_back_by_litdata_and_spool_removed(tmp_path: Path) -> None:
    from litdata import StreamingDataset

    from avion_ds.data.prep.shard_writer import SpoolingWriter

    items = _items(SIZES)
    out = _write(SpoolingWriter, tmp_path / "shards", items, chunk_bytes=16 * KiB)
    names = sorted(os.listdir(out))  # the spool is gone
    assert names == sorted(["index.json", *(f"chunk-0-{k}.bin" for k in range(len(names) - 1))]), names
    got = list(StreamingDataset(str(out), shuffle=False))
    assert [g["meta"] for g in got] == [i["meta"] for i in items]
    assert [bytes(g["data"]) for g in got] == [i["data"] for i in items]
    assert [g["video_id"] for g in got] == [i["video_id"] for i in items]


def _held(writer: Any) -> int:
    """Item bytes the writer holds in memory: serialized items and the inputs kept with them."""
    held = 0
    for item in writer._serialized_items.values():
        held += len(item.data) if isinstance(item.data, bytes | bytearray | memoryview) else 0
        held += len(item.sample["data"]) if isinstance(item.sample, dict) else 0
    return held


@pytest.mark.parametrize("which", ["spooling", "litdata"])
def test_at_most_one_item_in_memory(tmp_path: Path, which: str) -> None:
    """40 items of 1 MiB into 16 MiB shards: the spooling writer holds no item between adds and its traced
    peak stays under 4 items; litdata's holds up to a shard (more than 16 items; this case shows the check
    tells them apart)."""
    from litdata.streaming.writer import BinaryWriter

    from avion_ds.data.prep.shard_writer import SpoolingWriter

    writer = (SpoolingWriter if which == "spooling" else BinaryWriter)(str(tmp_path), chunk_bytes=16 * MiB)
    held = []
    tracemalloc.start()
    try:
        for k in range(40):
            writer.add_item(k, {"video_id": "v", "meta": "{}", "data": os.urandom(MiB)})
            held.append(_held(writer))
        writer.done()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    if which == "spooling":
        assert max(held) == 0, held
        assert peak < 4 * MiB, peak
    else:
        assert max(held) > 16 * MiB and peak > 16 * MiB, (held, peak)
    assert len(json.loads((tmp_path / "0.index.json").read_text())["chunks"]) >= 3


def test_litdata_private_names_relied_on(tmp_path: Path) -> None:
    """The private parts of litdata's writer the spooling writer relies on (module doc): a litdata that renames
    or reshapes one fails here."""
    from dataclasses import fields

    from litdata.streaming.writer import BinaryWriter, Item

    writer = BinaryWriter(str(tmp_path), chunk_bytes=MiB)
    for name in ("_serialized_items", "_min_index", "_max_index", "_chunk_index", "_chunks_info", "_chunk_bytes"):
        assert hasattr(writer, name), name
    assert callable(writer._item_account_bytes)
    assert list(inspect.signature(BinaryWriter.write_chunk).parameters) == ["self", "on_done"]
    assert list(inspect.signature(BinaryWriter.serialize).parameters) == ["self", "items"]
    assert {f.name for f in fields(Item)} == {"index", "data", "bytes", "dim", "sample"}


def test_pack_failing_mid_shard_removes_the_spool(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An item that fails to build stops the in-process pack with its error; the spool goes, no index.json."""
    from avion_ds.data.prep import pack

    def item(args: tuple) -> dict:
        if args[0] == 3:
            raise OSError("chunk 3 unreadable")
        return _items([2 * KiB])[0]

    monkeypatch.setattr(pack, "_item", item)
    with pytest.raises(OSError, match="chunk 3 unreadable") as caught:
        pack._write_here([(k,) for k in range(5)], tmp_path, 64 * KiB)
    # removed by the pack, not left to the writer's collection (the error's traceback still holds the writer)
    assert caught.tb is not None and not list(tmp_path.glob(".spool-*"))
    assert not (tmp_path / "index.json").exists()
