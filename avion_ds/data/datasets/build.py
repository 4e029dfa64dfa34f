"""Dataset factory: the dataset a ``DataConfig`` names, and its annotation summary for start-up checks.

Sits above ``datasets`` (the shared :class:`VideoClipDataset` base and EPIC-Kitchens) and the per-dataset
modules (``kinetics``, ``ssv2``, ``videos``, ``ego4d``, ``epic_mir``) that subclass it, so none of them imports another's factory.
"""

from __future__ import annotations

from dataclasses import replace

from avion_ds.config import DataConfig
from avion_ds.data.datasets.ego4d import Ego4dDataset, narration_summary
from avion_ds.data.datasets.egocentric import CharadesEgoDataset, EgteaDataset, egocentric_summary
from avion_ds.data.datasets.epic_actions import map_files
from avion_ds.data.datasets.epic_mir import EpicMirDataset, mir_summary
from avion_ds.data.datasets.kinetics import KineticsDataset, split_summary
from avion_ds.data.datasets.ssv2 import SSv2Dataset
from avion_ds.data.datasets.ssv2 import split_summary as ssv2_summary
from avion_ds.data.datasets.video_clips import (
    EPIC_REQUIRED,
    EpicDataset,
    VideoClipDataset,
    epic_action_map,
    open_csv,
    parse_int,
)
from avion_ds.data.datasets.videos import VideosDataset


def read_annotations(cfg: DataConfig, split: str) -> tuple[int, int | dict[str, int]]:
    """(rows, classes seen) of ``split``'s annotation file without opening a video (start-up checks).

    Raises ValueError / FileNotFoundError naming the file (missing column, empty list). The val split
    is read as ``data.val_dataset`` when set. Narration and retrieval files have no classes ({}).
    """
    cfg = split_config(cfg, split)
    path = cfg.train_csv if split == "train" else cfg.val_csv
    if cfg.dataset == "ego4d":
        return narration_summary(cfg, split)
    if cfg.dataset == "epic_mir":
        return mir_summary(path)
    if cfg.dataset in ("egtea", "charades_ego"):
        return egocentric_summary(cfg)
    if cfg.dataset == "epic":
        _, rows = open_csv(path, EPIC_REQUIRED)
        if not rows:
            raise ValueError(f"{path}: no annotation rows")
        if cfg.epic_label == "action":
            return len(rows), {"action": len(epic_action_map(map_files(cfg.train_csv, cfg.val_csv)))}
        top = {
            h: max((v for _, r in rows if (v := parse_int(r[f"{h}_class"])) is not None), default=-1) + 1
            for h in ("verb", "noun")
        }
        return len(rows), top
    if cfg.dataset == "ssv2":
        return ssv2_summary(cfg, path)
    return split_summary(cfg, path)


def build_dataset(
    cfg: DataConfig, split: str, temporal_views: int = 1, spatial_views: int = 1, seed: int = 0
) -> VideoClipDataset:
    """The dataset named by ``cfg.dataset`` (epic | kinetics | ssv2 | videos | ego4d | epic_mir) for ``split``
    (train | val); the val split is a ``cfg.val_dataset`` one when that is set."""
    cfg = split_config(cfg, split)
    if cfg.dataset == "ego4d":
        return Ego4dDataset(cfg, split, temporal_views, spatial_views, seed)
    if cfg.dataset == "epic_mir":
        return EpicMirDataset(cfg, split, temporal_views, spatial_views, seed)
    if cfg.dataset == "epic":
        return EpicDataset(cfg, split, temporal_views, spatial_views, seed)
    if cfg.dataset == "kinetics":
        return KineticsDataset(cfg, split, temporal_views, spatial_views, seed)
    if cfg.dataset == "ssv2":
        return SSv2Dataset(cfg, split, temporal_views, spatial_views, seed)
    if cfg.dataset == "videos":
        return VideosDataset(cfg, split, temporal_views, spatial_views, seed)
    if cfg.dataset == "egtea":
        return EgteaDataset(cfg, split, temporal_views, spatial_views, seed)
    if cfg.dataset == "charades_ego":
        return CharadesEgoDataset(cfg, split, temporal_views, spatial_views, seed)
    raise ValueError(
        f"data.dataset={cfg.dataset!r} is not one of epic, kinetics, ssv2, videos, ego4d, epic_mir, egtea, charades_ego"
    )


def split_config(cfg: DataConfig, split: str) -> DataConfig:
    """``cfg`` as ``split`` reads it: for val, ``dataset`` replaced by ``val_dataset`` when that is set."""
    if split == "val" and cfg.val_dataset and cfg.val_dataset != cfg.dataset:
        return replace(cfg, dataset=cfg.val_dataset)
    return cfg
