"""Chunked-video data pipeline: chunking, manifest, clip sampling, fused decode+crop, datasets,
device-side augmentation, DataLoader helper and multi-view aggregation.

Heavy modules (torch, decoders) load lazily so that ``avion-ds chunk`` / ``synth`` and their
worker processes start fast.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "build_dataset": "avion_ds.data.datasets.build",
    "EpicDataset": "avion_ds.data.datasets.epic",
    "KineticsDataset": "avion_ds.data.datasets.kinetics",
    "SSv2Dataset": "avion_ds.data.datasets.ssv2",
    "DataError": "avion_ds.data.errors",
    "DeviceAugment": "avion_ds.data.augment",
    "build_loader": "avion_ds.data.loader",
    "set_epoch": "avion_ds.data.loader",
    "aggregate_views": "avion_ds.data.datasets.views",
    "get_decoder": "avion_ds.data.decode.select",
    "chunk_videos": "avion_ds.data.prep.chunking",
    "load_manifest": "avion_ds.data.prep.manifest_index",
    "make_synthetic_epic": "avion_ds.data.prep.synthetic",
    "write_video": "avion_ds.data.prep.synthetic",
}

__all__ = list(_LAZY)  # names resolved lazily by __getattr__


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'avion_ds.data' has no attribute {name!r}")
