"""What a Hugging Face export needs beyond the weights: the dataset's class names and the preprocessing.

``class_names(recipe, head)`` gives the names of the exported classifier's classes where the recipe's
dataset has them: each dataset declares how it reads them (its spec's ``label_names``: class CSVs,
``data.class_list``, the sorted label names of the train CSV...). Without them (integer labels, a
pretraining run) the config keeps ``<head>_<i>`` names.

``processor_config(recipe)``: the ``VideoMAEImageProcessor`` arguments of the run's evaluation
transform: the short side resized to ``data.size`` (``data.interpolation``), a centred ``data.size``
square, scaled to [0, 1] and normalised with ``data.mean_std``; ``num_frames`` is kept beside them.
"""

from __future__ import annotations

from typing import Any

from avion_ds.config import Recipe
from avion_ds.config.normalization import MEAN_STD
from avion_ds.data.datasets.build import split_view

RESAMPLE = {"bilinear": 2, "bicubic": 3}  # PIL's codes, as transformers' image processors store them


def class_names(recipe: Recipe, head: str | None, classes: int) -> tuple[list[str] | None, str]:
    """(names of the ``classes`` classes of the exported classifier, where they come from) or
    (None, why not) when the dataset has none or they do not fit (another count, repeated names)."""
    spec, view = split_view(recipe.data, "train", recipe.sections)
    try:  # the dataset's own reader of its class names (None: it has none)
        found = spec.label_names(view, head) if spec.label_names is not None else None
    except (OSError, ValueError) as e:
        return None, f"class names unread ({(str(e).splitlines() or [type(e).__name__])[0]})"
    if found is None:
        return None, f"no class names for data.dataset={recipe.data.dataset!r}"
    names, source = found
    if len(names) != classes or len(set(names)) != len(names):
        why = f"{len(names)} names" if len(names) != classes else "repeated names"
        return None, f"class names of {source} left out ({why} for {classes} classes)"
    return names, source


def processor_config(recipe: Recipe) -> dict[str, Any]:
    """``transformers.VideoMAEImageProcessor`` arguments of the run's evaluation preprocessing (module doc)."""
    d = recipe.data
    mean, std = MEAN_STD[d.mean_std]
    return {
        "do_resize": True,
        "size": {"shortest_edge": d.size},
        "resample": RESAMPLE.get(d.interpolation, 2),
        "do_center_crop": True,
        "crop_size": {"height": d.size, "width": d.size},
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "image_mean": list(mean),
        "image_std": list(std),
        "num_frames": d.num_frames,
    }


def open_clip_preprocess(recipe: Recipe) -> dict[str, Any]:
    """OpenCLIP's ``preprocess_cfg`` of the run's evaluation preprocessing (size, mean / std, resize)."""
    d = recipe.data
    mean, std = MEAN_STD[d.mean_std]
    return {
        "size": d.size,
        "mean": list(mean),
        "std": list(std),
        "interpolation": d.interpolation,
        "resize_mode": "shortest",
    }
