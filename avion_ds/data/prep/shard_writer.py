"""litdata's shard writer holding one item in memory, not a shard: :class:`SpoolingWriter`.

litdata's ``BinaryWriter`` keeps every serialized item of the shard it is filling in memory, and each item's
input too (``Item.sample``, kept for an Arrow footer), then builds the whole chunk file as one more buffer:
about 3.6x the shard size at its peak. :class:`SpoolingWriter` is that writer with each item's serialized bytes
appended to a spool file next to the shards as the item is added (memory keeps its size), and each chunk file
written from the spool in bounded blocks. Shard boundaries, chunk files, their names and ``index.json`` are
litdata's (``tests/data/test_shard_writer.py`` compares them byte for byte with the stock writer's).

The chunk layout written is litdata's pytree chunk (``BinaryWriter._create_chunk``): ``uint32`` item count
``N``, ``uint32[N+1]`` offsets from the file start, then the items' bytes, without compression, encryption or
an Arrow footer (litdata appends one only where pyarrow is installed; avion's row loader reads the pytree
items). Private litdata names relied on (the test of this module fails when one changes):
``_serialized_items``, ``_min_index``, ``_max_index``, ``_chunk_index``, ``_chunks_info``, ``_chunk_bytes``,
``_item_account_bytes`` and ``write_chunk(on_done)``.
"""

from __future__ import annotations

import os
import tempfile
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
from litdata.streaming.writer import BinaryWriter, Item

BLOCK = 4 << 20  # bytes copied at a time from the spool into a chunk file


@dataclass(frozen=True)
class Spooled:
    """An item's serialized bytes in the spool: where they are and how many (``len`` is litdata's item size)."""

    offset: int
    size: int

    def __len__(self) -> int:
        return self.size


@dataclass(frozen=True)
class Accounted:
    """What a pending item counts toward ``chunk_bytes`` (litdata's rule, taken while its input was at hand),
    standing in for the input litdata would keep as ``Item.sample``."""

    bytes: int


class SpoolingWriter(BinaryWriter):
    """litdata's ``BinaryWriter`` (uncompressed, unencrypted, pytree items) with pending items in a spool file
    under ``cache_dir`` instead of memory; call :meth:`done` then ``merge`` as for litdata's writer."""

    def __init__(self, cache_dir: str, chunk_bytes: int | None = None, chunk_size: int | None = None) -> None:
        super().__init__(cache_dir, chunk_size=chunk_size, chunk_bytes=chunk_bytes)
        self._spool_dir = tempfile.TemporaryDirectory(prefix=".spool-", dir=cache_dir)  # removed by done()
        self._spool = open(os.path.join(self._spool_dir.name, "items"), "w+b")  # noqa: SIM115 - closed by done()
        self._spool_end = 0

    def serialize(self, items: Any) -> tuple[Any, int | None]:
        """litdata's serialization, the bytes appended to the spool: litdata's ``add_item`` keeps a
        :class:`Spooled` (its ``len`` the item's size) where it would keep the bytes."""
        data, dim = super().serialize(items)
        os.pwrite(self._spool.fileno(), data, self._spool_end)
        spooled = Spooled(self._spool_end, len(data))
        self._spool_end += len(data)
        return spooled, dim

    def add_item(self, index: int, items: Any) -> str | None:
        """litdata's ``add_item``; then the pending item keeps what it counts toward the shard size in place of
        its input (the input of the item being added is the one held)."""
        written = super().add_item(index, items)
        item = self._serialized_items.get(index)
        if item is not None and not isinstance(item.sample, Accounted):
            item.sample = Accounted(super()._item_account_bytes(item))
        return written

    def _item_account_bytes(self, item: Item) -> int:
        if isinstance(item.sample, Accounted):
            return item.sample.bytes
        return super()._item_account_bytes(item)

    def _chunk_items(self, on_done: bool) -> list[Item]:
        """The items of the next chunk, chosen as litdata's ``_create_chunk`` chooses them."""
        if on_done:
            indices = sorted(self._serialized_items)
            if indices and indices[-1] - indices[0] != len(indices) - 1:
                raise RuntimeError(f"{self._cache_dir}: pending item indices are not consecutive: {indices}")
            return [self._serialized_items.pop(k) for k in indices]
        assert self._max_index is not None and self._min_index is not None, (self._max_index, self._min_index)
        if self._max_index == self._min_index:  # one item larger than a chunk: a chunk of its own
            return [self._serialized_items.pop(self._max_index)]
        return [self._serialized_items.pop(k) for k in range(self._min_index, self._max_index)]

    def write_chunk(self, on_done: bool = False) -> str:
        """Write the next chunk file from the spool: litdata's header, then each item's bytes in blocks."""
        items = self._chunk_items(on_done)
        if not items:
            raise RuntimeError(f"{self._cache_dir}: no items for a chunk")
        n = len(items)
        header = 4 + 4 * (n + 1)
        offsets = np.cumsum([header] + [item.bytes for item in items], dtype=np.uint64)
        if offsets[-1] > np.iinfo(np.uint32).max:
            raise ValueError(f"{self._cache_dir}: a chunk of {int(offsets[-1])} bytes (litdata's offsets are uint32)")
        size = int(offsets[-1])
        if self._chunk_bytes and size > self._chunk_bytes and (n == 1 or size > int(self._chunk_bytes * 1.1)):
            warnings.warn(
                f"An item was larger than the target chunk size ({self._chunk_bytes} B): {size} B", stacklevel=2
            )
        filename = self.get_chunk_filename(file_compression=False)
        with open(os.path.join(self._cache_dir, filename), "wb") as out:
            out.write(np.uint32(n).tobytes() + offsets.astype(np.uint32).tobytes())
            for item in items:
                self._copy(item.data, out)
        dim = sum(item.dim or 0 for item in items) if items[0].dim else None
        self._chunks_info.append({"chunk_bytes": size, "chunk_size": n, "dim": dim, "filename": filename})
        self._chunk_index += 1
        self._compact()
        return os.path.join(self._cache_dir, filename)

    def _copy(self, spooled: Spooled, out: Any) -> None:
        """An item's bytes from the spool to ``out``, ``BLOCK`` bytes at a time."""
        done = 0
        while done < spooled.size:
            block = os.pread(self._spool.fileno(), min(BLOCK, spooled.size - done), spooled.offset + done)
            if not block:
                raise OSError(f"{self._spool.name}: ends inside an item")
            out.write(block)
            done += len(block)

    def _compact(self) -> None:
        """Move the items still pending (the one that crossed the shard size) to the spool's start, in blocks,
        and cut the spool there: it holds about one shard at most."""
        fd, end = self._spool.fileno(), 0
        for item in sorted(self._serialized_items.values(), key=lambda i: i.data.offset):
            spooled, done = item.data, 0
            while done < spooled.size:  # end <= the item's offset: a block never overwrites bytes still to move
                block = os.pread(fd, min(BLOCK, spooled.size - done), spooled.offset + done)
                os.pwrite(fd, block, end + done)
                done += len(block)
            item.data = Spooled(end, spooled.size)
            end += spooled.size
        os.ftruncate(fd, end)
        self._spool_end = end

    def done(self) -> list[str]:
        """litdata's ``done`` (the last chunk and this writer's index), then the spool removed."""
        try:
            return super().done()
        finally:
            self.close()

    def close(self) -> None:
        """Remove the spool (the items not yet in a chunk file are dropped)."""
        self._spool.close()
        self._spool_dir.cleanup()
