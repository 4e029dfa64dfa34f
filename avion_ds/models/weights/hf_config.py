"""The ``config.json`` beside a Hugging Face checkpoint: what it says that the weights do not.

transformers' VideoMAE configs name ``layer_norm_eps`` (its default 1e-12; the official VideoMAE code
and our models use 1e-6): the weights load the same either way, but the outputs differ slightly, so a
load names the difference in its report instead of passing over it (:func:`layer_norm_eps_note`).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

CONFIG_NAME = "config.json"


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
