"""Dataset factory: the dataset a ``DataConfig`` names, asked of the registry (:mod:`.registry`).

Importing this module registers the built-in datasets (the modules
:data:`~avion_ds.data.datasets.registry.BUILT_IN_MODULES` names, in the order error messages list them). A dataset
defined elsewhere registers with
:func:`~avion_ds.data.datasets.registry.register_dataset` and is built here like the built-ins.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from avion_ds.config import DataConfig
from avion_ds.data.datasets.registry import (
    BUILT_IN_MODULES,
    DatasetSpec,
    lookup,
    registered_names,
    unknown_dataset,
    view_config,
)
from avion_ds.data.datasets.video_clips import VideoClipDataset
from avion_ds.data.prep.shard_index import shard_problem

for _module in BUILT_IN_MODULES:  # registration: the built-in datasets
    importlib.import_module(f"avion_ds.data.datasets.{_module}")

# a recipe's registered sections (``recipe.sections``): where a dataset's own keys are read
Sections = Mapping[str, Any] | None


def split_config(cfg: DataConfig, split: str, sections: Sections = None) -> DataConfig:
    """``cfg`` as ``split``'s dataset reads it: for val, ``dataset`` replaced by ``val_dataset`` when that is
    set; with the dataset's own keys (from ``sections``, a recipe's; see ``registry.view_config``)."""
    return split_view(cfg, split, sections)[1]


def split_view(cfg: DataConfig, split: str, sections: Sections = None) -> tuple[DatasetSpec, DataConfig]:
    """(the spec of ``split``'s dataset, ``cfg`` as that dataset reads it): one look-up per split."""
    spec = dataset_spec(cfg, split)
    return spec, view_config(cfg if spec.name == cfg.dataset else replace(cfg, dataset=spec.name), spec, sections)


def dataset_names() -> tuple[str, ...]:
    """Every registered dataset name (the built-ins first)."""
    return registered_names()


def dataset_spec(cfg: DataConfig, split: str = "train") -> DatasetSpec:
    """The registered spec of the dataset ``split`` reads (val: ``data.val_dataset`` when set);
    ValueError naming the key, the value and the registered names when there is none."""
    key = "data.val_dataset" if split == "val" and cfg.val_dataset else "data.dataset"
    return lookup(cfg.val_dataset if key == "data.val_dataset" else cfg.dataset, key)


def dataset_problem(cfg: DataConfig) -> str | None:
    """One line naming ``data.dataset`` / ``data.val_dataset`` when it names no registered dataset, else None."""
    names = registered_names()
    if cfg.dataset not in names:
        return unknown_dataset("data.dataset", cfg.dataset)
    if cfg.val_dataset and cfg.val_dataset not in names:
        return unknown_dataset("data.val_dataset", cfg.val_dataset, also=", or empty (= data.dataset)")
    return None


def heads_problem(cfg: DataConfig, heads: dict[str, int] | None, sections: Sections = None) -> str | None:
    """One line when ``data.dataset`` yields several label heads (EPIC) and ``model.heads`` is unset, else None."""
    spec, cfg = split_view(cfg, "train", sections)
    want = spec.label_heads(cfg)
    if want is None or heads is not None:
        return None
    return f"data.dataset={cfg.dataset!r} needs model.heads (e.g. {spec.heads_text(cfg, want)})"


def read_annotations(cfg: DataConfig, split: str, sections: Sections = None) -> tuple[int, int | dict[str, int]]:
    """(rows, classes seen) of ``split``'s annotation file without opening a video (start-up checks).

    Raises ValueError / FileNotFoundError naming the file (missing column, empty list). The val split
    is read as ``data.val_dataset`` when set. Narration and retrieval files have no classes ({}).
    """
    spec, view = split_view(cfg, split, sections)
    return spec.summary(view, split)


def build_dataset(
    cfg: DataConfig,
    split: str,
    temporal_views: int = 1,
    spatial_views: int = 1,
    seed: int = 0,
    sections: Sections = None,
) -> VideoClipDataset:
    """The dataset registered as ``cfg.dataset`` for ``split`` (train | val); the val split is a
    ``cfg.val_dataset`` one when that is set. ``sections``: the recipe's, holding the dataset's own keys.
    With ``data.shards`` the same dataset reads its rows and clips from the shards there."""
    if cfg.shards:  # litdata shards written by `avion-ds pack --config`
        return open_shards(cfg.shards, cfg, split, seed, sections=sections, views=(temporal_views, spatial_views))
    spec, view = split_view(cfg, split, sections)
    return spec.build(view, split, temporal_views, spatial_views, seed)


def open_shards(
    location: str,
    cfg: DataConfig,
    split: str = "train",
    seed: int = 0,
    shuffle: bool | None = None,
    sections: Sections = None,
    cache_dir: str | None = None,
    views: tuple[int, int] = (1, 1),
) -> Any:
    """The clips of ``split`` read from the shards at ``location`` (a local dir, http(s)://, s3://) as the
    recipe's dataset (``cfg.dataset``, its own keys from ``sections``) makes them: a litdata
    ``StreamingDataset`` (:class:`avion_ds.data.shards.ShardClipDataset`) to iterate or to pass to
    ``build_loader``. ``shuffle``: default for training only; ``cache_dir``: where downloaded shards go;
    ``views``: (temporal, spatial) eval views. ValueError (one line) for a local location without shards
    with rows of ``split``; TypeError for a dataset that is not a registered class."""
    from avion_ds.data.shards import ShardClipDataset  # lazy: litdata is the [stream] extra

    problem = shard_problem(location, (split,))
    if problem:
        raise ValueError(problem)
    spec, view = split_view(cfg, split, sections)
    if not isinstance(spec.build, type):
        raise TypeError(f"data.dataset={spec.name!r}: not a dataset class; data.shards reads class datasets only")
    view = replace(view, quarantine="none")  # quarantine lists name chunk-tree files, not shard items
    return ShardClipDataset(location, spec.build, view, split, seed, shuffle, *views, cache_dir=cache_dir)
