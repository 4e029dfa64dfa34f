"""What a Hugging Face export needs beyond the weights: the dataset's class names and the preprocessing.

``class_names(recipe, head)`` gives the names of the exported classifier's classes where the recipe's
dataset has them: EPIC-100 verbs / nouns from its class CSVs (``data.class_list`` = the verb file, the
noun file beside it, or ``EPIC_100_{verb,noun}_classes.csv`` next to ``data.val_csv``; the ``key``
column as released), EPIC actions as ``<verb> <noun>`` of AVION's map, Kinetics (``data.class_list``
or the sorted label names of the train CSV), SSv2 (labels.json), EGTEA and Charades-Ego class files.
Without them (integer labels, a pretraining run) the config keeps ``<head>_<i>`` names.

``processor_config(recipe)``: the ``VideoMAEImageProcessor`` arguments of the run's evaluation
transform: the short side resized to ``data.size`` (``data.interpolation``), a centred ``data.size``
square, scaled to [0, 1] and normalised with ``data.mean_std``; ``num_frames`` is kept beside them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from avion_ds.config import Recipe
from avion_ds.data.augment import MEAN_STD
from avion_ds.data.datasets.csv_rows import open_csv, parse_int

RESAMPLE = {"bilinear": 2, "bicubic": 3}  # PIL's codes, as transformers' image processors store them


def epic_keys(path: Path) -> list[str]:
    """The ``key`` column of an EPIC-100 class CSV in ``id`` order (ValueError for another layout)."""
    p, rows = open_csv(path, ("id", "key"))
    ids = [parse_int(r["id"]) for _, r in rows]
    if sorted(i for i in ids if i is not None) != list(range(len(rows))):
        raise ValueError(f"{p}: expected ids 0..{len(rows) - 1} in column 'id' (EPIC-100 class file)")
    keys = [""] * len(rows)
    for i, (_, r) in zip(ids, rows):
        keys[int(i)] = r["key"]
    return keys


def _epic(recipe: Recipe, head: str | None) -> tuple[list[str], str] | None:
    from avion_ds.tasks.zero_shot.classes import epic_class_files  # lazy: the zero-shot task's class files

    d = recipe.data
    files = epic_class_files(d.class_list, d.val_csv)
    if not all(f.is_file() for f in files.values()):
        return None
    if head in files:
        return epic_keys(files[head]), str(files[head])
    if head == "action":
        from avion_ds.data.datasets.epic import epic_action_map  # lazy: reads the EPIC CSVs
        from avion_ds.data.datasets.epic_actions import map_files  # lazy: with the line above

        verbs, nouns = epic_keys(files["verb"]), epic_keys(files["noun"])
        amap = epic_action_map(map_files(d.train_csv, d.val_csv))
        names = [f"{verbs[v]} {nouns[n]}" for v, n in zip(amap.verbs, amap.nouns)]
        return names, f"{files['verb'].name} + {files['noun'].name} over AVION's action map"
    return None


def _kinetics(recipe: Recipe, head: str | None) -> tuple[list[str], str] | None:
    from avion_ds.data.datasets.kinetics import _raw_rows, load_class_list  # lazy: only Kinetics runs

    d = recipe.data
    if d.class_list:
        return load_class_list(d.class_list), d.class_list
    if not d.train_csv or not Path(d.train_csv).is_file():
        return None
    texts = [lab for *_, lab in _raw_rows(d.train_csv)[1]]
    if all(parse_int(t) is not None for t in texts):
        return None  # integer labels: no names
    return sorted(set(texts)), f"the sorted labels of {d.train_csv}"


def _ssv2(recipe: Recipe, head: str | None) -> tuple[list[str], str] | None:
    from avion_ds.data.datasets.ssv2 import LABELS_NAME, load_labels  # lazy: only SSv2 runs

    d = recipe.data
    path = Path(d.class_list or Path(d.train_csv or d.val_csv).parent / LABELS_NAME)
    if not path.is_file():
        return None
    labels = load_labels(path)
    return sorted(labels, key=labels.__getitem__), str(path)


def _egocentric(recipe: Recipe, egtea: bool) -> tuple[list[str], str] | None:
    from avion_ds.data.datasets import egocentric as ego  # lazy: only EGTEA / Charades-Ego runs

    d = recipe.data
    path = ego.class_file(d, ego.EGTEA_CLASSES if egtea else ego.CHARADES_CLASSES)
    if not path.is_file():
        return None
    names = (ego.read_egtea_classes if egtea else ego.read_charades_classes)(path)[0]
    return names, str(path)


def _egtea(recipe: Recipe, head: str | None) -> tuple[list[str], str] | None:
    return _egocentric(recipe, egtea=True)


def _charades(recipe: Recipe, head: str | None) -> tuple[list[str], str] | None:
    return _egocentric(recipe, egtea=False)


_READERS = {"epic": _epic, "kinetics": _kinetics, "ssv2": _ssv2, "egtea": _egtea, "charades_ego": _charades}


def class_names(recipe: Recipe, head: str | None, classes: int) -> tuple[list[str] | None, str]:
    """(names of the ``classes`` classes of the exported classifier, where they come from) or
    (None, why not) when the dataset has none or they do not fit (another count, repeated names)."""
    reader = _READERS.get(recipe.data.dataset)
    try:
        found = reader(recipe, head) if reader is not None else None
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
