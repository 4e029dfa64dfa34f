"""Start-up check that ``model.pretrained`` fits the recipe's model, from the checkpoint's shapes alone.

The loader's own mapping (``prepare_state_dict``: format detection, renames, the resizes it allows)
runs on shape-only tensors (the meta device) against the recipe's model built on the meta device, so a
checkpoint whose tensors do not fit (tiny weights into ViT-B) refuses in one line at start-up, with the
message the real load would give, and ``--dry-run`` no longer says "all checks passed" for it. Values
are never read: safetensors headers, memory-mapped pickles, a run directory's shard layout.
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path
from typing import Any

import torch

from avion_ds.config import ConfigError, Recipe
from avion_ds.models.meta import meta_device
from avion_ds.models.weights.checkpoint import prepare_state_dict
from avion_ds.storage.run_dir import checkpoint_dir, clean_key, lazy_state_dict
from avion_ds.storage.safe_load import load_checkpoint_file
from avion_ds.storage.safetensors_stream import SafetensorsReader
from avion_ds.storage.torchscript import torchscript_root, torchscript_shapes
from avion_ds.tasks.base import maps_kinetics710_head

PICKED = ("model.safetensors", "pytorch_model.bin", "mp_rank_00_model_states.pt")  # read_checkpoint's order


def _meta(obj: Any) -> Any:
    """``obj`` with every tensor (in nested dicts) replaced by an empty one of its shape on the meta device."""
    if isinstance(obj, torch.Tensor):
        return torch.empty(obj.shape, dtype=obj.dtype, device="meta")
    if isinstance(obj, dict):
        return {k: _meta(v) for k, v in obj.items()}
    return obj


def shape_only(source: str | Path, trust: bool) -> dict[str, Any] | None:
    """What ``read_checkpoint(source)`` would return, with shape-only tensors (TorchScript releases: their
    module tree read without a storage); None where shapes alone cannot be had."""
    path = Path(source)
    if path.is_dir() and checkpoint_dir(path).is_dir() and not (path / "model.safetensors").is_file():
        lazy = lazy_state_dict(path, None, trust)
        return {clean_key(k): torch.empty(v.shape, dtype=v.dtype, device="meta") for k, v in lazy.items()}
    if path.is_dir():
        path = next((path / n for n in PICKED if (path / n).is_file()), path)
    if not path.is_file():
        return None
    if torchscript_root(path) is not None:
        return torchscript_shapes(path)
    if path.suffix == ".safetensors":
        return SafetensorsReader(path).meta()
    return _meta(load_checkpoint_file(path, trust, mmap=True))


def check_weights_fit(recipe: Recipe, task: Any) -> None:
    """Refuse (one line) a ``model.pretrained`` whose tensors do not fit the recipe's model."""
    source, m = recipe.model.pretrained, recipe.model
    if not source:
        return
    try:
        shapes = shape_only(source, m.trust_checkpoint)
    except (ValueError, RuntimeError, OSError):  # e.g. a legacy pickle that cannot be memory-mapped
        return  # readable (check_weights_source said so): the real load checks it
    if shapes is None:
        return
    with meta_device(), contextlib.redirect_stdout(io.StringIO()):  # quiet: no load, no report
        model = task.build_model(recipe, pretrained="")
    try:
        prepare_state_dict(model, shapes, m.trust_checkpoint, kinetics_head=maps_kinetics710_head(recipe))
    except ValueError as e:  # the loader's one-line refusal: a shape that does not fit, an unknown format
        msg = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ConfigError(f"model.pretrained={source}: {msg}") from None
    except (NotImplementedError, RuntimeError, TypeError):  # a conversion that needs values: checked at load
        return
