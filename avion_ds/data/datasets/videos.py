"""``data.dataset: videos``: unlabelled clips for masked-video pretraining.

Every video of a chunk manifest (or of ``data.root`` when not chunked), or of a plain list of files
(``data.train_csv`` / ``data.val_csv``: one path per line, an optional trailing label is ignored),
gives ``videos.clips_per_video`` clips per epoch. Clips use stride sampling (VideoMAE: 16 frames,
stride 4 on K400, 2 on SSv2) and, in training, VideoMAE's multi-scale crop (``videos.multi_scale``,
default 1 / .875 / .75 / .66, fixed offsets) with no flip; validation takes ``clips_per_video`` clips
at evenly spaced positions of each video, the centre crop and the same masks every epoch (a
comparable loss curve). Bad inputs are skipped and counted as in the
labelled datasets (:class:`~avion_ds.data.datasets.video_clips.VideoClipDataset`).

Items: ``{"frames": uint8 (T, H, W, C), "label": {"mask": bool (N,)[, "decode_mask": bool (N,)]},
"index", "skipped"}``; the masks are drawn per clip from the seeded clip generator (same mask in any
worker) once :attr:`VideosDataset.masks` holds a :class:`~avion_ds.data.masking.MaskSpec`. With
``data.num_sample`` > 1 in training (VideoMAE V2's repeated sampling, ``--num_sample 4`` in its
scripts) one decode gives num_sample clips, each with its own multi-scale crop and its own encoder
and decoder masks: frames (S, T, H, W, C), masks (S, N); the device side flattens them to S clips.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from avion_ds.config import DataConfig, rename_key
from avion_ds.data.crop import CropBox, clip_rng, multi_scale_crop
from avion_ds.data.datasets.csv_rows import split_csv
from avion_ds.data.datasets.kinetics import read_video_list
from avion_ds.data.datasets.registry import register_dataset
from avion_ds.data.datasets.video_clips import VideoClipDataset
from avion_ds.data.errors import DataError
from avion_ds.data.masking import MaskSpec
from avion_ds.data.prep.manifest import VideoEntry, find_videos
from avion_ds.data.prep.manifest_index import load_manifest
from avion_ds.distributed.dist import is_main

log = logging.getLogger(__name__)
MASK_STREAM = 7919  # the clip generator's "view" slot reserved for mask draws


@dataclass
class VideosKeys:
    """The unlabelled videos' own recipe keys (section ``videos``)."""

    clips_per_video: int = 1  # clips drawn from every video per epoch
    multi_scale: list[float] = field(default_factory=lambda: [1.0, 0.875, 0.75, 0.66])  # training crop scales


for _key in ("clips_per_video", "multi_scale"):
    rename_key(f"data.{_key}", f"videos.{_key}")


def videos_summary(cfg: DataConfig, split: str) -> tuple[int, dict[str, int]]:
    """(clips per epoch, no labels) of ``split``: the listed videos (non-empty lines of its list), else
    every video of the chunk manifest or under ``data.root``, times ``videos.clips_per_video``."""
    listed = split_csv(cfg, split)
    if listed and not Path(listed).is_file():
        raise FileNotFoundError(f"video list not found: {listed}")
    if listed:
        n = sum(1 for line in Path(listed).read_text().splitlines() if line.strip())
    elif cfg.chunked:
        n = len(load_manifest(cfg.root))
    else:
        n = len(find_videos(cfg.root))
    return n * cfg.clips_per_video, {}


@register_dataset
class VideosDataset(VideoClipDataset):
    """Unlabelled clips from every listed video (see module docstring)."""

    dataset_name = "videos"
    annotation_summary = staticmethod(videos_summary)
    split_file_optional = True  # without a list, every video under data.root
    label_kind = "none"  # unlabelled clips: masked pretraining's dataset
    dataset_section = VideosKeys

    def load_rows(self, cfg: DataConfig) -> None:
        """Every listed video (or every video of the root), each ``clips_per_video`` times; none pruned."""
        listed = cfg.train_csv if self.train else cfg.val_csv
        if listed:
            self.list_path, rows = read_video_list(listed)
            self.videos = [rel for _, rel, _ in rows]
            self.source = str(self.list_path)
        elif self.index.chunked:
            self.videos = sorted(self.index.videos)
            self.source = f"{self.index.root / 'manifest.jsonl'}"
        else:
            self.videos = [str(p) for p in find_videos(self.index.root)]
            self.source = str(self.index.root)
        if not self.videos:
            raise ValueError(f"data.dataset=videos: no videos in {self.source}")
        if not self.train and not cfg.val_csv and is_main():
            log.info("videos: data.val_csv is empty; validation uses the training videos (centre crop, fixed masks)")
        self.clips_per_video = cfg.clips_per_video
        self.masks: MaskSpec | None = None
        self.num_classes = 0

    def __len__(self) -> int:
        return len(self.videos) * self.clips_per_video

    def _entry(self, name: str) -> VideoEntry:
        if self.index.chunked:
            return self.index.by_id(name) if name in self.index.videos else self.index.by_path(name)
        return self.index.by_path(name)

    def sample_span(self, i: int) -> tuple[VideoEntry, int, int, Any]:
        name = self.videos[i // self.clips_per_video]
        try:
            entry = self._entry(name)
        except DataError as e:
            raise DataError(f"{self.source}: {name}: {e}") from None
        n, per = entry.num_frames, self.clips_per_video
        if self.train or per == 1:  # training: a random offset per clip (the clip generator's)
            return entry, 0, n, None
        # validation: the video's clips_per_video clips at evenly spaced fixed positions (not one
        # centre clip repeated), so the val loss covers the whole video
        k, c = i % per, self.cfg
        if c.sampling == "stride":
            span = (c.num_frames - 1) * c.stride + 1
            first = int(round(max(0, n - span) * k / (per - 1)))
            return entry, first, min(n, first + span), None
        start, stop = int(n * k // per), int(n * (k + 1) // per)
        return entry, start, max(stop, start + 1), None

    @property
    def epoch(self) -> int:
        """Validation keeps epoch 0's clips and masks, so its loss is comparable across epochs."""
        return int(self._epoch[0]) if self.train else 0

    def crop_boxes(self, h: int, w: int, rng) -> list[CropBox]:
        if self.train:
            return [multi_scale_crop(h, w, self.cfg.size, self.cfg.multi_scale, rng)]
        return super().crop_boxes(h, w, rng)

    def _load(self, i: int) -> dict:
        item = super()._load(i)
        if self.masks is None:
            raise RuntimeError("VideosDataset.masks is not set: attach a MaskSpec before loading clips")
        rng = clip_rng(self.seed, self.epoch, i, MASK_STREAM)
        if item["frames"].dim() == 5:  # repeated samples (VideoMAE V2 --num_sample): fresh masks per sample
            drawn = [self.masks.draw(rng) for _ in range(item["frames"].shape[0])]
            item["label"] = {k: torch.from_numpy(np.stack([d[k] for d in drawn])) for k in drawn[0]}
        else:
            item["label"] = {k: torch.from_numpy(v) for k, v in self.masks.draw(rng).items()}
        return item
