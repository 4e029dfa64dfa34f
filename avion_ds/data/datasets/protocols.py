"""Published evaluation protocols (``eval.protocol``) and the recipe checks of the dataset recipes.

Each dataset declares the protocols measured on it (``eval_protocols`` of its module: kinetics ``k400``,
ssv2 ``ssv2``, epic ``epic``); :func:`protocols` gathers them from the registry.

A protocol locks what a reported number means: frames, temporal sampling, views and crop size.
``check_recipe`` refuses a recipe whose data/eval settings differ from its protocol (use
``custom`` for anything else), so a number from another protocol cannot be reported under its
name. :func:`eval_report` is what every eval JSON carries: the protocol, views, how many samples
were evaluated, and which annotation rows were missing, quarantined or failed to decode. The
views' frame indices are the sources' test loaders' (:func:`avion_ds.data.sampling.eval_indices`:
VideoMAE's Kinetics and SSv2 test modes, AVION's ``get_frame_ids``; tests/data/test_protocols.py).

Sources:
- k400: VideoMAE ``scripts/kinetics/*/finetune.sh`` (``--num_frames 16 --sampling_rate 4
  --test_num_segment 5 --test_num_crop 3 --short_side_size 224``).
- ssv2: VideoMAE ``scripts/ssv2/*/finetune.sh`` (16 frames, segment-based, ``--test_num_segment 2
  --test_num_crop 3 --short_side_size 224``).
- epic: AVION ``scripts/main_lavila_finetune_cls.py`` (``--clip-length 16``, segment-based,
  ``--num-clips 1 --num-crops 1``: one centre crop of 224; ``docs/MODEL_ZOO.md`` evaluates with them).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

from avion_ds.data.datasets.registry import lookup, registered_names
from avion_ds.data.randaug import parse_rand_aug


@dataclass(frozen=True)
class Protocol:
    """Evaluation settings a published number was measured with."""

    dataset: str  # the dataset declaring it (filled in from the registry)
    num_frames: int
    sampling: str
    stride: int | None  # stride sampling only
    temporal_views: int
    spatial_views: int
    size: int
    source: str


def protocols() -> dict[str, Protocol]:
    """Every registered dataset's protocols (its ``eval_protocols``), by ``eval.protocol`` name."""
    out: dict[str, Protocol] = {}
    for name in registered_names():
        out.update({key: replace(p, dataset=name) for key, p in (lookup(name).eval_protocols or {}).items()})
    return out


def protocol_names() -> tuple[str, ...]:
    """The values ``eval.protocol`` accepts: the registered protocols and ``custom``."""
    return (*protocols(), "custom")


def _protocol_problem(recipe: Any) -> str | None:
    name, known = recipe.eval.protocol, protocols()
    if name not in known and name != "custom":
        return f"eval.protocol={name!r} is not one of {', '.join(protocol_names())}"
    if name == "custom":
        return None
    p, d, e = known[name], recipe.data, recipe.eval
    want = {
        "data.dataset": (d.dataset, p.dataset),
        "data.num_frames": (d.num_frames, p.num_frames),
        "data.sampling": (d.sampling, p.sampling),
        "data.size": (d.size, p.size),
        "eval.temporal_views": (e.temporal_views, p.temporal_views),
        "eval.spatial_views": (e.spatial_views, p.spatial_views),
    }
    if p.stride is not None:
        want["data.stride"] = (d.stride, p.stride)
    for key, (have, need) in want.items():
        if have != need:
            return (
                f"eval.protocol={name} needs {key}={need!r} (recipe has {have!r}; {p.source}); "
                f"set eval.protocol=custom to evaluate differently"
            )
    return None


def check_recipe(recipe: Any) -> str | None:
    """One line naming the key when the augmentation or protocol settings are invalid, else None."""
    d = recipe.data
    if not 0.0 <= d.reprob <= 1.0:
        return f"data.reprob={d.reprob} must be in [0, 1]"
    if d.num_sample < 1:
        return f"data.num_sample={d.num_sample} must be >= 1"
    if d.rand_aug:
        try:
            parse_rand_aug(d.rand_aug, d.size, d.interpolation)
        except ValueError as e:
            return f"data.rand_aug={d.rand_aug!r}: {e}"
    return _protocol_problem(recipe)


def eval_report(protocol: str, views: int, dataset: Any, evaluated_index: Any) -> dict[str, Any]:
    """What the eval JSON records besides metrics: protocol, views, samples, missing/failed rows.

    ``evaluated_index`` holds the dataset indices whose scores were gathered; a sample that failed
    to decode (and was replaced under ``on_error: skip``) is absent from it and listed as failed.
    """
    seen = {int(i) for i in evaluated_index}
    failed = [dataset.row_name(i) for i in range(len(dataset)) if i not in seen]
    missing = list(getattr(dataset, "missing", []))
    quarantined = list(getattr(dataset, "quarantined", []))
    out: dict[str, Any] = {
        "protocol": protocol,
        "views": views,
        "annotation_rows": len(dataset) + len(missing) + len(quarantined),
        "samples_evaluated": len(seen),
        "num_missing": len(missing),
        "num_quarantined": len(quarantined),
        "num_failed": len(failed),
        "missing": missing,
        "quarantined": quarantined,
        "failed": failed,
    }
    known = protocols()
    if protocol in known:
        out["protocol_settings"] = asdict(known[protocol])
    return out
