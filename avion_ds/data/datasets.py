"""EPIC-Kitchens-100 and Kinetics-style clip datasets over chunked (or whole) videos.

Each item is ``{"frames": uint8 (T, H, W, C) or (V, T, H, W, C), "label": int | {"verb", "noun"},
"index": int, "skipped": int}``. Frames stay uint8 (4x less to pickle and pin than float);
normalisation and flips happen on the device (:mod:`avion_ds.data.augment`).

Determinism: the temporal jitter and the crop box of a clip are drawn from a generator keyed by
(seed, epoch, index, temporal view), so the same clip comes out in any worker. The epoch lives in
a shared-memory tensor, so :meth:`set_epoch` reaches persistent DataLoader workers too.

Bad input: a missing / truncated / zero-byte / non-video file, a chunk shorter than the
manifest says, a decode past ``decode_timeout_s``, a CSV row with stop < start, a bad timestamp
or an unknown video raises :class:`DataError`. Under ``on_error: skip`` (default) the sample is
logged in one line (index, file or CSV row, reason), counted (``dataset.errors``, summed over
all DataLoader workers) and replaced by another index drawn from the same seeded generator;
the item's ``skipped`` says how many were skipped for it and ``index`` is the sample actually
returned. Under ``on_error: raise`` the DataError propagates. A malformed CSV header fails at
construction naming the missing column.
"""

from __future__ import annotations

import csv
import logging
import os
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

from ..config import DataConfig
from .crop import (
    CropBox,
    CropSpec,
    center_crop,
    clip_rng,
    random_resized_crop,
    three_crops,
)
from .decoders import _REGISTRY, _load_plugins, get_decoder
from .errors import DataError
from .manifest import VideoEntry, find_videos, load_manifest, probe_video
from .sampling import (
    map_to_chunks,
    parse_timestamp,
    seconds_to_frames,
    segment_indices,
    stride_indices,
)

log = logging.getLogger(__name__)
EPIC_REQUIRED = ("narration_id", "video_id", "start_timestamp", "stop_timestamp", "verb_class", "noun_class")
MAX_CONSECUTIVE_SKIPS = 50
_ERROR_SLOTS = 1024  # one counter per DataLoader worker id (+1 for the main process)


class VideoIndex:
    """``video key -> VideoEntry`` from ``root/manifest.jsonl`` (chunked) or by probing whole videos."""

    def __init__(self, root: str | Path, chunked: bool) -> None:
        self.root, self.chunked = Path(root), chunked
        self._probed: dict[str, VideoEntry | DataError] = {}
        self._by_stem: dict[str, Path] | None = None
        if chunked:
            self.videos = load_manifest(self.root)
            if not self.videos:
                raise ValueError(f"chunk manifest under {self.root} lists no decodable chunks")

    def _whole(self, path: Path, key: str) -> VideoEntry:
        if key not in self._probed:
            try:
                self._probed[key] = probe_video(path, key)
            except (OSError, ValueError) as e:
                self._probed[key] = DataError(str(e))
        found = self._probed[key]
        if isinstance(found, DataError):
            raise found
        return found

    def by_id(self, video_id: str) -> VideoEntry:
        """EPIC lookup by video id (a chunk-manifest id, or the stem of a file under root)."""
        if self.chunked:
            if video_id not in self.videos:
                raise DataError(f"unknown video_id {video_id!r} (not in {self.root / 'manifest.jsonl'})")
            return self.videos[video_id]
        if self._by_stem is None:
            self._by_stem = {p.stem: p for p in find_videos(self.root)} if self.root.is_dir() else {}
        if video_id not in self._by_stem:
            raise DataError(f"unknown video_id {video_id!r} (no video file with that name under {self.root})")
        return self._whole(self._by_stem[video_id], video_id)

    def by_path(self, rel: str) -> VideoEntry:
        """Kinetics lookup: chunked -> manifest id = file stem; whole -> the file under root."""
        if self.chunked:
            return self.by_id(Path(rel).stem)
        path = Path(rel) if os.path.isabs(rel) else self.root / rel
        return self._whole(path, str(path))


def _shared_zeros(n: int) -> torch.Tensor:
    return torch.zeros(n, dtype=torch.int64).share_memory_()


class ClipDataset(Dataset):
    """Shared machinery: sampling, crops, views, decoding across chunks, skip/raise on bad input."""

    def __init__(self, cfg: DataConfig, split: str, temporal_views: int = 1, spatial_views: int = 1,
                 seed: int = 0, index: VideoIndex | None = None) -> None:
        if split not in ("train", "val"):
            raise ValueError(f"split must be 'train' or 'val', got {split!r}")
        if spatial_views not in (1, 3) or temporal_views < 1:
            raise ValueError(f"temporal_views must be >= 1 and spatial_views 1 or 3, got {temporal_views}, {spatial_views}")
        _load_plugins()
        if cfg.decoder not in _REGISTRY:
            raise ValueError(f"data.decoder={cfg.decoder!r} is not one of {', '.join(sorted(_REGISTRY))}")
        _REGISTRY[cfg.decoder].check_available()  # DecoderUnavailable (clear message) now, not in a worker
        self.cfg, self.split, self.train = cfg, split, split == "train"
        self.temporal_views, self.spatial_views, self.seed = temporal_views, spatial_views, seed
        self.index = index if index is not None else VideoIndex(cfg.root, cfg.chunked)
        self._epoch = _shared_zeros(1)
        self._errors = _shared_zeros(_ERROR_SLOTS)
        self._decoder = None

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
    def decoder(self):
        if self._decoder is None:
            self._decoder = get_decoder(self.cfg.decoder, self.cfg.decoder_threads, self.cfg.decode_timeout_s)
        return self._decoder

    # -- subclasses ---------------------------------------------------------------------------
    def _sample(self, i: int) -> tuple[VideoEntry, int, int, Any]:
        """(video, first frame, end frame (exclusive), label) of sample ``i``; DataError if bad."""
        raise NotImplementedError

    # -- clips --------------------------------------------------------------------------------
    def _indices(self, start: int, end: int, rng, view: int) -> list[int]:
        c = self.cfg
        if c.sampling == "stride":
            return stride_indices(start, end, c.num_frames, c.stride, train=self.train, rng=rng, view=view,
                                  num_views=self.temporal_views)
        return segment_indices(start, end, c.num_frames, train=self.train, rng=rng, view=view,
                               num_views=self.temporal_views)

    def _boxes(self, h: int, w: int, rng) -> list[CropBox]:
        if self.train:
            scale, ratio = tuple(self.cfg.crop_scale), tuple(self.cfg.crop_ratio)
            return [random_resized_crop(h, w, scale, ratio, rng) for _ in range(self.spatial_views)]
        return [center_crop(h, w)] if self.spatial_views == 1 else three_crops(h, w)

    def _clip(self, entry: VideoEntry, indices: list[int], box: CropBox) -> torch.Tensor:
        spec = CropSpec(box, (self.cfg.size, self.cfg.size), entry.height, entry.width)
        parts = [self.decoder.decode(path, local, spec) for path, local in map_to_chunks(indices, entry)]
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    def _load(self, i: int) -> dict:
        entry, start, end, label = self._sample(i)
        views = []
        for t in range(self.temporal_views):
            rng = clip_rng(self.seed, self.epoch, i, t)
            indices = self._indices(start, end, rng, t)
            for box in self._boxes(entry.height, entry.width, rng):
                views.append(self._clip(entry, indices, box))
        frames = views[0] if len(views) == 1 else torch.stack(views)
        return {"frames": frames, "label": label, "index": i}

    def __getitem__(self, i: int) -> dict:
        skipped, j = 0, int(i)
        while True:
            try:
                item = self._load(j)
                item["skipped"] = skipped
                return item
            except DataError as e:
                if self.cfg.on_error == "raise":
                    raise
                self._count_error()
                log.warning("skipping sample %d: %s", j, e)
                skipped += 1
                if skipped >= MAX_CONSECUTIVE_SKIPS:
                    raise DataError(f"{skipped} bad samples in a row while producing index {i} "
                                    f"(is data.root right?); last: {e}") from e
                j = int(clip_rng(self.seed, self.epoch, i, 1000 + skipped).integers(len(self)))


def _open_csv(path: str | Path, required: tuple[str, ...]) -> tuple[Path, list[tuple[int, dict]]]:
    path = Path(path)
    if not str(path) or not path.is_file():
        raise FileNotFoundError(f"annotation file not found: {path}")
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        header = [h.strip() for h in (reader.fieldnames or [])]
        missing = [c for c in required if c not in header]
        if missing:
            raise ValueError(f"{path}: missing column(s) {', '.join(missing)} (header: {', '.join(header) or 'empty'})")
        reader.fieldnames = header
        rows = [(reader.line_num, {k: (v or "").strip() for k, v in row.items() if k}) for row in reader]
    return path, rows


def _int(text: str) -> int | None:
    try:
        return int(float(text))
    except (TypeError, ValueError):
        return None


class EpicDataset(ClipDataset):
    """EPIC-Kitchens-100 action segments (official CSV columns); label = {"verb", "noun"}."""

    def __init__(self, cfg: DataConfig, split: str, temporal_views: int = 1, spatial_views: int = 1,
                 seed: int = 0, index: VideoIndex | None = None) -> None:
        super().__init__(cfg, split, temporal_views, spatial_views, seed, index)
        self.csv, self.rows = _open_csv(self._split_file(), EPIC_REQUIRED)
        if not self.rows:
            raise ValueError(f"{self.csv}: no annotation rows")
        verbs, nouns = [], []
        for p in {cfg.train_csv, cfg.val_csv} - {""}:
            if Path(p).is_file():
                for _, r in _open_csv(p, EPIC_REQUIRED)[1]:
                    verbs.append(_int(r["verb_class"]))
                    nouns.append(_int(r["noun_class"]))
        self.num_classes = {"verb": max((v for v in verbs if v is not None), default=-1) + 1,
                            "noun": max((n for n in nouns if n is not None), default=-1) + 1}

    def __len__(self) -> int:
        return len(self.rows)

    def _sample(self, i: int) -> tuple[VideoEntry, int, int, Any]:
        line, r = self.rows[i]
        where = f"{self.csv}:{line} ({r['narration_id']})"
        try:
            start_s, stop_s = parse_timestamp(r["start_timestamp"]), parse_timestamp(r["stop_timestamp"])
        except ValueError as e:
            raise DataError(f"{where}: {e}") from None
        if stop_s < start_s:
            raise DataError(f"{where}: stop_timestamp {r['stop_timestamp']} is before start_timestamp {r['start_timestamp']}")
        verb, noun = _int(r["verb_class"]), _int(r["noun_class"])
        if verb is None or noun is None or verb < 0 or noun < 0:
            raise DataError(f"{where}: bad verb_class/noun_class {r['verb_class']!r}/{r['noun_class']!r}")
        try:
            entry = self.index.by_id(r["video_id"])
        except DataError as e:
            raise DataError(f"{where}: {e}") from None
        start, end = seconds_to_frames(start_s, stop_s, entry.fps)
        return entry, start, end, {"verb": verb, "noun": noun}


def read_video_list(path: str | Path) -> tuple[Path, list[tuple[int, str, str]]]:
    """``path,label`` CSV (header optional) or ``path label`` lines -> [(line, path, label text)]."""
    path = Path(path)
    if not str(path) or not path.is_file():
        raise FileNotFoundError(f"video list not found: {path}")
    lines = [(n, ln.strip()) for n, ln in enumerate(path.read_text().splitlines(), 1) if ln.strip()]
    if not lines:
        raise ValueError(f"{path}: empty video list")
    out: list[tuple[int, str, str]] = []
    if "," in lines[0][1]:
        first = next(csv.reader([lines[0][1]]))
        if _int(first[-1]) is None:  # a header row
            _, rows = _open_csv(path, ("path", "label"))
            return path, [(n, r["path"], r["label"]) for n, r in rows]
        for n, text in lines:
            fields = next(csv.reader([text]))
            out.append((n, ",".join(fields[:-1]).strip(), fields[-1].strip()))
        return path, out
    for n, text in lines:
        parts = text.rsplit(maxsplit=1)
        out.append((n, parts[0], parts[1] if len(parts) > 1 else ""))
    return path, out


class KineticsDataset(ClipDataset):
    """Kinetics-style classification: a ``path,label`` CSV or ``path label`` list; label = int."""

    def __init__(self, cfg: DataConfig, split: str, temporal_views: int = 1, spatial_views: int = 1,
                 seed: int = 0, index: VideoIndex | None = None) -> None:
        super().__init__(cfg, split, temporal_views, spatial_views, seed, index)
        self.list_path, self.rows = read_video_list(self._split_file())
        labels = []
        for p in {cfg.train_csv, cfg.val_csv} - {""}:
            if Path(p).is_file():
                labels += [_int(lab) for _, _, lab in read_video_list(p)[1]]
        self.num_classes = max((x for x in labels if x is not None), default=-1) + 1

    def __len__(self) -> int:
        return len(self.rows)

    def _sample(self, i: int) -> tuple[VideoEntry, int, int, Any]:
        line, rel, lab = self.rows[i]
        label = _int(lab)
        if label is None or label < 0:
            raise DataError(f"{self.list_path}:{line}: bad label {lab!r} for {rel}")
        entry = self.index.by_path(rel)
        return entry, 0, entry.num_frames, label


def build_dataset(cfg: DataConfig, split: str, temporal_views: int = 1, spatial_views: int = 1,
                  seed: int = 0) -> ClipDataset:
    """The dataset named by ``cfg.dataset`` (epic | kinetics | videos) for ``split`` (train | val)."""
    if cfg.dataset == "epic":
        return EpicDataset(cfg, split, temporal_views, spatial_views, seed)
    if cfg.dataset == "kinetics":
        return KineticsDataset(cfg, split, temporal_views, spatial_views, seed)
    if cfg.dataset == "videos":
        from .videos import VideosDataset

        return VideosDataset(cfg, split, temporal_views, spatial_views, seed)
    raise ValueError(f"data.dataset={cfg.dataset!r} is not one of epic, kinetics, videos")
