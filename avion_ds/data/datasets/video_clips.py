"""The clip dataset base every dataset subclasses: sampling, crops, views, decoding across chunks, bad input.

EPIC-Kitchens-100 lives in :mod:`avion_ds.data.datasets.epic`, Kinetics in :mod:`avion_ds.data.datasets.kinetics`,
Something-Something V2 in :mod:`avion_ds.data.datasets.ssv2`; where videos are found in
:mod:`avion_ds.data.datasets.video_index`.
At construction, rows whose video is absent (``dataset.missing``) or that ``quarantine.tsv`` names
(``dataset.quarantined``; written by ``avion-ds check``) are dropped, counted and logged once.

Each item is ``{"frames": uint8 (T, H, W, C) or (V, T, H, W, C), "label": int | {"verb", "noun"},
"index": int, "skipped": int, "failed_index": int, "failed_reason": str}`` (``failed_index`` is the
requested index when it could not be produced and another was returned instead, else -1). Frames stay
uint8 (4x less to pickle and pin than float); normalisation and flips happen on the device
(:mod:`avion_ds.data.augment`). Training clips can get RandAugment with one draw per clip
(``data.rand_aug``) and ``data.num_sample`` augmented views of one decode (repeated augmentation,
item frames (num_sample, T, H, W, C)).

Determinism: the temporal jitter and the crop box of a clip are drawn from a generator keyed by
(seed, epoch, index, temporal view), so the same clip comes out in any worker. The epoch lives in
a shared-memory tensor, so :meth:`set_epoch` reaches persistent DataLoader workers too.

Bad input: a missing / truncated / zero-byte / non-video file, a chunk whose size/mtime differs
from its manifest row (replaced after chunking), a chunk shorter than the manifest says, a decode
past ``decode_timeout_s``, a CSV row with stop < start or a bad timestamp raises :class:`DataError`.
Under ``on_error: skip`` (default) the sample is logged in one line (index, file or CSV row, reason), counted (``dataset.errors``, summed over
all DataLoader workers) and replaced by another index drawn from the same seeded generator;
the item's ``skipped`` says how many were skipped for it and ``index`` is the sample actually
returned. Under ``on_error: raise`` the DataError propagates. A malformed CSV header fails at
construction naming the missing column.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

from avion_ds.config import DataConfig
from avion_ds.data.crop import (
    CropBox,
    CropSpec,
    center_crop,
    clip_rng,
    crop_resize,
    random_resized_crop,
    three_crops,
)
from avion_ds.data.datasets.quarantine import quarantine_path, read_quarantine, row_key
from avion_ds.data.datasets.registry import lookup
from avion_ds.data.datasets.video_index import VideoIndex
from avion_ds.data.decode.base import REGISTRY, Source, load_plugins
from avion_ds.data.decode.select import get_decoder, pick_decoder
from avion_ds.data.errors import DataError
from avion_ds.data.prep.manifest import Chunk, VideoEntry, check_chunk_file
from avion_ds.data.randaug import ClipRandAugment
from avion_ds.data.sampling import eval_indices, map_to_chunks, segment_indices, stride_indices
from avion_ds.distributed.dist import is_main

log = logging.getLogger(__name__)
MAX_CONSECUTIVE_SKIPS = 50
_ERROR_SLOTS = 1024  # one counter per DataLoader worker id (+1 for the main process)


def _shared_zeros(n: int) -> torch.Tensor:
    return torch.zeros(n, dtype=torch.int64).share_memory_()


class VideoClipDataset(Dataset):
    """Shared machinery: sampling, crops, views, decoding across chunks, skip/raise on bad input."""

    def __init__(
        self,
        cfg: DataConfig,
        split: str,
        temporal_views: int = 1,
        spatial_views: int = 1,
        seed: int = 0,
        index: VideoIndex | None = None,
    ) -> None:
        if split not in ("train", "val"):
            raise ValueError(f"split must be 'train' or 'val', got {split!r}")
        if spatial_views not in (1, 3) or temporal_views < 1:
            raise ValueError(
                f"temporal_views must be >= 1 and spatial_views 1 or 3, got {temporal_views}, {spatial_views}"
            )
        load_plugins()
        if cfg.decoder not in REGISTRY and cfg.decoder != "auto":
            raise ValueError(f"data.decoder={cfg.decoder!r} is not one of auto, {', '.join(sorted(REGISTRY))}")
        self.cfg, self.split, self.train = cfg, split, split == "train"
        self.temporal_views, self.spatial_views, self.seed = temporal_views, spatial_views, seed
        # the val split's videos may live elsewhere (data.val_root: e.g. EPIC MIR evaluation of Ego4D pretraining)
        self.root_key = "data.val_root" if split == "val" and cfg.val_root else "data.root"
        self.video_root = cfg.val_root if self.root_key == "data.val_root" else cfg.root
        self.index = index if index is not None else VideoIndex(self.video_root, cfg.chunked)
        self._decoder_name: str | None = None
        if cfg.decoder != "auto":
            REGISTRY[cfg.decoder].check_available()  # DecoderUnavailable (clear message) now, not in a worker
        self._epoch = _shared_zeros(1)
        self._errors = _shared_zeros(_ERROR_SLOTS)
        self._decoder = None
        self.missing: list[str] = []  # annotation rows dropped up front: video not found
        self.quarantined: list[str] = []  # annotation rows dropped up front: named by quarantine.tsv
        self.missing_where: list[tuple[Path, int]] = []  # (annotation file, line) of each missing row
        self._quarantine = read_quarantine(quarantine_path(self.video_root, cfg.quarantine))
        self.randaug = None
        if self.train and cfg.rand_aug:
            self.randaug = ClipRandAugment(cfg.rand_aug, cfg.size, cfg.interpolation)
        self.load_rows(cfg)

    def load_rows(self, cfg: DataConfig) -> None:
        """Read the split's samples (a hook the constructor calls last; a dataset reading them in its own
        constructor leaves it empty). :class:`~avion_ds.data.datasets.row_table.RowTable` reads and prunes here."""

    def _split_file(self) -> str:
        key = "train_csv" if self.train else "val_csv"
        value = getattr(self.cfg, key)
        if not value:
            raise ValueError(f"data.{key} is empty: set it to the {self.split} annotation file")
        return value

    # -- bookkeeping ------------------------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        """New jitter / crops / replacements for ``epoch`` (visible to persistent workers)."""
        self._epoch[0] = int(epoch)

    @property
    def epoch(self) -> int:
        return int(self._epoch[0])

    @property
    def errors(self) -> int:
        """Bad samples met so far, in this process and its DataLoader workers."""
        return int(self._errors.sum())

    def _count_error(self) -> None:
        info = torch.utils.data.get_worker_info()
        self._errors[0 if info is None else (info.id + 1) % _ERROR_SLOTS] += 1

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_decoder"] = None  # each process opens its own decoder (and helper process)
        return state

    @property
    def decoder_name(self) -> str:
        """The backend this dataset decodes with: ``data.decoder``, or for ``auto`` the probed choice, resolved
        on first use (the trainer sets ``data.decoder`` to rank 0's choice before any loader exists)."""
        if self._decoder_name is None:
            name = pick_decoder(self.cfg)[0]
            REGISTRY[name].check_available()
            self._decoder_name = name
        return self._decoder_name

    @property
    def decoder(self):
        if self._decoder is None:
            self._decoder = get_decoder(
                self.decoder_name, self.cfg.decoder_threads, self.cfg.decode_timeout_s, exact=not self.cfg.chunked
            )
        return self._decoder

    # -- subclasses ---------------------------------------------------------------------------
    def sample_span(self, i: int) -> tuple[VideoEntry, int, int, Any]:
        """(video, first frame, end frame (exclusive), label) of sample ``i``; DataError if bad."""
        raise NotImplementedError

    def row_ref(self, i: int) -> tuple[str, bool]:
        """(video reference, is it a path) of row ``i``: cheap, no probing."""
        raise NotImplementedError

    def row_where(self, i: int) -> tuple[Path, int]:
        """(annotation file, line) of row ``i``."""
        raise NotImplementedError

    def row_name(self, i: int) -> str:
        """A human name of row ``i`` (narration id, video path, ...), for reports."""
        raise NotImplementedError

    def check_row(self, i: int) -> tuple[str | None, VideoEntry | None]:
        """(problem or None, video) of row ``i`` without decoding: fields parse, video resolves, span inside it."""
        try:
            entry, start, end, _ = self.sample_span(i)
        except DataError as e:
            return str(e), None
        slack = max(1, int(round(entry.fps)))  # a stop time up to 1 s past the last decodable frame is tolerated
        if start >= entry.num_frames or end > entry.num_frames + slack:
            return (
                f"clip frames [{start}, {end}) lie outside the video ({entry.num_frames} frames at {entry.fps:g} fps)"
            ), entry
        return None, entry

    def write_skipped(self, path: str | Path) -> Path | None:
        """Write every row dropped up front (one a line) to ``path``; None (nothing written) if none was."""
        if not (self.missing or self.quarantined):
            return None
        Path(path).write_text("".join(f"{x}\n" for x in self.missing + self.quarantined))
        return Path(path)

    # (rows whose chunk files are not as listed, rows looked at, first problem): set by start-up's sample check
    chunk_problems: tuple[int, int, str] = (0, 0, "")

    def startup_line(self) -> str:
        """One start-up log line: usable rows, rows dropped up front (missing videos, quarantined), and the
        sampled rows whose chunk files are absent or changed (skipped when drawn)."""
        bad, seen, first = self.chunk_problems
        return (
            f"{self.split}: {len(self)} samples; skipped up front: {len(self.missing)} rows with missing videos, "
            f"{len(self.quarantined)} quarantined rows"
            + (f"; {bad} of {seen} sampled rows read chunk files not as listed (first: {first})" if bad else "")
        )

    # -- up-front row filtering -----------------------------------------------------------------
    def _quarantine_reason(self, i: int, ref: str, by_path: bool) -> str | None:
        path, line = self.row_where(i)
        key = row_key(path, line)
        if key in self._quarantine:
            return self._quarantine[key]
        bad = [f for f in self.index.relative_files(ref, by_path) if f in self._quarantine]
        if bad and self.index.chunked:  # only the chunks this row's clip can read
            try:
                entry, start, end, _ = self.sample_span(i)
            except DataError as e:
                return str(e)
            touched = {
                os.path.relpath(c.path, self.index.root)
                for c in entry.chunks
                if c.start_frame < end and c.start_frame + c.frames > start
            }
            bad = [f for f in bad if f in touched]
        return "; ".join(f"{f}: {self._quarantine[f]}" for f in bad) or None

    def _prune(self) -> None:
        """Drop rows whose video is absent or that quarantine.tsv names, before any epoch (listed, logged)."""
        keep = []
        for i, row in enumerate(self.rows):
            ref, by_path = self.row_ref(i)
            path, line = self.row_where(i)
            where = f"{path}:{line} ({self.row_name(i)})"
            if not self.index.exists(ref, by_path):
                self.missing.append(f"{where}: video {ref!r} not found under {self.index.root}")
                self.missing_where.append((path, line))
                continue
            reason = self._quarantine_reason(i, ref, by_path) if self._quarantine else None
            if reason:
                self.quarantined.append(f"{where}: {reason}")
                continue
            keep.append(row)
        total = len(self.rows)
        self.rows = keep
        self._report_pruned(len(keep), total, path)

    def _report_pruned(self, kept: int, total: int, path: Path) -> None:
        """Log the rows dropped up front once per job; ValueError when none of ``path``'s rows is left."""
        if (self.missing or self.quarantined) and is_main():  # once per job, not per rank
            log.warning(
                "%s split: %d of %d annotation rows usable; %d missing videos, %d quarantined; first: %s",
                self.split,
                kept,
                total,
                len(self.missing),
                len(self.quarantined),
                (self.missing + self.quarantined)[0],
            )
        if not kept:
            raise ValueError(
                f"{path}: none of its {total} rows is usable ({len(self.missing)} missing videos, "
                f"{len(self.quarantined)} quarantined); is {self.root_key}={self.index.root} right?"
            )

    # -- clips --------------------------------------------------------------------------------
    def clip_indices(self, start: int, end: int, rng, view: int) -> list[int]:
        """Frame indices of temporal view ``view`` of the span [start, end) (the recipe's sampling;
        eval views as the dataset's reference code picks them: :func:`~.sampling.eval_indices`)."""
        c = self.cfg
        if not self.train:
            segments = lookup(c.dataset).eval_segments  # the dataset's own eval segments (SSv2), if declared
            return eval_indices(segments, c.sampling, start, end, c.num_frames, c.stride, view, self.temporal_views)
        if c.sampling == "stride":
            return stride_indices(
                start, end, c.num_frames, c.stride, train=self.train, rng=rng, view=view, num_views=self.temporal_views
            )
        return segment_indices(
            start, end, c.num_frames, train=self.train, rng=rng, view=view, num_views=self.temporal_views
        )

    def crop_boxes(self, h: int, w: int, rng) -> list[CropBox]:
        """The spatial views' crop boxes in an ``h`` x ``w`` frame (random resized crops when training)."""
        if self.train:
            scale, ratio = tuple(self.cfg.crop_scale), tuple(self.cfg.crop_ratio)
            return [random_resized_crop(h, w, scale, ratio, rng) for _ in range(self.spatial_views)]
        return [center_crop(h, w)] if self.spatial_views == 1 else three_crops(h, w)

    def read_clip(
        self, entry: VideoEntry, indices: list[int], box: CropBox | None, resize: bool = True
    ) -> torch.Tensor:
        """Frames ``indices`` cropped to ``box`` and resized to size (``box=None``: whole frames, no resize;
        ``resize=False``: the box's pixels as decoded)."""
        for k in sorted({entry.locate(i)[0] for i in indices}):
            problem = self.chunk_problem(entry.chunks[k])
            if problem:
                raise DataError(problem)
        size = (self.cfg.size, self.cfg.size)
        resize = resize and box is not None
        fused = resize and self.cfg.interpolation == "bilinear"  # decoders resize bilinearly
        spec = CropSpec(box, size if fused else None, entry.height, entry.width)
        parts = [self.decoder.decode(self.chunk_source(p), local, spec) for p, local in map_to_chunks(indices, entry)]
        frames = parts[0] if len(parts) == 1 else torch.cat(parts)
        if resize and not fused:
            frames = crop_resize(frames, None, size, self.cfg.interpolation)
        return frames

    def chunk_problem(self, chunk: Chunk) -> str | None:
        """Why ``chunk`` cannot be read as listed (its file changed or is gone), else None."""
        return check_chunk_file(chunk)

    def chunk_source(self, path: str) -> Source:
        """What the decoder reads for the chunk at ``path``: the file (shard datasets: its bytes)."""
        return path

    def _clips(self, entry: VideoEntry, indices: list[int], boxes: list[CropBox]) -> list[torch.Tensor]:
        """:meth:`read_clip` for each of ``boxes`` from ONE decode of the boxes' union (eval's 3 crops).

        Every backend's crop gives the pixels a whole-frame decode has at the box, and the resize
        runs on those pixels: the views equal per-box decodes bit for bit (tests/data/test_datasets.py).
        """
        if len(boxes) == 1:
            return [self.read_clip(entry, indices, boxes[0])]
        top, left = min(b.top for b in boxes), min(b.left for b in boxes)
        union = CropBox(
            top, left, max(b.top + b.height for b in boxes) - top, max(b.left + b.width for b in boxes) - left
        )
        frames = self.read_clip(entry, indices, union, resize=False)
        if tuple(frames.shape[1:3]) != (union.height, union.width):  # a chunk of another size than the manifest's
            return [self.read_clip(entry, indices, b) for b in boxes]
        size = (self.cfg.size, self.cfg.size)
        return [
            crop_resize(frames, CropBox(b.top - top, b.left - left, b.height, b.width), size, self.cfg.interpolation)
            for b in boxes
        ]

    def _augment(self, frames: torch.Tensor, rng) -> torch.Tensor:
        return frames if self.randaug is None else self.randaug(frames, int(rng.integers(2**31)))

    def _load(self, i: int) -> dict:
        entry, start, end, label = self.sample_span(i)
        views = []
        if self.train and self.cfg.num_sample > 1:  # repeated augmentation: decode once, augment num_sample times
            rng = clip_rng(self.seed, self.epoch, i, 0)
            full = self.read_clip(entry, self.clip_indices(start, end, rng, 0), None)
            h, w = full.shape[1:3]
            for _ in range(self.cfg.num_sample):
                box = self.crop_boxes(h, w, rng)[0]
                views.append(self._augment(crop_resize(full, box, (self.cfg.size,) * 2, self.cfg.interpolation), rng))
        for t in range(self.temporal_views if not views else 0):
            rng = clip_rng(self.seed, self.epoch, i, t)
            indices = self.clip_indices(start, end, rng, t)
            for frames in self._clips(entry, indices, self.crop_boxes(entry.height, entry.width, rng)):
                views.append(self._augment(frames, rng))
        frames = views[0] if len(views) == 1 else torch.stack(views)
        return {"frames": frames, "label": label, "index": i}

    # labels of a placeholder item (deferred errors); subclasses with several heads name them
    label_heads: tuple[str, ...] | None = None
    # set by training / evaluation loops: report bad samples in the item instead of logging or raising
    # here, so the loop names each file once per run across workers and ranks and every rank stops together
    defer_errors: bool = False

    def _placeholder(self, i: int, message: str) -> dict:
        """An item of the right shape carrying a fatal error (``on_error: raise`` under ``defer_errors``)."""
        c, views = self.cfg, self.temporal_views * self.spatial_views
        shape = (c.num_frames, c.size, c.size, 3)
        frames = torch.zeros(((views,) if views > 1 else ()) + shape, dtype=torch.uint8)
        label: Any = {h: 0 for h in self.label_heads} if self.label_heads else 0
        return {
            "frames": frames,
            "label": label,
            "index": int(i),
            "skipped": 0,
            "failed_index": -1,
            "failed_reason": "",
            "bad": "",
            "fatal": message,
        }

    def __getitem__(self, i: int) -> dict:
        skipped, j, first_error, messages = 0, int(i), "", []
        while True:
            try:
                item = self._load(j)
                # the requested index failed and was replaced: eval reports it (never silently dropped)
                item.update(skipped=skipped, failed_index=int(i) if skipped else -1, failed_reason=first_error)
                if self.defer_errors:
                    item.update(bad="\n".join(messages), fatal="")
                return item
            except DataError as e:
                if self.cfg.on_error == "raise":
                    if self.defer_errors:
                        return self._placeholder(i, str(e))
                    raise
                first_error = first_error or str(e)
                self._count_error()
                if self.defer_errors:
                    messages.append(str(e))
                else:
                    log.warning("skipping sample %d: %s", j, e)
                skipped += 1
                if skipped >= MAX_CONSECUTIVE_SKIPS:
                    err = DataError(
                        f"{skipped} bad samples in a row while producing index {i} (is data.root right?); last: {e}"
                    )
                    if self.defer_errors:
                        return self._placeholder(i, str(err))
                    raise err from e
                j = int(clip_rng(self.seed, self.epoch, i, 1000 + skipped).integers(len(self)))
