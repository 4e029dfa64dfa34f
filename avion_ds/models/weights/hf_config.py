"""The files beside a checkpoint: what they say that the weights do not.

transformers' VideoMAE configs name ``layer_norm_eps`` (its default 1e-12; the official VideoMAE code
and our models use 1e-6): the weights load the same either way, but the outputs differ slightly, so a
load names the difference in its report instead of passing over it (:func:`layer_norm_eps_note`).
A Hugging Face directory's ``preprocessor_config.json`` (``image_mean`` / ``image_std``) and a run
directory's ``recipe.yaml`` (``data.mean_std``) state the normalisation the weights were trained with
(:func:`declared_mean_std`), more precisely than the format alone.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import yaml

from avion_ds.config.normalization import MEAN_STD

CONFIG_NAME = "config.json"
PROCESSOR_NAME = "preprocessor_config.json"  # a Hugging Face image processor: image_mean / image_std


def hf_config(source: Any) -> dict[str, Any] | None:
    """The parsed ``config.json`` of a Hugging Face directory ``source`` (or of the directory holding the
    weights file ``source``); None for a state dict, a file without one, or one that is not a JSON object."""
    if not isinstance(source, (str, Path)):
        return None
    path = Path(source)
    folder = path if path.is_dir() else path.parent
    config = folder / CONFIG_NAME
    if not config.is_file():
        return None
    try:
        data = json.loads(config.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def layer_norm_eps_note(source: Any, eps: float) -> str | None:
    """One sentence when ``source``'s config.json names a ``layer_norm_eps`` other than the model's ``eps``
    (the model keeps its own), else None."""
    config = hf_config(source)
    theirs = config.get("layer_norm_eps") if config else None
    if not isinstance(theirs, (int, float)) or math.isclose(float(theirs), eps, rel_tol=1e-9, abs_tol=0.0):
        return None
    return (
        f"config.json layer_norm_eps={float(theirs):g} differs from the model's norm_eps={eps:g}: the model keeps "
        f"{eps:g} (outputs differ slightly from transformers'; pass norm_eps={float(theirs):g} to create_model to match)"
    )


def _read(path: Path, parse: Any) -> dict[str, Any]:
    """``parse(path's text)`` when it is a mapping, else {} (absent, unreadable, not a mapping)."""
    try:
        data = parse(path.read_text()) if path.is_file() else None
    except (OSError, ValueError, yaml.YAMLError):
        return {}
    return data if isinstance(data, dict) else {}


def declared_mean_std(source: Any) -> str | None:
    """The ``MEAN_STD`` name the files beside ``source`` state: a run directory's ``recipe.yaml``
    ``data.mean_std``, or a Hugging Face ``preprocessor_config.json`` whose ``image_mean`` / ``image_std``
    equal a row (to 1e-4); None for a state dict, a file alone, or statistics of no row."""
    if not isinstance(source, (str, Path)):
        return None
    path = Path(source)
    folder = path if path.is_dir() else path.parent
    named = (_read(folder / "recipe.yaml", yaml.safe_load).get("data") or {}) if path.is_dir() else {}
    if isinstance(named, dict) and named.get("mean_std") in MEAN_STD:
        return str(named["mean_std"])
    processor = _read(folder / PROCESSOR_NAME, json.loads)
    mean, std = processor.get("image_mean"), processor.get("image_std")
    for name, (m, s) in MEAN_STD.items():
        pairs = list(zip((*m, *s), (*(mean or ()), *(std or ())), strict=False))
        if len(pairs) == 6 and all(isinstance(b, (int, float)) and abs(a - b) <= 1e-4 for a, b in pairs):
            return name
    return None
