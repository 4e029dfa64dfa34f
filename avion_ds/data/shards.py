"""Training clips from litdata shards (``data.shards``): a local directory, ``http(s)://`` or ``s3://``.

The shards are ``avion-ds pack``'s (:mod:`avion_ds.data.prep.pack`): one item per window of a video's
consecutive chunks, with their bytes, their manifest facts and the annotation rows of each split it serves. litdata's ``StreamingDataset`` does
the streaming: it splits shards between ranks and DataLoader workers without overlap, shuffles shard
order and items inside a shard from (seed, epoch), and its ``StreamingDataLoader.state_dict()`` resumes
mid-epoch exactly. Two small pieces plug into its extension points:

- :class:`RowItemLoader` (an item loader): a SAMPLE is one annotation row, not one video, so an epoch
  visits every row once and litdata counts (and resumes) samples; the rows of a shard are addressed
  through the per-item row counts ``pack`` records in ``index.json``, the video item is read from the
  shard the row lies in;
- downloaders registered for ``http(s)://`` and ``s3://`` (:mod:`avion_ds.data.shard_downloads`): transient
  network errors retried with backoff and counted, whatever the scheme.

A clip is then made by the recipe's own dataset class (sampling, crop, RandAugment, masks), its chunks
decoded from the item's bytes (:class:`~avion_ds.data.decode.base.MemoryVideo`) by the same decoders and
fused crop as the chunk-tree path, with the chunk tree's clip and crop draws for the same row. A chunk
whose bytes do not match its sha256 (a corrupt shard) is a bad sample like a bad chunk file: named,
counted and replaced (another row of the same video); a shard litdata cannot read (truncated) is named
once, its rows counted and replaced by rows of the last video read; either is fatal under
``data.on_error: raise``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import threading
import weakref
from bisect import bisect_right
from pathlib import Path
from typing import Any

import torch
from filelock import FileLock
from litdata import StreamingDataset
from litdata.streaming import dataset as litdata_dataset
from litdata.streaming import elastic as litdata_elastic
from litdata.streaming.item_loader import Interval, PyTreeLoader
from litdata.streaming.resolver import Dir
from litdata.utilities.dataset_utilities import get_default_cache_dir
from litdata.utilities.env import _DistributedEnv

from avion_ds.config import DataConfig
from avion_ds.data.crop import clip_rng
from avion_ds.data.decode.base import MemoryVideo, reason
from avion_ds.data.errors import DataError
from avion_ds.data.prep import net_retry
from avion_ds.data.prep.manifest import Chunk, VideoEntry
from avion_ds.data.prep.shard_index import ROWS_KEY, format_problem
from avion_ds.data.shard_downloads import HttpDownloader, allow_plain_http_s3, download_retries, wait_published


class RowItemLoader(PyTreeLoader):
    """Items are annotation rows of ``split``: row ``i`` of a shard -> (its video item, the row)."""

    def __init__(self, split: str) -> None:
        super().__init__(batch_decode=0)
        self.split = split
        self._cum: list[list[int]] = []
        self._ready = ""  # the shard file last found complete (downloads: see wait_published)

    def setup(self, config: dict, chunks: list, *args: Any, **kwargs: Any) -> None:
        problem = format_problem({"config": config}, "index.json")  # before litdata picks deserializers
        if problem is not None:
            raise ValueError(problem)
        super().setup(config, chunks, *args, **kwargs)
        self._cum, self._ready = [], ""
        for c in chunks:
            counts = (c.get(ROWS_KEY) or {}).get(self.split)
            if counts is None:
                raise ValueError(f"shard {c['filename']}: no {self.split} rows (pack the tree with --config RECIPE)")
            acc, total = [], 0
            for n in counts:
                total += int(n)
                acc.append(total)
            self._cum.append(acc)

    def generate_intervals(self) -> list[Interval]:
        out, begin = [], 0
        for acc in self._cum:
            end = begin + (acc[-1] if acc else 0)
            out.append(Interval(begin, begin, end, end))
            begin = end
        return out

    def state_dict(self) -> dict:
        return {"rows_of": self.split}

    def load_item_from_chunk(self, index: int, chunk_index: int, chunk_filepath: str, begin: int, *args: Any) -> Any:
        if chunk_filepath != self._ready and args:  # a shard just downloaded: read it at once (shard_downloads)
            wait_published(chunk_filepath, int(args[0]))
            self._ready = chunk_filepath
        local = index - begin
        acc = self._cum[chunk_index]
        k = bisect_right(acc, local)  # the item (video) of this shard holding row ``local``
        item = super().load_item_from_chunk(k, chunk_index, chunk_filepath, 0, *args)
        where = (*_file_stamp(chunk_filepath), k)  # this item of this copy of the shard file
        return {"item": item, "row": local - (acc[k - 1] if k else 0), "index": int(index), "where": where}


_VERIFIED: dict[tuple, None] = {}  # per process: (shard file copy, item, chunk offset, sha256) whose bytes matched
_METAS: dict[tuple, dict] = {}  # per process: an item's parsed meta, by (shard file copy, item)
_ROWS: dict[tuple, tuple[dict, list]] = {}  # per process: (rows by sample, samples sorted), by (copy, item, split)
_CACHE_LIMIT = (1 << 16, 64)  # entries kept (verified chunks; metas and rows); a full cache starts afresh


def _file_stamp(path: str) -> tuple:
    """(path, inode, mtime, size): a shard file copy (a download replacing it, or an edit, is another)."""
    st = os.stat(path)
    return path, st.st_ino, st.st_mtime_ns, st.st_size


def _item_meta(found: dict, split: str) -> tuple[dict, dict, list]:
    """(the item's parsed meta, its ``split`` rows by sample index, those indices sorted): parsed once per shard
    file copy and item in this process, not once per sample."""
    meta = _METAS.get(found["where"])
    if meta is None:
        if len(_METAS) >= _CACHE_LIMIT[1]:
            _METAS.clear()
            _ROWS.clear()
        meta = _METAS[found["where"]] = json.loads(found["item"]["meta"])
    rows = _ROWS.get((found["where"], split))
    if rows is None:
        by_sample = {int(r[4]): r for r in meta["rows"][split]}
        rows = _ROWS[(found["where"], split)] = (by_sample, sorted(by_sample))
    return meta, *rows


class _ShardRows:
    """Mixin over a registered dataset class: rows and chunk bytes come from the current shard item."""

    def load_rows(self, cfg: DataConfig) -> None:
        self.rows, self._item, self._sources, self._where = [], None, {}, None
        self.masks = getattr(self, "masks", None)  # the unlabelled videos' dataset: the task attaches them
        load_targets = getattr(self, "load_eval_targets", None)  # what scoring needs beyond the rows (epic_mir)
        if load_targets is not None:
            load_targets(cfg)

    def use_item(self, found: dict, location: str) -> int:
        """Make ``found`` (a :class:`RowItemLoader` result) the item :meth:`sample_span` reads; returns its
        row's sample index (the key of its clip and crop draws, as in the chunk-tree dataset)."""
        item = found["item"]
        meta, rows, ids = _item_meta(found, self.split)
        row = int(meta["rows"][self.split][found["row"]][4])
        if found["where"] == self._where:  # the item of the last sample (rows of one video come together)
            return row  # its chunks, their checked bytes and rows stand
        data, offset, chunks, self._sources = memoryview(item["data"]), 0, [], {}
        for c in meta["chunks"]:
            name = f"{location}:{item['video_id']}/{c['path']}"
            verified = (found["where"], offset, c["sha256"])  # the key once this copy's bytes matched
            self._sources[name] = (data[offset : offset + int(c["bytes"])], int(c["bytes"]), c["sha256"], verified)
            offset += int(c["bytes"])
            chunks.append(
                Chunk(name, int(c["start_frame"]), int(c["frames"]), float(c["fps"]), c["width"], c["height"])
            )
        self._texts = (meta.get("texts") or {}).get(self.split, {})  # texts the rows name by number (epic_mir)
        self._item = (VideoEntry(item["video_id"], chunks), rows, ids)
        self._where = found["where"]
        return row

    def __len__(self) -> int:
        return 1 << 62  # replacements for bad samples are drawn from this, then mapped onto the video's rows

    def _load(self, i: int) -> dict:
        rows, ids = self._item[1], self._item[2]
        return super()._load(i if i in rows else ids[i % len(ids)])  # a replacement: another row of the video

    def sample_span(self, i: int) -> tuple[VideoEntry, int, int, Any]:
        row = self._item[1][i]
        draw = getattr(self, "draw_label", None)  # labels drawn per epoch from the row's candidates (captions)
        label = row[2] if draw is None else draw(i, row[2], self.sample_where(i))
        return self._item[0], int(row[0]), int(row[1]), label

    def sample_where(self, i: int) -> str:
        """Sample ``i`` named by its packed row (messages: a caption that cannot be drawn or tokenised)."""
        return f"{self.row_name(i)} ({self.split} sample {i} of the shards)"

    def sentence_text(self, j: int) -> str:
        """Shared text ``j`` of the current item (``meta["texts"]``: EPIC-MIR's sentences); DataError if absent."""
        text = self._texts.get(str(j))
        if text is None:
            raise DataError(f"shard item of video {self._item[0].video_id}: no text {j} for its rows (pack again)")
        return text

    def row_name(self, i: int) -> str:
        row = self._item[1].get(i) if self._item else None
        return str(row[3]) if row else f"{self.split} sample {i}"

    def chunk_problem(self, chunk: Chunk) -> str | None:
        """The chunk's bytes against their size and sha256 (only the chunks a clip reads are hashed, once per
        copy of the shard file in this process)."""
        src = self._sources[chunk.path]
        if isinstance(src, tuple):
            blob, size, digest, verified = src
            ok = len(blob) == size and (verified in _VERIFIED or hashlib.sha256(blob).hexdigest() == digest)
            if ok and verified not in _VERIFIED:
                if len(_VERIFIED) >= _CACHE_LIMIT[0]:
                    _VERIFIED.clear()
                _VERIFIED[verified] = None
            src = self._sources[chunk.path] = (
                MemoryVideo(chunk.path, bytes(blob))
                if ok
                else f"{chunk.path}: shard bytes differ from their sha256 (corrupt shard)"
            )
        return src if isinstance(src, str) else None

    def chunk_source(self, path: str) -> MemoryVideo:
        return self._sources[path]


_SHARD_CLASSES: dict[type, type] = {}


def _shard_class(cls: type) -> type:
    """``cls`` (a registered dataset class) reading its rows and chunks from shard items (one class per ``cls``)."""
    if cls not in _SHARD_CLASSES:
        _SHARD_CLASSES[cls] = type(f"Shard{cls.__name__}", (_ShardRows, cls), {"__reduce__": _reduce_rows})
    return _SHARD_CLASSES[cls]


def _reduce_rows(obj: Any) -> tuple[Any, tuple[type, dict]]:
    """Pickle a shard dataset as its registered class and state (spawned DataLoader workers rebuild the class)."""
    return _rebuild_rows, (type(obj).__mro__[2], obj.__getstate__())


def _rebuild_rows(cls: type, state: dict) -> Any:
    obj = _shard_class(cls).__new__(_shard_class(cls))
    obj.__dict__.update(state)
    return obj


class _NoIndex:
    """The video index of a shard dataset: there is no chunk tree to look videos up in."""

    chunked = True

    def __init__(self, root: str) -> None:
        self.root = Path(root)


def _input_dir(location: str, cache_dir: str | None) -> str | Dir:
    """litdata's input for ``location``: http(s) as a URL with a local cache directory (litdata would read it as
    a path), the rest as they are (s3:// through litdata's own S3 support)."""
    if not location.startswith(("http://", "https://")):
        return location
    if cache_dir is None:
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
        cache_dir = str(base / "avion_ds" / "shards" / hashlib.sha256(location.encode()).hexdigest()[:16])
    os.makedirs(cache_dir, exist_ok=True)
    return Dir(path=cache_dir, url=location.rstrip("/"))


def _cache_setup_lock(location: str, cache_dir: str | None) -> Any:
    """One process at a time sets up litdata's cache of an ``s3://`` location (nothing for the others).

    litdata keeps an s3:// location's shards in ``CACHE/<md5 of the URL>/<index.json's updated_at>/`` and, when it
    finds another folder there (the location was packed again), deletes ``CACHE/<md5>`` with ``shutil.rmtree``.
    Local ranks of one node start together and share CACHE: two of them deleting the same tree, one meets a file
    the other already removed (``FileNotFoundError: 'chunk-0-1.bin.cnt'``, measured on 2 CPU ranks). A file lock
    in CACHE (litdata's own dependency, filelock) makes the first rank clean up and the others find it done."""
    if location.startswith(("http://", "https://")) or "://" not in location:
        return contextlib.nullcontext()  # a cache folder of our own (http), or no cache (a local directory)
    root = cache_dir or get_default_cache_dir()
    os.makedirs(root, exist_ok=True)
    return FileLock(os.path.join(root, ".avion_ds_setup.lock"))


def _whole_prefix(drop_first: int, world_size: int, batch_size: int) -> int:
    """The samples an elastic resume drops: all those read before the cut (litdata's own rounds them down to
    whole batches of the new world, and the remainder is read twice)."""
    return max(0, int(drop_first))


_RETRY_SLOTS = 1024  # shard download retries: one counter per DataLoader worker id (+1 for this process)
_ROUNDING = "_round_down_drop_first"  # litdata's PRIVATE name (0.2.76), in its dataset and elastic modules
_ELASTIC_LOCK = threading.Lock()


class ShardClipDataset(StreamingDataset):
    """Clips of ``split`` from the shards at ``location``, made by ``dataset_cls`` (see module doc).

    Items are the dataset's own items (``frames``, ``label``, ``index``: the row's sample index in the
    dataset read from its annotation file where it was packed, ``skipped``, ...); the clip and crop draws
    are keyed by (seed, epoch, sample index), so a row gives the chunk tree's clip in any worker, rank or
    resumed run."""

    streams_shards = True  # build_loader gives it litdata's StreamingDataLoader

    def __init__(
        self,
        location: str,
        dataset_cls: type,
        cfg: DataConfig,
        split: str,
        seed: int = 0,
        shuffle: bool | None = None,
        temporal_views: int = 1,
        spatial_views: int = 1,
        cache_dir: str | None = None,
    ) -> None:
        allow_plain_http_s3()
        with _cache_setup_lock(location, cache_dir):
            super().__init__(
                _input_dir(location, cache_dir),
                cache_dir=cache_dir,
                item_loader=RowItemLoader(split),
                shuffle=split == "train" if shuffle is None else shuffle,
                seed=seed,
                drop_last=split == "train",
            )
        self.location = location
        self._retries = torch.zeros(_RETRY_SLOTS, dtype=torch.int64).share_memory_()  # per DataLoader worker
        net_retry.add_counter(self._retries)
        weakref.finalize(self, net_retry.retire_counter, self._retries)  # its count outlives it, its memory not
        index = json.loads((Path(self.input_dir.path) / "index.json").read_text())  # local, or litdata's copy
        self._rows = sum(sum(c[ROWS_KEY][split]) for c in index["chunks"])
        self.clips = _shard_class(dataset_cls)(
            cfg, split, temporal_views, spatial_views, seed, index=_NoIndex(location)
        )

    @property
    def decoder_name(self) -> str:
        return self.clips.decoder_name

    @property
    def masks(self) -> Any:
        return getattr(self.clips, "masks", None)

    @masks.setter
    def masks(self, value: Any) -> None:
        self.clips.masks = value

    @property
    def defer_errors(self) -> bool:
        return self.clips.defer_errors

    @defer_errors.setter
    def defer_errors(self, value: bool) -> None:
        self.clips.defer_errors = value

    @property
    def errors(self) -> int:
        """Bad samples met so far, in this process and its DataLoader workers."""
        return self.clips.errors

    def __getattr__(self, name: str) -> Any:
        """What the training and evaluation loops ask a dataset (``startup_line``, ``label_heads``, ...):
        the clip dataset's answer."""
        clips = self.__dict__.get("clips")
        if clips is None or name.startswith("__"):
            raise AttributeError(name)
        return getattr(clips, name)

    def __len__(self) -> int:
        """The split's rows in all shards, every rank's together (as a map-style dataset's length); litdata's
        loader asks ``get_len`` for this rank and worker's share."""
        return self._rows

    def find_ranks(self) -> None:
        """Ask the process group for this rank now: litdata reads it when the dataset is built, before the
        process group exists (``WORLD_SIZE`` alone would make every rank rank 0)."""
        self.distributed_env = _DistributedEnv.detect()

    def _setup_elastic_resume(self, replay_workers: bool = False) -> list[list[int]]:
        """litdata's resume on another world size, worker count or batch size (its elastic path), dropping
        exactly the ``sample_in_epoch`` samples its saved state counts as read, not that count rounded down to
        whole batches of the new world: the epoch's remaining samples, each once, split over the new ranks.

        litdata's stream of an epoch is the order the first run's ranks read it in lockstep (batches cycling
        ranks, then workers), so the samples read before a cut are its first ``sample_in_epoch``; litdata
        re-stripes the rest over the new grid from any offset. The rounding is litdata's PRIVATE module
        function (0.2.76), replaced here while this call runs (under a lock; when the name is gone, litdata's
        own behaviour stays and ``tests/data/test_shards.py`` fails)."""
        modules = [m for m in (litdata_dataset, litdata_elastic) if hasattr(m, _ROUNDING)]
        with _ELASTIC_LOCK:
            saved = [getattr(m, _ROUNDING) for m in modules]
            try:
                for m in modules:
                    setattr(m, _ROUNDING, _whole_prefix)
                return super()._setup_elastic_resume(replay_workers)
            finally:
                for m, fn in zip(modules, saved, strict=True):
                    setattr(m, _ROUNDING, fn)

    def startup_line(self) -> str:
        """The start-up log line: samples (annotation rows) of this split in the shards, and where they are."""
        return f"{self.clips.split}: {len(self)} samples from the shards at {self.location}"

    def __iter__(self) -> Any:
        """litdata's iterator, in this process or a DataLoader worker (forked or spawned); the shard downloads it
        retries are counted in this dataset's slot for the process (:func:`net_retry.count_into`)."""
        info = torch.utils.data.get_worker_info()
        net_retry.count_into(self._retries, 0 if info is None else (info.id + 1) % _RETRY_SLOTS)
        return super().__iter__()

    def set_clip_epoch(self, epoch: int) -> None:
        """The clip and crop draws' epoch (litdata's own epoch orders the shards)."""
        self.clips.set_epoch(epoch)

    def __getitem__(self, index: Any) -> Any:
        shard = getattr(index, "chunk_index", None)
        bad = self.__dict__.setdefault("_bad_shards", {})
        try:
            if shard in bad:
                raise bad[shard]
            found = super().__getitem__(index)
        except Exception as e:  # noqa: BLE001 - litdata could not read the shard (truncated, unreadable)
            if shard is not None and shard not in bad:
                bad[shard] = DataError(f"{self._shard_name(shard)}: shard cannot be read ({reason(e)})")
            return self._unreadable(index, bad.get(shard) or DataError(f"{self.location}: {reason(e)}"))
        if not isinstance(found, dict) or "item" not in found:
            return found
        self.__dict__["_last_found"] = found
        return self.clips[self.clips.use_item(found, self.location)]

    def _shard_name(self, shard: int) -> str:
        """The shard file of litdata's chunk ``shard`` at this location (for messages)."""
        try:
            chunks = json.loads((Path(self.input_dir.path) / "index.json").read_text())["chunks"]
            return f"{self.location.rstrip('/')}/{chunks[shard]['filename']}"
        except (OSError, ValueError, KeyError, IndexError, TypeError):
            return f"{self.location} (shard {shard})"

    def _unreadable(self, index: Any, err: DataError) -> dict:
        """A sample of an unreadable shard: fatal under ``on_error: raise``, else counted and replaced by a row
        of the last video this process read (DataError when there is none yet)."""
        c, i = self.clips, int(getattr(index, "index", index))
        last = self.__dict__.get("_last_found")
        if c.cfg.on_error == "raise" or last is None:
            if c.defer_errors:
                return c._placeholder(i, str(err))
            raise err
        c._count_error()
        c.use_item(last, self.location)
        ids = c._item[2]
        item = c[ids[int(clip_rng(c.seed, c.epoch, i, 1000).integers(len(ids)))]]
        item.update(skipped=item["skipped"] + 1, failed_index=i, failed_reason=str(err))
        if c.defer_errors:
            item["bad"] = "\n".join(filter(None, [str(err), item.get("bad", "")]))
        return item


__all__ = ["HttpDownloader", "RowItemLoader", "ShardClipDataset", "allow_plain_http_s3", "download_retries"]
