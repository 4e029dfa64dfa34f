"""Dataset factory: the dataset a ``DataConfig`` names, asked of the registry (:mod:`.registry`).

Importing this module registers the built-in datasets (one import line each, below); their order is the
order error messages list them. A dataset defined elsewhere registers with
:func:`~avion_ds.data.datasets.registry.register_dataset` and is built here like the built-ins.
"""

from __future__ import annotations

from dataclasses import replace

from avion_ds.config import DataConfig

# isort: off
from avion_ds.data.datasets import epic, kinetics, ssv2, videos, ego4d, epic_mir, egocentric  # noqa: F401 - registration

# isort: on
from avion_ds.data.datasets.registry import DatasetSpec, lookup, registered_names, unknown_dataset
from avion_ds.data.datasets.video_clips import VideoClipDataset


def split_config(cfg: DataConfig, split: str) -> DataConfig:
    """``cfg`` as ``split`` reads it: for val, ``dataset`` replaced by ``val_dataset`` when that is set."""
    if split == "val" and cfg.val_dataset and cfg.val_dataset != cfg.dataset:
        return replace(cfg, dataset=cfg.val_dataset)
    return cfg


def dataset_names() -> tuple[str, ...]:
    """Every registered dataset name (the built-ins first)."""
    return registered_names()


def dataset_spec(cfg: DataConfig, split: str = "train") -> DatasetSpec:
    """The registered spec of the dataset ``split`` reads (val: ``data.val_dataset`` when set);
    ValueError naming the key, the value and the registered names when there is none."""
    key = "data.val_dataset" if split == "val" and cfg.val_dataset else "data.dataset"
    return lookup(split_config(cfg, split).dataset, key)


def dataset_problem(cfg: DataConfig) -> str | None:
    """One line naming ``data.dataset`` / ``data.val_dataset`` when it names no registered dataset, else None."""
    names = registered_names()
    if cfg.dataset not in names:
        return unknown_dataset("data.dataset", cfg.dataset)
    if cfg.val_dataset and cfg.val_dataset not in names:
        return unknown_dataset("data.val_dataset", cfg.val_dataset, also=", or empty (= data.dataset)")
    return None


def heads_problem(cfg: DataConfig, heads: dict[str, int] | None) -> str | None:
    """One line when ``data.dataset`` yields several label heads (EPIC) and ``model.heads`` is unset, else None."""
    spec = lookup(cfg.dataset)
    want = spec.label_heads(cfg)
    if want is None or heads is not None:
        return None
    return f"data.dataset={cfg.dataset!r} needs model.heads (e.g. {spec.heads_text(cfg, want)})"


def read_annotations(cfg: DataConfig, split: str) -> tuple[int, int | dict[str, int]]:
    """(rows, classes seen) of ``split``'s annotation file without opening a video (start-up checks).

    Raises ValueError / FileNotFoundError naming the file (missing column, empty list). The val split
    is read as ``data.val_dataset`` when set. Narration and retrieval files have no classes ({}).
    """
    return dataset_spec(cfg, split).summary(split_config(cfg, split), split)


def build_dataset(
    cfg: DataConfig, split: str, temporal_views: int = 1, spatial_views: int = 1, seed: int = 0
) -> VideoClipDataset:
    """The dataset registered as ``cfg.dataset`` for ``split`` (train | val); the val split is a
    ``cfg.val_dataset`` one when that is set."""
    return dataset_spec(cfg, split).build(split_config(cfg, split), split, temporal_views, spatial_views, seed)
